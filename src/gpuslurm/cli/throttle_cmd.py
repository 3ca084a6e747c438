"""``gpuslurm throttle list|add|remove|sync``: the throttle file that plugins/job_submit.lua reads."""

from __future__ import annotations

import json
import pwd
import time
from collections.abc import Callable
from datetime import datetime
from typing import Any, TypeVar

import click

from gpuslurm.cli.schedulers import scheduler_kind
from gpuslurm.config import Config, load_config
from gpuslurm.errors import GpuslurmError, InputError
from gpuslurm.jsondoc import document
from gpuslurm.pbs.admission import PbsAdmission
from gpuslurm.policy.admission import AdmissionConfig, check_band
from gpuslurm.policy.throttle import (
    Throttle,
    ThrottleFile,
    active_throttles,
    add_throttle,
    check_mode,
    check_user,
    make_throttle,
    parse_duration,
    parse_until,
    remove_throttle,
)
from gpuslurm.slurm.admission import SlurmAdmission
from gpuslurm.slurm.throttle import read_throttle_file, update_throttle_file
from gpuslurm.slurm.throttle_sync import sync_throttles
from gpuslurm.times import parse_duration as parse_interval
from gpuslurm.times import show
from gpuslurm.watch.admission import Admission, auto_round, load_state, save_state

F = TypeVar("F", bound=Callable[..., Any])


def _file_option(f: F) -> F:
    return click.option("--file", "path", metavar="PATH",
                        help="The throttle file (default: [throttle] file in the config, "
                             "/etc/slurm/gpuslurm-throttle).")(f)


def _config() -> Config:
    return load_config()


def _path(path: str | None, cfg: Config) -> str:
    chosen = path or cfg.throttle.file
    if not chosen.startswith("/"):
        raise InputError(f"the throttle file must be an absolute path, not {chosen!r}", source="--file")
    return str(chosen)


def _when(ts: float) -> str:
    return show(ts, "%Y-%m-%d %H:%M:%S %Z")


def _left(seconds: float) -> str:
    s = max(int(seconds), 0)
    if s >= 86400:
        return f"{s // 86400}d{s % 86400 // 3600}h"
    if s >= 3600:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 60}m{s % 60:02d}s"


def _warn_junk(path: str, content: ThrottleFile) -> None:
    for number, _text, why in content.junk[:5]:
        click.echo(f"gpuslurm: warning: {path}:{number}: not a throttle line ({why}), ignored", err=True)
    if len(content.junk) > 5:
        click.echo(f"gpuslurm: warning: {path}: {len(content.junk) - 5} more junk line(s)", err=True)
    if content.doubtful:
        click.echo(f"gpuslurm: warning: {path}: not throttled, a junk line names them: "
                   f"{', '.join(content.doubtful[:20])}", err=True)


@click.group("throttle")
def throttle() -> None:
    """Throttle users' GPU submissions through Slurm's job_submit/lua (see docs/throttle.md)."""


@throttle.command("list")
@_file_option
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
@click.option("--all", "show_all", is_flag=True, help="Also show expired lines still in the file.")
def list_cmd(path: str | None, as_json: bool, show_all: bool) -> None:
    """List the throttled users: mode, until when, why and whom to ask."""
    file = _path(path, _config())
    now = time.time()
    content = read_throttle_file(file)
    _warn_junk(file, content)
    rows = content.throttles if show_all else active_throttles(content.throttles, now)
    if as_json:
        doc = document("throttle-list", {"file": file, "throttles": [
            {**t._asdict(), "until_iso": datetime.fromtimestamp(t.until).astimezone().isoformat(),
             "active": t.active(now)} for t in rows]})
        click.echo(json.dumps(doc, indent=2))
        return
    if not rows:
        click.echo("no user is throttled" + ("" if content.exists else f" ({file} does not exist)"))
        return
    click.echo(f"{'USER':<16} {'MODE':<8} {'VALUE':>6} {'UNTIL':<25} {'LEFT':>8}  CONTACT / REASON")
    for t in rows:
        value = "-" if t.mode == "reject" else str(t.value)
        left = _left(t.until - now) if t.active(now) else "expired"
        click.echo(f"{t.user:<16} {t.mode:<8} {value:>6} {_when(t.until):<25} {left:>8}  "
                   f"{t.contact or '-'} / {t.reason or '-'}")


