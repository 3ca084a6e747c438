"""Stores written through Store.write_cycle from per-GPU timelines, and the report's invariant.

The invariant: per user and in total, used + idle GPU-hours never exceed allocated GPU-hours plus
the use outside Slurm (busy time of processes in no job, and busy time pinned on nobody).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

from gpuslurm.report.compute import NOBODY, Policy, Report, compute
from gpuslurm.report.data import ReportData
from gpuslurm.samples import Allocation, Cycle, GpuSample, ProcSample
from gpuslurm.state.store import Store

POLICY = Policy(lambda _user, _account: 1.0, {})
EPS = 1e-9

# at a time, per GPU: its utilisation, else None (not sampled); a process on it: (pid, user, job)
GpuAt = Callable[[float], float | None]
ProcAt = Callable[[float], tuple[int, str, str | None] | None]


def write_store(path: Path, times: Sequence[float], gpus: dict[str, GpuAt], procs: dict[str, ProcAt],
                allocations: Sequence[tuple[Allocation, float, float]]) -> Path:
    """One cycle at each of ``times`` with the GPUs sampled then; an allocation shows from its
    ``(first, last)`` cycle time (its ``start`` may be earlier: a job older than the monitor)."""
    with Store.open(str(path)) as store:
        for ts in times:
            gs = tuple(GpuSample(ts, uuid, util_pct=u, mem_total_mib=80000.0)
                       for uuid, f in gpus.items() if (u := f(ts)) is not None)
            sampled = {g.gpu_uuid for g in gs}
            ps = []
            for uuid, f in procs.items():
                held = f(ts)
                if held is not None and uuid in sampled:
                    pid, user, job = held
                    ps.append(ProcSample(ts, uuid, pid, name="python", uid=1000 + pid, user=user,
                                         job_id=job, mem_mib=100.0, started=1.0))
            allocs = tuple(a for a, first, last in allocations if first <= ts <= last)
            store.write_cycle(Cycle(ts, "n1", gs, tuple(ps), allocs))
    return path


def outside_slurm(data: ReportData) -> dict[str | None, float]:
    """Per user (None: nobody), the GPU-hours used outside any job."""
    out: dict[str | None, float] = {}
    for r in compute(data, "process", POLICY).rows:
        if r.job_id is None:
            out[r.user] = out.get(r.user, 0.0) + r.used_gpu_hours
    return out


def check_invariant(data: ReportData) -> Report:
    """Assert used + idle ≤ allocated + outside-Slurm for every user and in total; the by-user report."""
    report = compute(data, "user", POLICY)
    outside = outside_slurm(data)
    for r in report.rows:
        key = None if r.key == NOBODY else r.key
        bound = r.allocated_gpu_hours + outside.get(key, 0.0)
        assert r.used_gpu_hours + r.idle_gpu_hours <= bound + EPS, (r.key, r, outside)
    t = report.totals
    assert t.used_gpu_hours + t.idle_gpu_hours <= t.allocated_gpu_hours + sum(outside.values()) + EPS, \
        (t, outside)
    assert t.idle_gpu_hours >= -EPS and t.unmeasured_gpu_hours >= -EPS
    return report
