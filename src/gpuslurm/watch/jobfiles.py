"""The monitor leaves each job's ``jobstats`` figures for the job's owner: ``<dir>/<job>.json``,
root's, mode 0400 plus a POSIX access ACL that lets the job's uid read it (the kernel shows the
ACL's mask as the group bits: 0440), in a directory root owns and alone writes (0755), so the
owner reads their own jobs' figures without reading the root-only store, and nobody else's. The
file stays root's so its reader cannot ``chmod`` it writable and fill root's state partition
between two rewrites, nor renew its modification time.

A file system that takes no ACL (ENOTSUP: ramfs, some NFS exports, a mount with ``noacl``)
gets no files: one warning names the cause, and the figures stay in the store for root, the
admin groups and ``--source prometheus:URL`` (docs/jobstats.md says why this refuses rather
than giving the file to its owner).

A running job's file is rewritten every ``interval_s``; the last one when its allocation ends.
Each write is a new file renamed over the old (safedir.replace_at: created exclusively, never
through a symlink, its ACL set before the rename). A failure is the monitor's warning, never its
stop: the figures are a view.

Retention: at most once an hour the monitor removes the files (and a crash's temporaries) of jobs
not running now whose last write is older than ``keep_s`` (``[jobstats] keep_days``). It only
unlinks, relative to the directory's descriptor (opened component by component without following
a symlink): never opens, follows or reads an entry, so whatever sits at a file's name (a symlink,
a FIFO, left from a time the directory was writable) is removed as a name and what it points to
is untouched; a directory there stays. Only names the monitor writes (``<job id>.json``,
``.<job id>.json.<pid>.tmp``) are touched. The age is the entry's own modification time
(``lstat``), which only root can set on root's files; an entry that is not root's (a file an
older monitor gave its job's owner, whose time the owner renews at will, or anything planted)
has no age to trust and goes at the first sweep once its job is not running.
"""
from __future__ import annotations

import errno
import json
import os
import stat
import time
from collections.abc import Callable

from gpuslurm.errors import GpuslurmError
from gpuslurm.jobid import valid_job_id
from gpuslurm.report.jobstats import Settings, compute, to_json
from gpuslurm.safedir import open_dir, replace_at
from gpuslurm.samples import Cycle
from gpuslurm.state.store import Store

FILE_MODE = 0o400  # and the job owner's read through the ACL: the kernel shows 0440
NO_ACL = (errno.ENOTSUP, errno.EOPNOTSUPP)
DIR_MODE = 0o755
MAX_ENDED = 10_000  # jobs remembered as written, so an ended one is written once
SWEEP_EVERY_S = 3600.0  # old files are looked for this often
MAX_SWEEP = 200_000  # entries looked at in one sweep: a year of a busy node's jobs


class JobFiles:
    """Call with each stored cycle (the Monitor's ``jobfiles`` part)."""

    def __init__(self, directory: str, store: Store, settings: Settings, *, interval_s: float = 300.0,
                 keep_s: float = 30 * 86400.0, warn: Callable[[str], None] = lambda message: None,
                 clock: Callable[[], float] = time.time) -> None:
        self.directory = directory
        self.store = store
        self.settings = settings
        self.interval_s = interval_s
        self.keep_s = keep_s  # 0: files are never removed
        self.warn = warn
        self.clock = clock  # files' ages are wall-clock ages, whatever time a replayed cycle has
        self._written: dict[str, float] = {}  # running jobs: when their file was last written
        self._swept = -SWEEP_EVERY_S
        self._told_no_acl = False

    def __call__(self, cycle: Cycle) -> None:
        now = cycle.ts
        current = {a.job_id for a in cycle.allocations}
        ended = [j for j in self._written if j not in current]
        due = [j for j in sorted(current) if now - self._written.get(j, -self.interval_s) >= self.interval_s]
        wall = self.clock()
        sweep = self.keep_s > 0 and not wall - self._swept < SWEEP_EVERY_S
        if not due and not ended and not sweep:
            return
        if sweep:  # tried once an hour, whether the directory opens or not (no warning each cycle)
            self._swept = wall
        dfd = open_dir(self.directory, create_mode=DIR_MODE)
        assert dfd is not None
        try:
            for job in due:
                self._write(dfd, job, now, running=True)
                self._written[job] = now
            for job in ended:
                self._write(dfd, job, now, running=False)
                del self._written[job]
            if sweep:
                self.sweep(dfd, wall, current)
        finally:
            os.close(dfd)
        if len(self._written) > MAX_ENDED:
            self._written.clear()

    def _write(self, dfd: int, job: str, now: float, *, running: bool) -> None:
        if not valid_job_id(job):
            return
        try:
            record = self.store.job(job)
            if record is None:
                return
            doc = to_json(compute(record, self.settings, running=running))
            # as root the job's owner may read root's file; otherwise (the demo) it is ours alone
            reader = record.uid if os.geteuid() == 0 and record.uid != 0 else None
            replace_at(dfd, f"{job}.json", json.dumps(doc, indent=1).encode() + b"\n", FILE_MODE,
                       reader=reader, source=os.path.join(self.directory, f"{job}.json"))
        except OSError as exc:
            if exc.errno not in NO_ACL:
                self.warn(f"cannot write job {job}'s figures: {exc}")
                return
            self._drop_given(dfd, job)
            if not self._told_no_acl:
                self._told_no_acl = True
                self.warn(f"no job files written: {self.directory}'s file system takes no POSIX ACL "
                          f"({exc.strerror}), and a file given to its job's owner could fill it; "
                          "put [jobstats] dir on one that does (ext4, XFS, Btrfs, tmpfs)")
        except GpuslurmError as exc:
            self.warn(f"cannot write job {job}'s figures: {exc}")

    def _drop_given(self, dfd: int, job: str) -> None:
        """Unlink the job's file where it is not ours (an older monitor gave it to the job's owner,
        who could grow it): with no ACL to write a new one, the old one must not stay theirs."""
        try:
            if os.lstat(f"{job}.json", dir_fd=dfd).st_uid != os.geteuid():
                os.unlink(f"{job}.json", dir_fd=dfd)
        except OSError:
            pass

    def sweep(self, dfd: int, now: float, running: set[str]) -> int:
        """Remove the entries of ended jobs last written more than ``keep_s`` before ``now`` from
        the directory ``dfd`` (see the module docstring); the number removed."""
        removed = 0
        with os.scandir(dfd) as entries:
            for n, entry in enumerate(entries):
                if n >= MAX_SWEEP:
                    break
                job = job_of(entry.name)
                if job is None or job in running:
                    continue
                try:
                    st = os.lstat(entry.name, dir_fd=dfd)
                    ours = st.st_uid == os.geteuid()
                    if stat.S_ISDIR(st.st_mode) or (ours and now - st.st_mtime < self.keep_s):
                        continue
                    os.unlink(entry.name, dir_fd=dfd)  # the name only, whatever it is
                    removed += 1
                except FileNotFoundError:
                    continue
                except OSError as exc:
                    self.warn(f"cannot remove job {job}'s old figures: {exc.strerror}")
        return removed


def job_of(name: str) -> str | None:
    """The job whose file (``<job>.json``) or write's temporary (``.<job>.json.<pid>.tmp``) the
    directory entry ``name`` is; None for any other name."""
    if name.startswith(".") and name.endswith(".tmp"):
        stem, _, pid = name[1:-4].rpartition(".")
        if not (pid.isascii() and pid.isdigit()):
            return None
        name = stem
    job = name[:-5] if name.endswith(".json") else ""
    return job if valid_job_id(job) else None