@throttle.command("add")
@click.argument("user")
@_file_option
@click.option("--for", "duration", metavar="DURATION", help="How long: 90s, 30m, 2h, 1d, 1h30m.")
@click.option("--until", "until", metavar="TIME", help="Until when: 2030-01-31T18:00, 18:00, @EPOCH.")
@click.option("--mode", type=click.Choice(["reject", "cap", "priority"]),
              help="reject GPU jobs (default), cap their GPUs, or lower their priority.")
@click.option("--cap", type=int, metavar="N", help="Most GPUs a job may have (implies --mode cap).")
@click.option("--nice", type=int, metavar="N", help="Nice added to GPU jobs (implies --mode priority).")
@click.option("--reason", default="", metavar="TEXT", help="Why; shown to the user.")
@click.option("--contact", default=None, metavar="TEXT", help="Whom to ask; shown to the user.")
def add_cmd(user: str, path: str | None, duration: str | None, until: str | None, mode: str | None,
            cap: int | None, nice: int | None, reason: str, contact: str | None) -> None:
    """Throttle USER's GPU submissions for a while (replaces any throttle USER has)."""
    cfg = _config()
    file = _path(path, cfg)
    check_user(user)
    if (duration is None) == (until is None):
        raise InputError("give exactly one of --for DURATION and --until TIME", source="throttle add")
    if cap is not None and nice is not None:
        raise InputError("--cap and --nice do not go together", source="throttle add")
    chosen = mode or ("cap" if cap is not None else "priority" if nice is not None else "reject")
    if (cap is not None and chosen != "cap") or (nice is not None and chosen != "priority"):
        raise InputError(f"--{'cap' if cap is not None else 'nice'} does not go with --mode {chosen}",
                         source="throttle add")
    value = check_mode(chosen, cap if chosen == "cap" else nice,
                       cap_default=cfg.throttle.cap_gpus, nice_default=cfg.throttle.nice)
    now = time.time()
    end = now + parse_duration(duration) if duration is not None else parse_until(str(until), now)
    new = make_throttle(user, int(end), chosen, value, created=int(now),
                        contact=cfg.throttle.contact if contact is None else contact, reason=reason)
    _warn_unknown_user(user)
    before, _after = update_throttle_file(file, lambda old: add_throttle(old.throttles, new, now), now)
    _warn_junk(file, before)
    what = {"reject": "GPU jobs refused", "cap": f"GPUs capped to {value}",
            "priority": f"GPU jobs niced by {value}"}[chosen]
    click.echo(f"{user}: {what} until {_when(new.until)}")


def _warn_unknown_user(user: str) -> None:
    try:
        pwd.getpwnam(user)
    except KeyError:
        click.echo(f"gpuslurm: warning: no user {user!r} on this host; throttled anyway "
                   "(slurmctld resolves names itself)", err=True)


@throttle.command("remove")
@click.argument("user")
@_file_option
def remove_cmd(user: str, path: str | None) -> None:
    """Lift USER's throttle (nothing to do if USER is not throttled)."""
    file = _path(path, _config())
    check_user(user)
    now = time.time()
    found: list[bool] = []

    def change(old: ThrottleFile) -> tuple[Throttle, ...] | None:
        kept, removed = remove_throttle(old.throttles, user, now)
        found.append(removed)
        return kept if removed else None

    before, _after = update_throttle_file(file, change, now)
    _warn_junk(file, before)
    click.echo(f"{user}: throttle lifted" if found and found[0] else f"{user}: was not throttled")


@throttle.command("sync")
@_file_option
@click.option("--violations-dir", metavar="DIR",
              help="Where node monitors write violations (default: [paths] violations_dir).")
@click.option("--source", "violation_source", metavar="prometheus:URL",
              help="Read violations from Prometheus (the monitors' exporters) instead of the directory.")
