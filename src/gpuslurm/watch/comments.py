"""Keep each running job's AdminComment current from the node monitor.

Slurm 22.05 refuses ``scontrol update JobId=… AdminComment=…`` once a job has finished, and the
epilog runs after that; so the monitor writes the summary while the job runs: once when it first
sees the job, then at most every ``interval_s``. The last update before the job ends is what
``scontrol show job`` and ``sacct`` keep.

Cost is bounded: one store query and one ``scontrol`` per job per interval. A failed attempt
counts as an attempt (the job waits a whole interval), and when ``scontrol`` cannot be run at all
(missing, timed out) the round stops and the other due jobs wait an interval too, so an
unreachable slurmctld costs at most one timeout per interval.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING

from gpuslurm.errors import CommandError, GpuslurmError
from gpuslurm.samples import Allocation, ScanProblem

if TYPE_CHECKING:
    from gpuslurm.state.store import GpuStats

PROBLEM_KIND = "admin-comment"

# (uuids, since, until) → per-device figures (state.store.Store.gpu_stats)
StatsFn = Callable[[Sequence[str], float, float], Mapping[str, "GpuStats"]]
# (GPU count, figures) → the line (hooks.epilog.admin_comment)
TextFn = Callable[[int, Sequence["GpuStats"]], str]
SendFn = Callable[[str, str], object]  # (job id, line) → sets it, raises GpuslurmError on failure


class CommentUpdater:
    """Decides which jobs' AdminComment is due and updates them; see the module docstring."""

    def __init__(self, interval_s: float, *, stats: StatsFn, text: TextFn, send: SendFn,
                 finished: Callable[[GpuslurmError], bool] = lambda exc: False) -> None:
        self.interval_s = interval_s
        self.stats = stats
        self.text = text
        self.send = send
        self.finished = finished  # Slurm refused because the job ended: not a problem
        self.tried: dict[str, float] = {}  # job id → time of the last attempt

    def due(self, now: float, allocations: Sequence[Allocation]) -> list[Allocation]:
        """The allocations to update now: jobs not seen before, or last tried ``interval_s`` ago.

        Jobs that are no longer allocated are forgotten, so the record cannot grow.
        """
        current = {a.job_id for a in allocations}
        self.tried = {j: t for j, t in self.tried.items() if j in current}
        out: dict[str, Allocation] = {}
        for a in allocations:
            last = self.tried.get(a.job_id)
            if (last is None or now - last >= self.interval_s) and a.job_id not in out:
                out[a.job_id] = a
        return list(out.values())

    def update(self, now: float, allocations: Sequence[Allocation]) -> tuple[ScanProblem, ...]:
        """Update the due jobs; what failed, as problems (never raised)."""
        due = self.due(now, allocations)
        problems: list[ScanProblem] = []
        for i, a in enumerate(due):
            self.tried[a.job_id] = now
            try:
                figures = self.stats(a.uuids, a.start, now)
            except GpuslurmError as exc:  # keep the last comment rather than write "no monitor data"
                problems.append(ScanProblem(now, PROBLEM_KIND, a.job_id, f"cannot read the store: {exc}"))
                continue
            try:
                self.send(a.job_id, self.text(len(a.uuids), list(figures.values())))
            except GpuslurmError as exc:
                if self.finished(exc):
                    continue
                detail = str(exc)
                if isinstance(exc, CommandError) and exc.returncode is None and i + 1 < len(due):
                    rest = due[i + 1:]
                    for r in rest:
                        self.tried[r.job_id] = now
                    detail += f"; {len(rest)} other job(s) wait until the next interval"
                    problems.append(ScanProblem(now, PROBLEM_KIND, a.job_id, detail))
                    break
                problems.append(ScanProblem(now, PROBLEM_KIND, a.job_id, detail))
        return tuple(problems)
