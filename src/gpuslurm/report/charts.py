"""Charts for the fair-share report: utilisation per GPU and per user over time, share against quota.

matplotlib is imported here only, and this module only when ``--plot`` is given. Figures are
built with ``matplotlib.figure.Figure`` (no pyplot: no global state, no GUI backend) and drawn by
Agg. A ``.png`` gets the three charts stacked in one image; a ``.html`` page gets them as three
base64-embedded PNGs with the text report underneath.
"""

from __future__ import annotations

import base64
import html
import io
import math
import os
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from gpuslurm.errors import InputError
from gpuslurm.report.compute import NOBODY, Report
from gpuslurm.report.data import ReportData

PLOT_SUFFIXES = (".png", ".html")
TITLES = ("GPU utilisation over time", "GPUs busy per user", "Share of GPU capacity against quota")


def _times(report: Report) -> list[datetime]:
    return [datetime.fromtimestamp(t) for t in report.times]


def _nan(values: Sequence[float | None]) -> list[float]:
    return [math.nan if v is None else v for v in values]  # a gap in the line, not a drop to 0


def draw_gpus(ax: Any, data: ReportData, report: Report) -> None:
    """One line per device (GPU or MIG device), utilisation in %."""
    nodes = {g.node for g in data.gpus}
    times = _times(report)
    for g in data.gpus:
        label = g.uuid if len(g.uuid) <= 16 else g.uuid[:16] + "…"
        ax.plot(times, _nan(g.util), label=f"{g.node}:{label}" if len(nodes) > 1 else label, linewidth=1)
    ax.set_title(TITLES[0])
    ax.set_ylabel("utilisation (%)")
    # Headroom above 100 % holds the legend, so it never hides a busy GPU's line.
    ax.set_ylim(0, 100 + 12 * ((len(data.gpus) + 3) // 4))
    ax.set_yticks(range(0, 101, 20))
    if data.gpus:
        ax.legend(fontsize="small", ncol=4, loc="upper left")


def draw_users(ax: Any, report: Report) -> None:
    """A stacked area per user: how many GPUs they kept busy on average in each bucket."""
    series = [(u, s) for u, s in report.user_gpus if any(s)]
    if series:
        ax.stackplot(_times(report), *[s for _, s in series], labels=[u for u, _ in series], alpha=0.85)
        ax.legend(fontsize="small", loc="upper left")
    ax.set_title(TITLES[1])
    ax.set_ylabel("GPUs busy")
    ax.set_ylim(0, max(report.totals.gpus, 1))


def draw_share(ax: Any, report: Report) -> None:
    """Bars: each row's share of capacity; a black tick: its quota (none when no quota applies)."""
    rows = [r for r in report.rows if r.key != NOBODY][:20]
    names = [r.key for r in rows]
    xs = list(range(len(rows)))
    colors = ["tab:red" if r.over_quota else "tab:blue" for r in rows]
    ax.bar(xs, [r.share_pct for r in rows], color=colors, label="share used (%)")
    quota = [(x, r.quota_pct) for x, r in zip(xs, rows, strict=True) if r.quota_pct is not None]
    if quota:
        ax.scatter([x for x, _ in quota], [q for _, q in quota], marker="_", s=600, color="black",
                   linewidths=2, label="quota (%)", zorder=3)
    ax.set_xticks(xs, names, rotation=30 if len(rows) > 4 else 0, ha="right" if len(rows) > 4 else "center")
    ax.set_title(TITLES[2])
    ax.set_ylabel("% of GPU capacity")
    top = max([r.share_pct for r in rows] + [q for _, q in quota if q < 100] + [10.0])
    ax.set_ylim(0, min(top * 1.2, 105))
    if rows:
        ax.legend(fontsize="small", loc="upper right")


def build_figure(data: ReportData, report: Report) -> Any:
    """All three charts stacked in one Figure (what a PNG holds)."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(11, 12), layout="constrained")
    ax_gpu, ax_user, ax_share = fig.subplots(3, 1)
    draw_gpus(ax_gpu, data, report)
    draw_users(ax_user, report)
    draw_share(ax_share, report)
    fig.suptitle(_heading(report))
    return fig


def build_figures(data: ReportData, report: Report) -> list[Any]:
    """The three charts as separate Figures (what the HTML page holds)."""
    from matplotlib.figure import Figure

    figs = []
    for i in range(3):
        fig = Figure(figsize=(11, 4.5), layout="constrained")
        ax = fig.subplots()
        if i == 0:
            draw_gpus(ax, data, report)
        elif i == 1:
            draw_users(ax, report)
        else:
            draw_share(ax, report)
        figs.append(fig)
    return figs


def _heading(report: Report) -> str:
    fmt = "%Y-%m-%d %H:%M"
    t = report.totals
    return (f"{datetime.fromtimestamp(report.since).strftime(fmt)} → "
            f"{datetime.fromtimestamp(report.until).strftime(fmt)}: {t.gpus} GPUs, "
            f"used {t.used_gpu_hours:.1f} of {t.capacity_gpu_hours:.1f} GPU-hours")


def _png(fig: Any) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100)
    return buf.getvalue()


def write_plot(path: str, data: ReportData, report: Report, text: str = "") -> None:
    """Write ``path``: a PNG, or an HTML page with the charts embedded and ``text`` (the report) below."""
    suffix = os.path.splitext(path)[1].lower()
    if suffix not in PLOT_SUFFIXES:
        raise InputError("the chart file must end in .png or .html", source="--plot")
    if suffix == ".png":
        payload = _png(build_figure(data, report))
    else:
        images = "\n".join(
            f'<figure><img alt="{html.escape(title)}" src="data:image/png;base64,'
            f'{base64.b64encode(_png(fig)).decode("ascii")}"></figure>'
            for title, fig in zip(TITLES, build_figures(data, report), strict=True))
        heading = html.escape(_heading(report))
        payload = (f"<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>GPU fair-share report"
                   f"</title></head>\n<body>\n<h1>GPU fair-share report</h1>\n<p>{heading}"
                   f"</p>\n{images}\n<pre>{html.escape(text)}</pre>\n</body></html>\n").encode()
    from gpuslurm.safedir import replace_file

    try:
        replace_file(path, payload, 0o644)
    except OSError as exc:
        raise InputError(f"cannot write: {exc.strerror}", source=path) from None
