"""Rogue processes: on a GPU, but in no job or in a job that was not given that GPU (pure)."""

from __future__ import annotations

from collections.abc import Iterable

from gpuslurm.jobid import valid_sluid
from gpuslurm.policy.usage import CycleView, device_of, user_of
from gpuslurm.policy.wording import name_proc, span
from gpuslurm.samples import Cycle, ProcSample, Violation


def why_rogue(proc: ProcSample, v: CycleView) -> str | None:
    """Why the process is rogue, or None when it runs where its job may run."""
    if proc.job_id is None:
        return "it is in no job"
    if valid_sluid(proc.job_id):
        return None  # a Slurm job's cgroup whose job id is unknown: reported, never judged (watch.attribute)
    alloc = v.allocs.get(proc.job_id)
    if alloc is None or not alloc.uuids:
        return f"job {proc.job_id} was given no GPU on this node"
    if proc.uid is not None and proc.uid != alloc.uid:
        # a job's processes are its user's: another uid in its cgroup got there by other means
        return f"it runs as uid {proc.uid}, but job {proc.job_id} is uid {alloc.uid}'s"
    given = alloc.uuids
    if proc.gpu_uuid in given or (proc.mig_uuid is not None and proc.mig_uuid in given):
        return None
    if proc.mig_uuid is None and any(v.parent.get(u) == proc.gpu_uuid for u in given):
        return None  # the driver did not name the MIG device: it may well be the job's own
    return f"job {proc.job_id} was given {_list(given)}"


def _list(uuids: tuple[str, ...]) -> str:
    return uuids[0] if len(uuids) == 1 else ", ".join(uuids[:-1]) + " and " + uuids[-1]


class RogueTracker:
    """Remembers when each rogue (PID, device) was first seen, for as long as it stays rogue."""

    def __init__(self, exempt: tuple[str, ...]) -> None:
        self._exempt = frozenset(exempt)
        self._since: dict[tuple[int, str], float] = {}

    def update(self, cycle: Cycle, v: CycleView) -> list[Violation]:
        found: list[Violation] = []
        since: dict[tuple[int, str], float] = {}
        for proc in cycle.procs:
            why = why_rogue(proc, v)
            if why is None:
                continue
            user = user_of(proc, v.allocs)
            if user is not None and user in self._exempt:
                continue
            dev = device_of(proc)
            key = (proc.pid, dev)
            if key in since:
                continue  # listed twice by the driver: one finding
            start = since[key] = self._since.get(key, cycle.ts)
            found.append(_violation(cycle, proc, dev, user, why, start))
        self._since = since  # a process no longer rogue (or gone) is forgotten
        return found

    def adopt(self, stored: Iterable[Violation]) -> None:
        """Take the earlier start of a stored finding for a rogue (PID, device) tracked now."""
        for v in stored:
            key = (v.pid, v.gpu_uuid)
            if v.pid is not None and v.gpu_uuid is not None and key in self._since:
                self._since[(v.pid, v.gpu_uuid)] = min(self._since[(v.pid, v.gpu_uuid)], v.start)

    def __len__(self) -> int:
        return len(self._since)


def _violation(cycle: Cycle, proc: ProcSample, dev: str, user: str | None, why: str,
               start: float) -> Violation:
    duration = cycle.ts - start
    who = f" of {user}" if user is not None else ""
    evidence = f"{name_proc(proc)}{who} on {dev}, but {why} (seen for {span(duration)})"
    return Violation("rogue", cycle.node, user, proc.job_id, proc.pid, proc.name, dev, start, duration,
                     evidence, "critical")