@click.option("--dry-run", is_flag=True, help="Print what would change; write nothing.")
def sync_cmd(path: str | None, violations_dir: str | None, violation_source: str | None,
             dry_run: bool) -> None:
    """Throttle the users named in recent violations, as [throttle] sync_* configures."""
    cfg = _config()
    file = _path(path, cfg)

    def warn(line: str) -> None:
        click.echo(f"gpuslurm: warning: {line}", err=True)

    done = sync_throttles(cfg, file, violations_dir=violations_dir, source=violation_source,
                          dry_run=dry_run, warn=warn)
    if done.before is not None:
        _warn_junk(file, done.before)
    verb = "would throttle" if dry_run else "throttled"
    for t in done.changed:
        click.echo(f"{verb} {t.user} ({t.mode}) until {_when(t.until)}: {t.reason}")
    if not done.changed:
        click.echo(f"{done.violations} violation(s) read; no throttle to add or extend")


@throttle.command("auto")
@click.option("--once", is_flag=True, help="One round (read, decide, apply), then exit: for cron.")
@click.option("--interval", default="60s", show_default=True, metavar="DUR", help="Time between rounds.")
@click.option("--backoff", metavar="DUR",
              help="How long the load must stay low before easing; doubles on each flap "
                   "(default: [throttle.auto] backoff_s, 5 min).")
@click.option("--dry-run", is_flag=True, help="Say what would change; change nothing, save no state.")
@click.option("--state-dir", metavar="DIR",
              help="Where the limits this set are remembered (default: [paths] state_dir).")
def auto_cmd(once: bool, interval: str, backoff: str | None, dry_run: bool, state_dir: str | None) -> None:
    """Per-user GPU limits from the cluster's load, on the controller (Slurm) or server (PBS).

    Load above 70 % limits the users above their fair share to 10 % of the GPUs, above 30 % to
    50 %. Slurm: GrpTRES=gres/gpu=N, a job over it stays PENDING (AssocGrpGRES); needs
    AccountingStorageTRES=gres/gpu and AccountingStorageEnforce=limits. PBS ([scheduler] kind):
    the server's max_run_res.ngpus [u:NAME=N], a job over it stays queued (docs/throttle.md).
    """
    config = _config()
    auto = config.throttle.auto
    try:
        check_band(auto.band_low, auto.band_high)
    except ValueError as exc:
        raise InputError(str(exc), source="[throttle.auto] band_low, band_high") from None
    every = parse_interval(interval, "--interval")
    base = parse_interval(backoff, "--backoff") if backoff is not None else auto.backoff_s
    cfg = AdmissionConfig(backoff_s=base, backoff_max_s=max(base, auto.backoff_max_s),
                          exempt=frozenset(auto.exempt_users), band=(auto.band_low, auto.band_high),
                          gain=auto.band_gain)
    directory = state_dir or config.paths.state_dir
    state = load_state(directory, cfg.tiers)
    p = config.paths
    adm: Admission
    try:
        if scheduler_kind(config) == "pbs":
            adm = PbsAdmission(qstat=p.qstat, pbsnodes=p.pbsnodes, qmgr=p.qmgr,
                               utilisation_source=auto.utilisation_source)
        else:
            adm = SlurmAdmission(squeue=p.squeue, scontrol=p.scontrol, sacctmgr=p.sacctmgr,
                                 utilisation_source=auto.utilisation_source)
    except InputError as exc:  # parse_source names "--source"; here it is a config key
        raise InputError(exc.message, source="[throttle.auto] utilisation_source") from None

    def log(line: str) -> None:
        click.echo(f"{time.strftime('%Y-%m-%dT%H:%M:%S%z')} gpuslurm throttle auto: {line}")

    while True:
        try:
            state = auto_round(adm, state, cfg, time.time(), dry_run=dry_run, log=log)
            if not dry_run:
                save_state(directory, state)
        except GpuslurmError as exc:
            if once:
                raise
            log(f"round failed, next in {every:.0f}s: {exc}")  # the server restarting: keep going
        if once:
            return
        time.sleep(every)
