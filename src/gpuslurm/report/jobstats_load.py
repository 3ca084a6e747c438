"""``gpuslurm jobstats``'s use case: one job's figures for a caller allowed to see them (the job's
owner by uid, root, or a member of ``[jobstats] admin_groups``).

Where they come from: the node's monitor store where the caller can read it (root; the
``[monitor] db_group``); else the job's own file, which the monitor leaves for the job's owner
alone (``<[jobstats] dir>/<job>.json``, root's, mode 0400 with a POSIX ACL letting the job's uid
read it, in a directory only root writes: watch/jobfiles.py; files older monitors gave to the
job's uid are read too). docs/jobstats.md says the same for admins. With ``--source
prometheus:URL``: the job's series on every node Prometheus holds it on (report/jobstats_prom.py),
for the job's owner (the caller's uid, against the uid this host gives the ``user`` label the
monitors wrote), root or an admin group.
"""

from __future__ import annotations

import errno
import grp
import json
import os
import pwd
import stat
from collections.abc import Sequence
from typing import Any

from gpuslurm.config import Config
from gpuslurm.errors import InputError
from gpuslurm.jobid import valid_job_id
from gpuslurm.jsondoc import schema_id
from gpuslurm.report import jobstats_prom
from gpuslurm.report.jobstats import JobStats, Settings, compute, may_see, table, to_json
from gpuslurm.state.store import Store, default_path

DIR_NAME = "jobstats"
MAX_FILE_BYTES = 4 << 20  # a job's figures are a few KiB; a thousand processes stay far below


def settings(cfg: Config) -> Settings:
    js = cfg.jobstats
    idle = cfg.detect.idle
    return Settings(idle_pct=idle.threshold_pct, tail_idle_s=idle.window_s,
                    held_busy_mib=idle.held_min_mib if idle.held_memory == "busy" else None,
                    max_gap_s=max(3 * cfg.monitor.interval_s, 5.0), offers=js.offers,
                    site_notes=js.notes, links=js.links)


def files_dir(cfg: Config) -> str:
    """Where the monitor leaves each job's figures for its owner."""
    return cfg.jobstats.dir or os.path.join(cfg.paths.state_dir, DIR_NAME)


def admin_gids(names: Sequence[str]) -> list[int]:
    """The gids of the configured admin groups; a group this host does not know admits nobody."""
    gids = []
    for name in names:
        try:
            gids.append(grp.getgrnam(name).gr_gid)
        except KeyError:
            continue
    return gids


def _not_found(job_id: str) -> InputError:
    # one message for a job the store never saw and another user's: the jobs are not told apart
    return InputError(f"job {job_id}: not in this node's monitor store, or not yours")


def _check_id(job_id: str) -> None:
    if not valid_job_id(job_id):
        raise InputError(f"not a job id: {job_id[:40]!r}", source="JOBID")


def job_stats(cfg: Config, job_id: str, *, now: float, db: str | None = None,
              caller_uid: int | None = None, caller_gids: Sequence[int] | None = None) -> JobStats:
    """The job's figures from the store; InputError (exit 2) for a bad id, no store, or a job
    that is not in the store or not the caller's."""
    _check_id(job_id)
    uid = os.getuid() if caller_uid is None else caller_uid
    gids = [*os.getgroups(), os.getgid()] if caller_gids is None else list(caller_gids)
    path = db or cfg.monitor.db or default_path(cfg.paths.state_dir)
    if not os.path.lexists(path):
        raise InputError("no monitor store here: is `gpuslurm monitor` running on this node?", source=path)
    with Store.open(path, readonly=True) as store:
        record = store.job(job_id)
    if record is None or not may_see(uid, gids, admin_gids(cfg.jobstats.admin_groups), record.uid):
        raise _not_found(job_id)
    running = now - record.last_seen <= 3 * cfg.monitor.interval_s + 5
    return compute(record, settings(cfg), running=running)


PROM_SLACK_S = 120.0  # a scrape's delay on top of the monitor's intervals: still running


