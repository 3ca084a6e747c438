"""The monitor leaves each job's ``jobstats`` figures for the job's owner: ``<dir>/<job>.json``,
owned by the job's uid, mode 0400, in a directory root owns and alone writes (0755), so the
owner reads their own jobs' figures without reading the root-only store, and nobody else's.

A running job's file is rewritten every ``interval_s``; the last one when its allocation ends.
Each write is a new file renamed over the old (safedir.replace_at: created exclusively, never
through a symlink; the owner may change their own file, root never reads it back). A failure is
the monitor's warning, never its stop: the figures are a view.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable

from gpuslurm.errors import GpuslurmError
from gpuslurm.jobid import valid_job_id
from gpuslurm.report.jobstats import Settings, compute, to_json
from gpuslurm.safedir import open_dir, replace_at
from gpuslurm.samples import Cycle
from gpuslurm.state.store import Store

FILE_MODE = 0o400
DIR_MODE = 0o755
MAX_ENDED = 10_000  # jobs remembered as written, so an ended one is written once


class JobFiles:
    """Call with each stored cycle (the Monitor's ``jobfiles`` part)."""

    def __init__(self, directory: str, store: Store, settings: Settings, *, interval_s: float = 300.0,
                 warn: Callable[[str], None] = lambda message: None) -> None:
        self.directory = directory
        self.store = store
        self.settings = settings
        self.interval_s = interval_s
        self.warn = warn
        self._written: dict[str, float] = {}  # running jobs: when their file was last written

    def __call__(self, cycle: Cycle) -> None:
        now = cycle.ts
        current = {a.job_id for a in cycle.allocations}
        ended = [j for j in self._written if j not in current]
        due = [j for j in sorted(current) if now - self._written.get(j, -self.interval_s) >= self.interval_s]
        if not due and not ended:
            return
        dfd = open_dir(self.directory, create_mode=DIR_MODE)
        assert dfd is not None
        try:
            for job in due:
                self._write(dfd, job, now, running=True)
                self._written[job] = now
            for job in ended:
                self._write(dfd, job, now, running=False)
                del self._written[job]
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
            # as root the file is given to the job's owner; otherwise (the demo) it stays ours
            replace_at(dfd, f"{job}.json", json.dumps(doc, indent=1).encode() + b"\n", FILE_MODE,
                       owner=record.uid if os.geteuid() == 0 else None,
                       source=os.path.join(self.directory, f"{job}.json"))
        except (GpuslurmError, OSError) as exc:
            self.warn(f"cannot write job {job}'s figures: {exc}")
