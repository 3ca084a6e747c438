"""``gpuslurm monitor``: the node monitor daemon (see docs/monitor.md)."""

from __future__ import annotations

import json
import sys
from typing import TYPE_CHECKING

import click

from gpuslurm.cli.main import from_option
from gpuslurm.cli.schedulers import scheduler_for, scheduler_kind
from gpuslurm.config import Config, load_config
from gpuslurm.hooks.epilog import admin_comment
from gpuslurm.hw.source import hardware_source
from gpuslurm.jobid import valid_job_id
from gpuslurm.jsondoc import document
from gpuslurm.report.notify_render import JobText
from gpuslurm.slurm.squeue import job_name_comment
from gpuslurm.slurm.sshare import node_quota_cache
from gpuslurm.slurm.throttle import append_violations
from gpuslurm.watch.monitor import cycle_dict
from gpuslurm.watch.run import Exporting, MonitorParts, run_monitor

if TYPE_CHECKING:
    from collections.abc import Callable

    from gpuslurm.samples import Cycle


def _warn(message: str) -> None:
    click.echo(f"gpuslurm monitor: {message}", err=True)


def _positive_float(ctx: click.Context, param: click.Parameter, value: float | None) -> float | None:
    if value is not None and not 0.05 <= value <= 3600:
        raise click.BadParameter("must be between 0.05 and 3600 seconds")
    return value


@click.command("monitor")
@click.option("--interval", type=float, metavar="SECONDS", callback=_positive_float,
              help="Seconds between cycles (default: [monitor] interval_s, 10).")
@click.option("--once", is_flag=True, help="Run one cycle, store it, print a summary and exit.")
@click.option("--db", metavar="PATH",
              help="The SQLite store (default: [monitor] db, else <state_dir>/monitor.db).")
@click.option("--json", "as_json", is_flag=True, help="Print every cycle as one JSON line.")
@click.option("--prometheus-port", type=click.IntRange(1, 65535), metavar="PORT",
              help="Serve Prometheus metrics on http://ADDR:PORT/metrics (see docs/prometheus.md).")
@click.option("--prometheus-addr", default="127.0.0.1", show_default=True, metavar="ADDR",
              help="Address the metrics server listens on (0.0.0.0 or :: for every interface).")
@from_option
def monitor(interval: float | None, once: bool, db: str | None, as_json: bool, source: str | None,
            prometheus_port: int | None, prometheus_addr: str) -> None:
    """Sample every GPU and GPU process, attribute them to Slurm or PBS jobs, detect hogs, store it all."""
    cfg = load_config()
    hardware = hardware_source(source, nvml_library=cfg.paths.nvml_library)
    run_monitor(cfg, hardware, monitor_parts(cfg), db=db, interval=interval, once=once,
                on_cycle=_print_json if as_json else (_summary if once else None),
                prometheus=None if prometheus_port is None else Exporting(prometheus_addr, prometheus_port),
                warn=_warn)


def monitor_parts(cfg: Config) -> MonitorParts:
    """What the monitor takes from the scheduler adapters (and the epilog's comment line)."""
    return MonitorParts(scheduler_for=lambda timeout: scheduler_for(cfg, timeout),
                        publish=append_violations, comment_text=admin_comment,
                        quota_feeds={"slurm": node_quota_cache},
                        job_text=lambda timeout: _job_text(cfg, timeout))


def _job_text(cfg: Config, timeout: float) -> Callable[[str], JobText]:
    """[notify]: a job's name and comment, from squeue (Slurm) or qstat (PBS: the name only)."""
    slurm = scheduler_kind(cfg) == "slurm"

    def text(job_id: str) -> JobText:
        if not valid_job_id(job_id):
            return JobText()
        if not slurm:
            from gpuslurm.pbs.scheduler import job_name

            name = job_name(job_id, qstat=cfg.paths.qstat, timeout=timeout)
            return JobText(name or "")
        found = job_name_comment(job_id, squeue=cfg.paths.squeue, timeout=timeout)
        return JobText() if found is None else JobText(*found)

    return text


def _print_json(cycle: Cycle) -> None:
    doc = document("monitor-cycle", cycle_dict(cycle), cycle.node)
    sys.stdout.write(json.dumps(doc, separators=(",", ":")) + "\n")
    sys.stdout.flush()


def _summary(cycle: Cycle) -> None:
    jobs = sum(1 for p in cycle.procs if p.job_id is not None)
    click.echo(f"{cycle.node}: {len(cycle.gpus)} devices, {len(cycle.procs)} GPU processes "
               f"({jobs} in jobs), {len(cycle.allocations)} allocations, {len(cycle.problems)} problems")
    for p in cycle.problems:
        click.echo(f"  {p.kind}: {p.subject}: {p.detail}")
