"""``gpuslurm hogs``: the violations the node monitors see now, in words an admin can act on.

On a node it reads the monitor's store; with ``--violations-dir`` (the directory every node's
monitor appends to, read on the controller) it covers the whole cluster. A finding is current
while the monitor keeps seeing it: its end is refreshed every cycle in the store and at least
every ``REPEAT_S`` in the shared directory, so "current" means "seen within that much, plus
three monitor intervals".
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Iterable, Sequence
from datetime import datetime

import click

from gpuslurm.cli.main import json_option
from gpuslurm.config import load_config
from gpuslurm.errors import InputError
from gpuslurm.jsondoc import document
from gpuslurm.samples import Violation
from gpuslurm.slurm.throttle import read_violations
from gpuslurm.state.store import Store, default_path

REPEAT_S = 60.0  # how often a monitor re-appends an ongoing violation to the shared directory


def current(violations: Iterable[Violation], now: float, slack_s: float) -> list[Violation]:
    """One record per finding (its latest), for the findings seen within ``slack_s`` of ``now``."""
    latest: dict[tuple[object, ...], Violation] = {}
    for v in violations:
        key = (v.kind, v.node, v.user, v.job_id, v.pid, v.gpu_uuid, v.start)
        if key not in latest or v.duration_s > latest[key].duration_s:
            latest[key] = v
    live = [v for v in latest.values() if v.start + v.duration_s >= now - slack_s]
    return sorted(live, key=lambda v: (v.kind, v.node, v.user or "", v.job_id or "", v.pid or 0))


def _duration(seconds: float) -> str:
    minutes = int(seconds // 60)
    return f"{minutes // 60} h {minutes % 60:02d} min" if minutes >= 60 else f"{minutes} min"


def table(violations: Sequence[Violation]) -> list[str]:
    """Two lines per finding: who, where, since when; then the evidence."""
    lines = [f"{'KIND':<10} {'NODE':<12} {'USER':<12} {'JOB':<10} {'PID':>8}  {'PROCESS':<16} "
             f"{'SINCE':<16} DURATION"]
    for v in violations:
        since = datetime.fromtimestamp(v.start).astimezone().strftime("%Y-%m-%d %H:%M")
        lines.append(f"{v.kind:<10} {v.node:<12} {v.user or '-':<12} {v.job_id or '-':<10} "
                     f"{v.pid if v.pid is not None else '-':>8}  {v.process or '-':<16} {since:<16} "
                     f"{_duration(v.duration_s)}")
        lines.append(f"  {v.gpu_uuid or '-'}: {v.evidence}")
    return lines


@click.command("hogs")
@json_option
@click.option("--db", metavar="PATH",
              help="The monitor's store (default: [monitor] db, else <state_dir>/monitor.db).")
@click.option("--violations-dir", "directory", metavar="DIR",
              help="Read every node's violations from this shared directory instead of the store "
                   "(on the controller; [paths] violations_dir).")
def hogs(as_json: bool, db: str | None, directory: str | None) -> None:
    """List the current violations: rogue processes, idle allocations, users over their share."""
    cfg = load_config()
    now = time.time()
    slack = 3 * cfg.monitor.interval_s + 5
    if directory is not None:
        scan = read_violations(directory, since=now - slack - REPEAT_S)
        for problem in scan.problems:
            click.echo(f"gpuslurm hogs: skipped {problem}", err=True)
        found = current(scan.violations, now, slack + REPEAT_S)
    else:
        path = db or cfg.monitor.db or default_path(cfg.paths.state_dir)
        if not os.path.exists(path):
            raise InputError("no monitor store here: is `gpuslurm monitor` running on this node?",
                             source=path)
        with Store.open(path, readonly=True) as store:
            found = current(store.violations(now - slack, now), now, slack)
    if as_json:
        doc = document("hogs", {"violations": [
            {**v._asdict(), "start_iso": datetime.fromtimestamp(v.start).astimezone().isoformat()}
            for v in found]})
        sys.stdout.write(json.dumps(doc, indent=2) + "\n")
    elif not found:
        click.echo("no current violations")
    else:
        click.echo("\n".join(table(found)))