def prometheus_stats(cfg: Config, job_id: str, source: str, *, now: float, caller_uid: int | None = None,
                     caller_gids: Sequence[int] | None = None) -> JobStats:
    """The job's figures from Prometheus, every node's devices: for its owner (decided by the
    caller's uid against the uid this host gives the job's ``user`` label), root or an admin
    group; any other job reads as one Prometheus does not hold (exit 2). No sample of a job is
    read before the caller is known to be allowed."""
    _check_id(job_id)
    uid = os.getuid() if caller_uid is None else caller_uid
    gids = [*os.getgroups(), os.getgid()] if caller_gids is None else list(caller_gids)
    owner = jobstats_prom.read_owner(source, job_id, now)
    owner_uid = _uid_of(owner[0]) if owner is not None else None
    if owner is None or not may_see(uid, gids, admin_gids(cfg.jobstats.admin_groups),
                                    -1 if owner_uid is None else owner_uid):
        raise InputError(f"job {job_id}: not in Prometheus' series, or not yours")
    record = jobstats_prom.read_job(source, job_id, -1 if owner_uid is None else owner_uid, now)
    if record is None:  # gone between the two reads (retention)
        raise InputError(f"job {job_id}: not in Prometheus' series, or not yours")
    running = now - record.last_seen <= 3 * cfg.monitor.interval_s + PROM_SLACK_S
    return compute(record, settings(cfg), running=running)


def _uid_of(user: str) -> int | None:
    """This host's uid for the user name the monitors labelled the job with; None when unknown
    here (then only root and admin groups see the job)."""
    try:
        return pwd.getpwnam(user).pw_uid if user else None
    except KeyError:
        return None


def jobstats_document(cfg: Config, job_id: str, *, now: float, db: str | None = None,
                      source: str | None = None) -> dict[str, Any]:
    """``gpuslurm jobstats``: the job's JSON document, from the store where this caller can read
    it, else from the job's file the monitor left for its owner; with ``source``
    (``prometheus:URL``), from Prometheus, every node of the job."""
    _check_id(job_id)
    if source is not None:
        if db is not None:
            raise InputError("--db and --source name two places: give one", source="--source")
        return to_json(prometheus_stats(cfg, job_id, source, now=now))
    path = db or cfg.monitor.db or default_path(cfg.paths.state_dir)
    if db is not None or os.getuid() == 0 or os.access(path, os.R_OK):
        return to_json(job_stats(cfg, job_id, now=now, db=path))
    return read_job_file(files_dir(cfg), job_id, os.getuid())


def read_job_file(directory: str, job_id: str, uid: int) -> dict[str, Any]:
    """The job's file as its owner ``uid`` reads it: a regular file in a directory only root
    writes, root's and writable by root alone (read through its ACL) or, as older monitors left
    it, of that uid, holding a jobstats document of a job of that uid; else the unknown job's
    error (a missing file, or one not theirs, reads as a job not theirs)."""
    _check_id(job_id)
    try:
        dfd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except FileNotFoundError:
        raise InputError("no job files here: is `gpuslurm monitor` running on this node?",
                         source=directory) from None
    except OSError as exc:
        raise InputError(f"cannot read: {exc.strerror}", source=directory) from None
    try:
        st = os.fstat(dfd)
        if st.st_uid != 0 or st.st_mode & 0o022:
            raise InputError("refusing to read: not root's alone (owner or mode)", source=directory)
        try:
            fd = os.open(f"{job_id}.json", os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC,
                         dir_fd=dfd)
        except OSError as exc:
            if exc.errno in (errno.ENOENT, errno.EACCES, errno.ELOOP, errno.EPERM):
                raise _not_found(job_id) from None
            raise InputError(f"cannot read: {exc.strerror}", source=directory) from None
    finally:
        os.close(dfd)
    with os.fdopen(fd, "rb") as fh:
        fst = os.fstat(fh.fileno())
        roots = fst.st_uid == 0 and not fst.st_mode & 0o022
        if not stat.S_ISREG(fst.st_mode) or not (roots or fst.st_uid == uid):
            raise _not_found(job_id)
        data = fh.read(MAX_FILE_BYTES + 1)
    source = os.path.join(directory, f"{job_id}.json")
    if len(data) > MAX_FILE_BYTES:
        raise InputError(f"larger than {MAX_FILE_BYTES} bytes", source=source)
    try:
        doc = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InputError(f"not a jobstats file: {exc}", source=source) from None
    if (not isinstance(doc, dict) or doc.get("schema") != schema_id("jobstats")
            or not isinstance(doc.get("job"), dict) or doc["job"].get("uid") != uid
            or doc["job"].get("id") != job_id):
        raise _not_found(job_id)
    try:  # the owner may have rewritten their file: a shape table() cannot read is bad input
        table(doc)
    except (KeyError, TypeError, ValueError, AttributeError, IndexError) as exc:
        raise InputError(f"not a jobstats file: {type(exc).__name__} {exc}", source=source) from None
    return doc
