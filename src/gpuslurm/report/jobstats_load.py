"""``gpuslurm jobstats``'s use case: one job's figures from this node's monitor store, for a
caller allowed to see them (the job's owner by uid, root, or a member of ``[jobstats]
admin_groups``)."""

from __future__ import annotations

import grp
import os
from collections.abc import Sequence

from gpuslurm.config import Config
from gpuslurm.errors import InputError
from gpuslurm.jobid import valid_job_id
from gpuslurm.report.jobstats import JobStats, Settings, compute, may_see
from gpuslurm.state.store import Store, default_path


def settings(cfg: Config) -> Settings:
    js = cfg.jobstats
    return Settings(idle_pct=cfg.detect.idle.threshold_pct, tail_idle_s=cfg.detect.idle.window_s,
                    max_gap_s=max(3 * cfg.monitor.interval_s, 5.0), offers=js.offers,
                    site_notes=js.notes, links=js.links)


def admin_gids(names: Sequence[str]) -> list[int]:
    """The gids of the configured admin groups; a group this host does not know admits nobody."""
    gids = []
    for name in names:
        try:
            gids.append(grp.getgrnam(name).gr_gid)
        except KeyError:
            continue
    return gids


def job_stats(cfg: Config, job_id: str, *, now: float, db: str | None = None,
              caller_uid: int | None = None, caller_gids: Sequence[int] | None = None) -> JobStats:
    """The job's figures; InputError (exit 2) for a bad id, no store, or a job that is not in the
    store or not the caller's (one message for both, so the store's jobs are not told apart)."""
    if not valid_job_id(job_id):
        raise InputError(f"not a job id: {job_id[:40]!r}", source="JOBID")
    uid = os.getuid() if caller_uid is None else caller_uid
    gids = [*os.getgroups(), os.getgid()] if caller_gids is None else list(caller_gids)
    path = db or cfg.monitor.db or default_path(cfg.paths.state_dir)
    if not os.path.lexists(path):
        raise InputError("no monitor store here: is `gpuslurm monitor` running on this node?", source=path)
    with Store.open(path, readonly=True) as store:
        record = store.job(job_id)
    if record is None or not may_see(uid, gids, admin_gids(cfg.jobstats.admin_groups), record.uid):
        raise InputError(f"job {job_id}: not in this node's monitor store, or not yours")
    running = now - record.last_seen <= 3 * cfg.monitor.interval_s + 5
    return compute(record, settings(cfg), running=running)
