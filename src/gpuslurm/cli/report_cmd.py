"""``gpuslurm fairshare-report``: who used the GPUs, who wasted them, who took more than their share."""

from __future__ import annotations

import sys
import time

import click

from gpuslurm.config import Config, load_config
from gpuslurm.errors import GpuslurmError, InputError
from gpuslurm.policy.share import Quotas
from gpuslurm.report.charts import write_plot
from gpuslurm.report.compute import BY_CHOICES, Policy
from gpuslurm.report.data import auto_step
from gpuslurm.report.fairshare import fairshare
from gpuslurm.report.render import FORMATS, write_report
from gpuslurm.report.window import resolve_window
from gpuslurm.slurm.sshare import quotas, read_shares
from gpuslurm.state.store import default_path


@click.command("fairshare-report")
@click.option("--last", metavar="DURATION", help="The window ending now: 90m, 24h, 30d (default 24h).")
@click.option("--since", metavar="TIME", help="Window start: 2024-05-01T08:00, @UNIX, -2h or now.")
@click.option("--until", metavar="TIME", help="Window end (default: now); needs --since.")
@click.option("--by", type=click.Choice(BY_CHOICES), default="user", show_default=True,
              help="One row per user, account, job or process.")
@click.option("--format", "fmt", type=click.Choice(FORMATS), default="table", show_default=True)
@click.option("--plot", metavar="FILE.png|FILE.html", help="Also write the charts to FILE.")
@click.option("--source", metavar="sqlite:PATH|prometheus:URL",
              help="Where the samples are (default: this node's store, see --db).")
@click.option("--db", metavar="PATH", help="Shorthand for --source sqlite:PATH "
              "(default: [monitor] db, else <state_dir>/monitor.db).")
@click.option("--step", type=click.FloatRange(min=60, max=86400), metavar="SECONDS",
              help="Bucket width of the series (default: whole minutes, at most 2000 buckets).")
def fairshare_report(last: str | None, since: str | None, until: str | None, by: str, fmt: str,
                     plot: str | None, source: str | None, db: str | None, step: float | None) -> None:
    """Allocated, used and idle GPU-hours per user/account/job/process, shares against quotas,
    violations with evidence, and what to do about them."""
    lo, hi = resolve_window(last, since, until, time.time())
    if plot is not None and not plot.lower().endswith((".png", ".html")):
        raise InputError("the chart file must end in .png or .html", source="--plot")
    cfg = load_config()
    step_s = step if step is not None else auto_step(lo, hi)
    report, data = fairshare(_source(source, db, cfg), lo, hi, step_s, by, lambda gpus: _policy(cfg, gpus),
                             series=plot is not None)
    write_report(report, fmt, sys.stdout)
    if plot is not None and data is not None:
        write_plot(plot, data, report)
        click.echo(f"wrote {plot}", err=True)


def _policy(cfg: Config, gpus: int) -> Policy:
    """The config's (and, with ``quota_source = "slurm"``, Slurm's) judgement of ``gpus`` GPUs."""
    share = cfg.detect.share
    users, accounts = _slurm_quotas(cfg, gpus)
    return Policy(Quotas(share, users).of, {**accounts, **dict(share.accounts)},
                  busy_pct=share.threshold_pct, idle_pct=cfg.detect.idle.threshold_pct)


def _slurm_quotas(cfg: Config, gpus: int) -> tuple[dict[str, float] | None, dict[str, float]]:
    """With ``quota_source = "slurm"``: Slurm's user and account quotas on the report's GPUs.

    A failed ``sshare`` is said on stderr; the report then judges by the config alone.
    """
    if cfg.detect.share.quota_source != "slurm":
        return None, {}
    try:
        found = read_shares(cfg.paths.sshare, timeout=cfg.monitor.command_timeout_s)
    except GpuslurmError as exc:
        click.echo(f"gpuslurm fairshare-report: cannot read Slurm's shares, judging by [detect.share] "
                   f"alone: {exc}", err=True)
        return None, {}
    q = quotas(found, cfg.detect.share.slurm_cluster_gpus, gpus)
    return dict(q.users), dict(q.accounts)


def _source(source: str | None, db: str | None, cfg: Config) -> str:
    if source is not None and db is not None:
        raise InputError("give --source or --db, not both", source="--db")
    if source is not None:
        return source
    if db is not None:
        return f"sqlite:{db}"
    return f"sqlite:{cfg.monitor.db or default_path(cfg.paths.state_dir)}"
