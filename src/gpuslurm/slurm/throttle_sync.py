"""``gpuslurm throttle sync``'s use case: read recent violations (the monitors' shared directory or
Prometheus), decide the throttles (:func:`gpuslurm.policy.throttle.throttles_from_violations`,
pure) and bring the throttle file to them.

Beside :mod:`gpuslurm.slurm.throttle`, whose file and violations directory it reads and writes
(watch/ may not import this layer, and the decision is policy/'s).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import NamedTuple

from gpuslurm.config import Config
from gpuslurm.errors import InputError
from gpuslurm.policy.throttle import (
    SyncPolicy,
    Throttle,
    ThrottleFile,
    active_throttles,
    apply_sync,
    implausible,
    throttles_from_violations,
)
from gpuslurm.slurm.throttle import ViolationScan, read_throttle_file, read_violations, update_throttle_file


class SyncOutcome(NamedTuple):
    """What a sync read and did (``before``: the file as the write found it; None for a dry run)."""

    violations: int  # how many were read
    changed: tuple[Throttle, ...]  # added or extended (a dry run: would be)
    before: ThrottleFile | None


def sync_policy(cfg: Config) -> SyncPolicy:
    """``[throttle] sync_*`` as the decision's policy."""
    tc = cfg.throttle
    value = tc.cap_gpus if tc.sync_mode == "cap" else tc.nice if tc.sync_mode == "priority" else 0
    return SyncPolicy(kinds=tc.sync_kinds, duration_s=tc.sync_minutes * 60, mode=tc.sync_mode,
                      value=value, contact=tc.contact)


def sync_throttles(cfg: Config, file: str, *, violations_dir: str | None = None, source: str | None = None,
                   dry_run: bool = False, warn: Callable[[str], None] = lambda message: None,
                   now: float | None = None) -> SyncOutcome:
    """Throttle the users named in the violations of the last ``[throttle] sync_minutes`` (from
    ``violations_dir``, default ``[paths] violations_dir``, or ``source``, ``prometheus:URL``);
    ``warn`` hears what was skipped. InputError for a bad source."""
    policy = sync_policy(cfg)
    at = time.time() if now is None else now
    if source is not None:
        scan = _prometheus_scan(source, violations_dir, at - policy.duration_s, at)
    else:
        scan = read_violations(violations_dir or cfg.paths.violations_dir, since=at - policy.duration_s)
    if not scan.exists:
        warn(f"{violations_dir or cfg.paths.violations_dir}: no such directory, no violation read "
             "(see paths.violations_dir)")
    for problem in scan.problems:
        warn(f"{problem}: skipped")
    for v in scan.violations:
        why = implausible(v, at)
        if why is not None and v.kind in policy.kinds:
            warn(f"violation of {v.user} on {v.node}: {why}: skipped")
    proposed = throttles_from_violations(scan.violations, policy, at)
    changed: list[Throttle] = []
    if dry_run:
        current = read_throttle_file(file)
        _state, diff = apply_sync(active_throttles(current.throttles, at), proposed, at)
        return SyncOutcome(len(scan.violations), tuple(diff), None)

    def change(old: ThrottleFile) -> tuple[Throttle, ...] | None:
        state, diff = apply_sync(old.throttles, proposed, at)
        changed.extend(diff)
        return state if diff else None

    before, _after = update_throttle_file(file, change, at)
    return SyncOutcome(len(scan.violations), tuple(changed), before)


def _prometheus_scan(source: str, violations_dir: str | None, since: float, now: float) -> ViolationScan:
    from gpuslurm.report.prometheus import load_violations

    if violations_dir is not None:
        raise InputError("--source and --violations-dir do not go together", source="throttle sync")
    if not source.startswith("prometheus:"):
        raise InputError(f"not a violation source: {source!r} (prometheus:URL)", source="--source")
    return ViolationScan(tuple(load_violations(source, since, now)))
