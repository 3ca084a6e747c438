"""Idle allocations: a job's GPU at or below a utilisation threshold over a sliding window (pure)."""

from __future__ import annotations

from gpuslurm.config import IdleDetect
from gpuslurm.policy.series import EPS, Series, judged
from gpuslurm.policy.usage import CycleView
from gpuslurm.policy.wording import name_proc, pct, span
from gpuslurm.samples import Allocation, Cycle, ProcSample, Violation


class _Entry:
    __slots__ = ("last_proc", "series", "start")

    def __init__(self, ts: float) -> None:
        self.series = Series(ts)
        self.last_proc: float | None = None  # when a process of the job was last on the device
        self.start: float | None = None  # when the current idle violation began


class IdleTracker:
    """One window per (job, device) the job was given; forgotten when the job leaves the node."""

    def __init__(self, cfg: IdleDetect, keep_s: float) -> None:
        self._cfg = cfg
        self.keep_s = keep_s  # the longest window any mode uses
        self._state: dict[tuple[str, str], _Entry] = {}

    def update(self, cycle: Cycle, v: CycleView, threshold: float, window: float,
               note: str) -> list[Violation]:
        ts, cfg = cycle.ts, self._cfg
        held = {g.mig_uuid or g.gpu_uuid: g.mem_used_mib for g in cycle.gpus}
        found: list[Violation] = []
        state: dict[tuple[str, str], _Entry] = {}
        for alloc in cycle.allocations:
            for dev in dict.fromkeys(alloc.uuids):  # a device listed twice is one device
                key = (alloc.job_id, dev)
                entry = self._state.get(key)
                if entry is None:
                    entry = _Entry(ts)
                state[key] = entry
                entry.series.add(ts, v.util.get(dev))  # a device the cycle lost is unknown
                entry.series.trim(ts - self.keep_s - EPS)
                mine = _job_proc(alloc.job_id, v.procs_on.get(dev))
                if mine is not None:
                    entry.last_proc = ts
                mean = None
                if ts - alloc.start >= cfg.grace_s - EPS:
                    mean = judged(entry.series, ts, window, cfg.min_samples, cfg.min_coverage)
                mem = held.get(dev)
                holds = mem is not None and mem >= cfg.held_min_mib
                if mean is None or mean > threshold + EPS or (holds and cfg.held_memory == "busy"):
                    entry.start = None
                    continue
                if entry.start is None:
                    entry.start = max(ts - window, alloc.start)
                found.append(_violation(cycle, alloc, dev, mine, entry, mean, threshold, window, note,
                                        mem if holds else None))
        self._state = state  # ended jobs are forgotten
        return found

    def samples(self) -> int:
        return sum(len(e.series) for e in self._state.values())

    def __len__(self) -> int:
        return len(self._state)


def _job_proc(job_id: str, procs: list[ProcSample] | None) -> ProcSample | None:
    for p in procs or ():
        if p.job_id == job_id:
            return p
    return None


def _violation(cycle: Cycle, alloc: Allocation, dev: str, proc: ProcSample | None, entry: _Entry,
               mean: float, threshold: float, window: float, note: str,
               held_mib: float | None = None) -> Violation:
    assert entry.start is not None
    duration = cycle.ts - entry.start
    if proc is not None:
        who = f"; {name_proc(proc)} is on it"
    elif entry.last_proc is None or entry.last_proc < cycle.ts - window:
        who = "; no process of the job ran on it in that time"
    else:
        who = ""
    memory = "" if held_mib is None else f", holding {held_mib / 1024:.1f} GiB of its memory"
    evidence = (f"job {alloc.job_id} of {alloc.user} holds {dev} at {pct(mean)} on average over the "
                f"last {span(window)}{memory} (idle at or below {pct(threshold)}{note}){who}")
    return Violation("idle", cycle.node, alloc.user, alloc.job_id, proc.pid if proc else None,
                     proc.name if proc else None, dev, entry.start, duration, evidence)
