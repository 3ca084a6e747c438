"""``gpuslurm demo``: a day on a DGX H100 through the real monitor, then the fair-share report."""

from __future__ import annotations

import shlex
import shutil
import sys
import time
from pathlib import Path
from typing import IO, Any

import click

from gpuslurm.demo import run as demo_run
from gpuslurm.demo import script


def _positive(ctx: click.Context, param: click.Parameter, value: float | None) -> float | None:
    if value is not None and not value > 0:
        raise click.BadParameter("must be more than 0")
    return value


@click.command("demo")
@click.option("--hours", type=float, default=24.0, show_default=True, metavar="N",
              help="Length of the replayed day (2 to 168 hours; the script stretches to fit).")
@click.option("--speed", type=float, callback=_positive, metavar="X",
              help="Simulated seconds per real second (default: as fast as the machine goes).")
@click.option("--out", type=click.Path(path_type=Path, file_okay=False), metavar="DIR",
              help="Directory for the store, report and chart (new, empty or an earlier demo's; "
                   "default: a new temporary directory).")
@click.option("--no-plot", is_flag=True, help="Do not draw the chart.")
def demo(hours: float, speed: float | None, out: Path | None, no_plot: bool) -> None:
    """Replay a scripted day of jobs (a rogue process and an idle allocation among them) on the
    built-in DGX H100 through the monitor, then print the fair-share report and draw its chart.
    Needs no GPU, no Slurm and no root."""
    demo_run.check_hours(hours)
    no_chart = "--no-plot" if no_plot else demo_run.chart_unavailable()
    where = demo_run.prepare_out(out)
    err = sys.stderr
    click.echo(f"Replaying {hours:g} h on a DGX H100 (8 GPUs): {len(script.USERS)} users, "
               f"{len(script.JOBS)} jobs, one process outside Slurm; a monitor cycle every "
               f"{demo_run.INTERVAL_S:g} s, stored in {where / demo_run.DB_NAME}", err=True)
    bar = _Bar(err)
    result = demo_run.run_day(where, hours, speed=speed, progress=bar.update)
    bar.done()
    found = ", ".join(f"{n} {kind}" for kind, n in result.found.items()) or "none"
    click.echo(f"{result.cycles} cycles in {result.elapsed_s:.1f} s; violations found: {found}\n", err=True)
    chart = demo_run.write_report(result, sys.stdout, plot=no_chart is None)
    sys.stdout.flush()
    click.echo("", err=True)
    click.echo(f"Chart:  {chart}" if chart is not None else f"Chart:  not drawn: {no_chart}", err=True)
    click.echo(f"Report: {where / demo_run.REPORT_NAME}", err=True)
    db = shlex.quote(str(result.db))
    conf = shlex.quote(str(where / demo_run.CONFIG_NAME))
    click.echo(f"Next:   GPUSLURM_CONFIG={conf} gpuslurm fairshare-report --db {db} "
               f"--since @{result.since:.0f} --until @{result.until:.0f} --by job", err=True)


class _Bar:
    """A one-line progress bar on a terminal; a line every tenth of the day otherwise."""

    WIDTH = 30

    def __init__(self, fp: IO[str]) -> None:
        self.fp = fp
        self.tty = fp.isatty()
        self.next_tenth = 1
        self.started = time.monotonic()

    def update(self, p: Any) -> None:
        frac = min(1.0, p.done_s / p.day_s)
        found = ", ".join(f"{n} {kind}" for kind, n in p.found.items()) or "none yet"
        if self.tty:
            cells = int(frac * self.WIDTH)
            line = (f"[{'#' * cells}{'.' * (self.WIDTH - cells)}] {frac * 100:3.0f} %  "
                    f"{_hm(p.done_s)} of {_hm(p.day_s)}  {p.jobs} jobs  found: {found}")
            self.fp.write("\r" + line[:_columns() - 1] + "\x1b[K")
            self.fp.flush()
            return
        while frac * 10 >= self.next_tenth - 1e-9:
            self.fp.write(f"demo: {self.next_tenth * 10:3d} % ({_hm(p.done_s)} of {_hm(p.day_s)} replayed), "
                          f"{p.jobs} jobs running, violations: {found}\n")
            self.fp.flush()
            self.next_tenth += 1

    def done(self) -> None:
        if self.tty:
            self.fp.write("\n")
            self.fp.flush()


def _hm(seconds: float) -> str:
    m = int(seconds // 60)
    return f"{m // 60}:{m % 60:02d}"


def _columns() -> int:
    return max(20, shutil.get_terminal_size().columns)
