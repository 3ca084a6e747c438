"""One cycle, indexed once for every detector: devices, their utilisation, who runs where (pure).

A device is a GPU UUID, or a MIG UUID for a MIG device. Utilisation the driver did not give is
``None`` and stays unknown, except on MIG devices, for which NVML gives none: a MIG device on
which no process at all runs is 0 % busy (nothing runs on a GPU without a context), and one whose
every process reports its own SM utilisation is busy by their sum.
"""

from __future__ import annotations

from typing import NamedTuple

from gpuslurm.samples import Allocation, Cycle, ProcSample


class CycleView(NamedTuple):
    util: dict[str, float | None]  # device → utilisation % (devices the cycle sampled)
    weight: dict[str, float]  # device → its fraction of a physical GPU
    capacity: int  # physical GPUs on the node
    parent: dict[str, str]  # MIG UUID → its GPU's UUID
    allocs: dict[str, Allocation]  # job id → allocation
    procs_on: dict[str, list[ProcSample]]  # device → processes on it


def device_of(proc: ProcSample) -> str:
    return proc.mig_uuid or proc.gpu_uuid


def user_of(proc: ProcSample, allocs: dict[str, Allocation]) -> str | None:
    """The process's user name, else its job's, else its uid as text; None if nothing is known."""
    if proc.user:
        return proc.user
    if proc.job_id is not None and (alloc := allocs.get(proc.job_id)) is not None:
        return alloc.user
    return str(proc.uid) if proc.uid is not None else None


def view(cycle: Cycle) -> CycleView:
    """Index a cycle once: O(GPUs + processes)."""
    procs_on: dict[str, list[ProcSample]] = {}
    for proc in cycle.procs:
        dev = proc.mig_uuid or proc.gpu_uuid
        lst = procs_on.get(dev)
        if lst is None:
            procs_on[dev] = [proc]
        else:
            lst.append(proc)
    troubled = {p.subject for p in cycle.problems}
    parent: dict[str, str] = {}
    migs_of: dict[str, int] = {}
    gpus: set[str] = set()
    util: dict[str, float | None] = {}
    for g in cycle.gpus:
        gpus.add(g.gpu_uuid)
        dev = g.gpu_uuid
        if g.mig_uuid is not None:
            dev = parent_dev = g.mig_uuid
            parent[parent_dev] = g.gpu_uuid
            migs_of[g.gpu_uuid] = migs_of.get(g.gpu_uuid, 0) + 1
        if g.util_pct is not None or g.mig_uuid is None:
            util[dev] = g.util_pct  # a whole GPU without a figure is a failed query: unknown
        else:  # NVML gives most MIG devices no utilisation at all; infer what can be inferred
            util[dev] = _inferred(dev, g.gpu_uuid, procs_on, troubled)
    weight = {dev: 1.0 / migs_of[parent[dev]] if dev in parent else 1.0 for dev in util}
    return CycleView(util, weight, len(gpus), parent, {a.job_id: a for a in cycle.allocations}, procs_on)


def _inferred(dev: str, gpu: str, procs_on: dict[str, list[ProcSample]], troubled: set[str]) -> float | None:
    if dev in troubled or gpu in troubled:
        return None  # the scan of this device went wrong: its process list may be incomplete
    procs = procs_on.get(dev)
    if not procs:
        return 0.0
    total = 0.0
    for p in procs:
        if p.sm_util_pct is None:
            return None
        total += p.sm_util_pct
    return min(total, 100.0)


def proc_util(proc: ProcSample, v: CycleView) -> float | None:
    """One process's share of its device: its own SM utilisation, else an even split."""
    if proc.sm_util_pct is not None:
        return proc.sm_util_pct
    dev = proc.mig_uuid or proc.gpu_uuid
    u = v.util.get(dev)
    return None if u is None else u / len(v.procs_on[dev])
