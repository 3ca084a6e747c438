"""Charts for the fair-share report: what the report says, per row and over time.

Three panels: each row's allocated, used and idle GPU-hours (the report's own figures, use outside
any job hatched), every GPU's utilisation over time as a heat map with one row per GPU labelled as
users know it (its index, ``node:index`` when the window spans nodes), and each row's share of
capacity against its quota. Time axes name their time zone.

matplotlib is imported here only, and only when a chart is drawn (``--plot``). Figures are
built with ``matplotlib.figure.Figure`` (no pyplot: no global state, no GUI backend) and drawn by
Agg. A ``.png`` gets the three charts stacked in one image; a ``.html`` page is the report as
tables (:mod:`gpuslurm.report.html`) with the charts embedded.
"""

from __future__ import annotations

import io
import math
import os
import time
from collections.abc import Sequence
from datetime import datetime
from typing import TYPE_CHECKING

from gpuslurm.errors import InputError
from gpuslurm.policy.wording import tenths
from gpuslurm.report.compute import NOBODY, Report, Row
from gpuslurm.report.data import GpuSeries, ReportData
from gpuslurm.report.html import render_page
from gpuslurm.safedir import replace_file

PLOT_SUFFIXES = (".png", ".html")
TITLES = ("GPU-hours per {by}: allocated, used and idle", "GPU utilisation over time",
          "Share of GPU capacity against quota")
if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure
    from matplotlib.image import AxesImage

MAX_ROWS = 20  # rows drawn in the bar charts, most used first


def titles(report: Report) -> tuple[str, ...]:
    """The panels' titles for this report (the first names its grouping)."""
    return (TITLES[0].format(by=report.by), *TITLES[1:])


def zone(ts: float) -> str:
    """The time zone the report's times are in, as the axes and the page name it."""
    return time.strftime("%Z", time.localtime(ts)) or time.strftime("%z", time.localtime(ts))


def gpu_label(g: GpuSeries, nodes: int) -> str:
    """A GPU as users know it: its index, ``node:index`` across nodes; the UUID where the source
    cannot say (Prometheus series carry no index)."""
    if not g.label:
        return f"{g.node}:{g.uuid}" if nodes > 1 else g.uuid
    return f"{g.node}:{g.label}" if nodes > 1 else g.label


def _nan(values: Sequence[float | None]) -> list[float]:
    return [math.nan if v is None else v for v in values]  # a gap, not a drop to 0


def _rows(report: Report) -> list[Row]:
    return [r for r in report.rows if r.key != NOBODY or r.used_gpu_hours > 0][:MAX_ROWS]


def draw_hours(ax: Axes, report: Report) -> None:
    """Per row, three bars: allocated, used (its part outside any job hatched) and idle GPU-hours."""
    rows = _rows(report)
    xs = list(range(len(rows)))
    width = 0.27
    ax.bar([x - width for x in xs], [r.allocated_gpu_hours for r in rows], width, label="allocated",
           color="tab:blue")
    ax.bar(xs, [r.used_gpu_hours for r in rows], width, label="used", color="tab:green")
    ax.bar(xs, [r.outside_gpu_hours for r in rows], width, label="used outside any job", color="none",
           edgecolor="black", hatch="//")
    ax.bar([x + width for x in xs], [r.idle_gpu_hours for r in rows], width,
           label="idle (allocated, not busy)", color="tab:orange")
    ax.set_xticks(xs, [r.key for r in rows], rotation=30 if len(rows) > 4 else 0,
                  ha="right" if len(rows) > 4 else "center")
    ax.set_title(titles(report)[0])
    ax.set_ylabel("GPU-hours")
    if rows:
        ax.legend(fontsize="small", loc="upper right")


def draw_gpus(ax: Axes, data: ReportData, report: Report) -> AxesImage | None:
    """A heat map: one row per GPU (index order), utilisation % per bucket, blank where unknown."""
    from matplotlib import dates

    nodes = len({g.node for g in data.gpus})
    gpus = list(data.gpus)
    ax.set_title(TITLES[1])
    ax.set_xlabel(f"time ({zone(report.since)})")
    if not gpus or not report.times:
        return None
    x0 = dates.date2num(datetime.fromtimestamp(data.start))  # type: ignore[no-untyped-call]
    x1 = dates.date2num(  # type: ignore[no-untyped-call]
        datetime.fromtimestamp(data.start + data.buckets * data.step_s))
    image = ax.imshow([_nan(g.util) for g in gpus], aspect="auto", interpolation="nearest", vmin=0, vmax=100,
                      cmap="viridis", extent=(x0, x1, len(gpus) - 0.5, -0.5))
    ax.xaxis_date()
    ax.set_yticks(range(len(gpus)), [gpu_label(g, nodes) for g in gpus])
    ax.set_ylabel("GPU")
    return image


def draw_share(ax: Axes, report: Report) -> None:
    """Bars: each row's share of capacity; a black tick: its quota (none when no quota applies)."""
    rows = [r for r in report.rows if r.key != NOBODY][:MAX_ROWS]
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


def _draw(i: int, fig: Figure, ax: Axes, data: ReportData, report: Report) -> None:
    if i == 0:
        draw_hours(ax, report)
    elif i == 1:
        image = draw_gpus(ax, data, report)
        if image is not None:
            fig.colorbar(image, ax=ax, label="utilisation (%)")
    else:
        draw_share(ax, report)


def build_figure(data: ReportData, report: Report) -> Figure:
    """All three charts stacked in one Figure (what a PNG holds)."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(11, 12), layout="constrained")
    for i, ax in enumerate(fig.subplots(3, 1)):
        _draw(i, fig, ax, data, report)
    fig.suptitle(heading(report))
    return fig


def build_figures(data: ReportData, report: Report) -> list[Figure]:
    """The three charts as separate Figures (what the HTML page holds)."""
    from matplotlib.figure import Figure

    figs = []
    for i in range(3):
        fig = Figure(figsize=(11, 4.5), layout="constrained")
        _draw(i, fig, fig.subplots(), data, report)
        figs.append(fig)
    return figs


def heading(report: Report) -> str:
    """One line: the window with its time zone, the GPUs and what they did."""
    fmt = "%Y-%m-%d %H:%M"
    t = report.totals
    return (f"{datetime.fromtimestamp(report.since).strftime(fmt)} → "
            f"{datetime.fromtimestamp(report.until).strftime(fmt)} {zone(report.until)}: {t.gpus} GPUs, "
            f"allocated {tenths(t.allocated_gpu_hours)}, used {tenths(t.used_gpu_hours)}, "
            f"idle {tenths(t.idle_gpu_hours)} of {tenths(t.capacity_gpu_hours)} GPU-hours")


def _png(fig: Figure) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100)
    return buf.getvalue()


def write_plot(path: str, data: ReportData, report: Report) -> None:
    """Write ``path``: a PNG of the charts, or an HTML page of the report's tables with them."""
    suffix = os.path.splitext(path)[1].lower()
    if suffix not in PLOT_SUFFIXES:
        raise InputError("the chart file must end in .png or .html", source="--plot")
    if suffix == ".png":
        payload = _png(build_figure(data, report))
    else:
        charts = [(title, _png(fig)) for title, fig in zip(titles(report), build_figures(data, report),
                                                            strict=True)]
        payload = render_page(report, heading(report), zone(report.until), charts).encode()
    try:
        replace_file(path, payload, 0o644)
    except OSError as exc:
        raise InputError(f"cannot write: {exc.strerror}", source=path) from None
