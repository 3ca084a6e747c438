"""The fair-share report as an HTML page: its figures in real tables, the charts beside them.

Rendered by jinja2 with autoescaping on (user names, job ids, process names and the evidence come
from the store, which users' processes filled); the figures go through the same formatting
functions as the text table, so the page and the table never disagree.
"""

from __future__ import annotations

import base64
import os
import time
from collections.abc import Sequence

from gpuslurm.policy.wording import pct, span, tenths
from gpuslurm.report.compute import Report

TEMPLATE = "report.html.j2"


def render_page(report: Report, heading: str, zone: str, charts: Sequence[tuple[str, bytes]]) -> str:
    """The page: totals, a node's gaps, one row per user/account/job/process, evidence,
    recommendations, charts (title, PNG bytes)."""
    import jinja2

    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(os.path.join(os.path.dirname(os.path.abspath(__file__)), "templates")),
        autoescape=True, undefined=jinja2.StrictUndefined, keep_trailing_newline=True)
    env.filters["h"] = tenths
    env.filters["pct"] = pct
    env.filters["span"] = span
    env.filters["clock"] = lambda ts: time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ts))
    images = [(title, base64.b64encode(png).decode("ascii")) for title, png in charts]
    return env.get_template(TEMPLATE).render(report=report, t=report.totals, heading=heading, zone=zone,
                                             charts=images)
