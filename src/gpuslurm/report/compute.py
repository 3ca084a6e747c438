"""The fair-share report from :class:`ReportData` (pure): GPU-hours, shares, evidence, advice.

Definitions (GPU-hours count a MIG device as its fraction of the physical GPU):

- **allocated**: the time a job held a device, clipped to the window. For ``--by process``: the
  time the process held a context on it; a process in no job held no allocation (0).
  The totals do not depend on the grouping: they are the jobs' allocations and the devices' use,
  summed once, whatever ``--by`` says.
- **used**: utilisation-weighted time. A device's busy time in a bucket (its mean utilisation ×
  the covered part of the bucket) goes to the processes seen on it: when all of them report an SM
  utilisation, each its own busy time (seen × utilisation, at most the device's); else as much as
  they could have been busy (the time one was seen, at 100 %), by the time each was seen; the
  rest, to the jobs holding it (each for the part of the bucket it held, and never more than that
  part less its own processes' busy time: a bucket's load is not spread evenly); with neither, or
  what is left, to nobody
  (it still counts in the totals). So the rows add up to the total, and a process outside any job
  shows up as use without allocation.
- **idle**: allocated time during which the device was not busy: the measured part of the
  allocation in a bucket less the device's busy time in that bucket (allocation × (1 −
  utilisation) for a bucket it holds whole), never below 0. So used + idle never exceeds
  allocated + the use outside any job, per row and in total.
- **outside jobs**: used time of processes in no job (and busy time nobody held): use without
  an allocation. A row whose used exceeds its allocated shows it here.
- **unmeasured**: allocated time with no utilisation sample: neither idle nor used (a node's
  monitor down inside the window is also named, as a gap: ``ReportData.gaps``). A bucket the
  monitor sampled only in part (``GpuSeries.cover``) is measured for that part only: its mean
  utilisation makes busy and idle time of the covered part, the rest is unmeasured.
- **share**: used GPU-hours over the capacity of the window (physical GPUs × hours), against the
  quota ``[detect.share]`` gives (a fraction of the same capacity).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import TypeVar

from gpuslurm.report.data import AllocationSpan, GpuSeries, ProcSeries, ReportData, Sparse
from gpuslurm.report.rows import (
    BY_CHOICES,
    J_PER_KWH,
    NO_ACCOUNT,
    NO_JOB,
    NOBODY,
    Acc,
    Groups,
    Policy,
    Report,
    Row,
    Totals,
    Who,
    finish_rows,
    overlap,
    proc_label,
    recommendations,
)

__all__ = ["BY_CHOICES", "NOBODY", "NO_ACCOUNT", "NO_JOB", "Policy", "Report", "Row", "Totals", "compute",
           "physical_gpus"]


def physical_gpus(data: ReportData) -> int:
    """The physical GPUs the window saw: the capacity a share (and a quota) is a fraction of."""
    return len({(g.node, g.gpu_uuid) for g in data.gpus})

def compute(data: ReportData, by: str, policy: Policy) -> Report:
    """Turn the window's series into rows grouped ``by`` user, account, job or process."""
    if by not in BY_CHOICES:
        raise ValueError(f"by must be one of {BY_CHOICES}, not {by!r}")
    n = data.buckets
    spans = [data.bucket_span(i) for i in range(n)]
    dur_h = [(hi - lo) / 3600.0 for lo, hi in spans]
    hours = (data.until - data.since) / 3600.0
    jobs = {(a.node, a.job_id): a for a in data.allocations}

    # a GPU split into MIG devices is measured through its MIG devices, not twice
    migs: dict[tuple[str, str], int] = {}
    for g in data.gpus:
        if g.uuid != g.gpu_uuid:
            migs[(g.node, g.gpu_uuid)] = migs.get((g.node, g.gpu_uuid), 0) + 1
    physical = physical_gpus(data)
    capacity = physical * hours

    procs_on: dict[tuple[str, str], list[ProcSeries]] = {}
    for p in data.procs:
        procs_on.setdefault((p.node, p.device), []).append(p)
    allocs_on: dict[tuple[str, str], list[AllocationSpan]] = {}
    for a in data.allocations:
        for d in a.devices:
            allocs_on.setdefault((a.node, d), []).append(a)
    idle_jobs = _idle_jobs(data, policy)

    def who_of(p: ProcSeries) -> Who:
        alloc = jobs.get((p.node, p.job_id)) if p.job_id is not None else None
        user = p.user or (alloc.user if alloc else None) or (str(p.uid) if p.uid is not None else None)
        return Who(user, alloc.account if alloc else None, p.job_id, p.pid, p.node, p.name)

    groups = Groups(by)
    user_series: dict[str, list[float]] = {}
    # the totals: one computation whatever the grouping (the jobs' allocations, the devices' use)
    total = Acc(Who(None, None, None, None, None, None))
    for g in data.gpus:
        dev = (g.node, g.uuid)
        if g.uuid == g.gpu_uuid and dev in migs:
            continue
        w = 1.0 / migs[(g.node, g.gpu_uuid)] if g.uuid != g.gpu_uuid else 1.0
        on = procs_on.get(dev, [])
        whos = {id(p): who_of(p) for p in on}
        held_at = list(_sweep(allocs_on.get(dev, []), [_bucket_range(data, a.start, a.end)
                                                        for a in allocs_on.get(dev, [])], n))
        present_at = list(_sweep(on, [_seen_range(p.seen) for p in on], n))
        skip = 0  # buckets before this one were counted in a steady run
        for b in range(n):
            if b < skip or not dur_h[b]:
                continue
            held = held_at[b]
            lo, hi = spans[b]
            util = g.util[b]
            present = [p for p in present_at[b] if p.seen[b] > 0]
            if STEADY and len(held) == 1 and len(present) == 1 and by != "process" and util is not None \
                    and util <= 100.0 and g.uuid == g.gpu_uuid \
                    and _steady(held[0], present[0], whos[id(present[0])], b, lo, hi):
                # the common bucket, as the general path below counts it without its lists: one
                # job holds all of it, one of its processes (or its count series) was seen
                # throughout without an SM figure, so the busy time is that process's; and the run
                # of such buckets after it, with the same job and process, in one go (the same
                # sums in the same order: the same bits)
                skip = _steady_run(b, held_at, present_at, g, w, dur_h, spans, whos, groups, total,
                                   user_series, idle_jobs, policy)
                continue
            if util is None and g.uuid != g.gpu_uuid:
                util = _mig_util(present, b)
            cover = g.cover[b] if g.cover else 1.0
            energy = g.energy_j[b] if g.energy_j else None
            if energy is not None:
                total.energy_j = (total.energy_j or 0.0) + energy
            busy = None if util is None else util / 100.0 * cover * dur_h[b] * w
            overlaps: list[tuple[AllocationSpan, float]] = []
            for a in held:
                f = overlap(a.start, a.end, lo, hi) / (hi - lo)
                if f <= 0:
                    continue
                overlaps.append((a, f))
                acc = groups.get(Who(a.user, a.account, a.job_id, None, a.node, None))
                acc.jobs[(a.node, a.job_id)] = (a.node, a.job_id) in idle_jobs
                gh = f * dur_h[b] * w
                # a process row holds what its process held (below); a job none of whose processes
                # is there keeps its row "(no process, job …)", whoever else is on the device
                own = by == "process" and any(whos[id(p)].job == a.job_id for p in present)
                if energy is not None and by != "process":
                    acc.energy_j = (acc.energy_j or 0.0) + energy * f
                for into in (total,) if own else (total, acc):
                    into.allocated += gh
                    if util is None:
                        into.unmeasured += gh
                    else:
                        measured = gh * cover  # its busy time cannot exceed the device's in the bucket
                        into.idle += measured - min(measured, busy if busy is not None else 0.0)
                        into.unmeasured += gh - measured
            if util is None or busy is None:
                if by == "process":
                    for p in present:
                        if whos[id(p)].job is None:
                            continue  # in no job: it held no allocation
                        acc = groups.get(whos[id(p)])
                        acc.allocated += p.seen[b] * dur_h[b] * w
                        acc.unmeasured += p.seen[b] * dur_h[b] * w
                continue
            total.used += busy
            for who, seen, frac in _split(present, whos, overlaps, b, util):
                acc = groups.get(who)
                acc.used += busy * frac
                if who.job is None:
                    acc.outside += busy * frac
                    total.outside += busy * frac
                if who.user is not None:
                    user_series.setdefault(who.user, [0.0] * n)[b] += busy * frac / dur_h[b]
                if by == "process" and seen > 0 and who.job is not None:
                    held_h = seen * dur_h[b] * w
                    acc.allocated += held_h
                    acc.idle += max(held_h * cover - busy * frac, 0.0)
                    acc.unmeasured += held_h * (1.0 - cover)
            for p in present:  # hours a process kept its device busier than busy_pct
                mine = p.util[b]
                if (mine if mine is not None else util / len(present)) > policy.busy_pct:
                    acc = groups.get(whos[id(p)])
                    label = proc_label(p.name, p.pid, p.job_id)
                    acc.busy_h[label] = acc.busy_h.get(label, 0.0) + p.seen[b] * dur_h[b]

    rows = finish_rows(groups, data.violations, jobs, by, capacity, policy, data)
    totals = Totals(hours, physical, capacity, total.allocated, total.used, total.idle, total.unmeasured,
                    100.0 * total.used / capacity if capacity else 0.0,
                    100.0 * total.allocated / capacity if capacity else 0.0, len(data.violations),
                    total.outside, None if total.energy_j is None else total.energy_j / J_PER_KWH)
    return Report(data.source, data.since, data.until, data.step_s, by, totals, rows,
                  recommendations(rows), tuple((lo + hi) / 2 for lo, hi in spans),
                  tuple((u, tuple(s)) for u, s in sorted(user_series.items())), data.gaps)


def _steady_run(b: int, held_at: list[list[AllocationSpan]], present_at: list[list[ProcSeries]],
                g: GpuSeries, w: float, dur_h: list[float], spans: list[tuple[float, float]],
                whos: dict[int, Who], groups: Groups, total: Acc, user_series: dict[str, list[float]],
                idle_jobs: set[tuple[str, str]], policy: Policy) -> int:
    """Count the steady bucket ``b`` and those after it with the same single job and process
    (see compute); the first bucket after the run."""
    a, p = held_at[b][0], next(q for q in present_at[b] if q.seen[b] > 0)
    who = whos[id(p)]
    acc = groups.get(Who(a.user, a.account, a.job_id, None, a.node, None))
    acc.jobs[(a.node, a.job_id)] = (a.node, a.job_id) in idle_jobs
    mine_acc = groups.get(who)
    n = len(dur_h)
    series = user_series.setdefault(who.user, [0.0] * n) if who.user is not None else None
    label = proc_label(p.name, p.pid, p.job_id)
    while True:
        util = g.util[b]
        util = 0.0 if util is None else util  # never: checked before the bucket joins the run
        cover = g.cover[b] if g.cover else 1.0
        steady_busy = util / 100.0 * cover * dur_h[b] * w
        gh = 1.0 * dur_h[b] * w
        measured = gh * cover
        for into in (total, acc):
            into.allocated += gh
            into.idle += measured - min(measured, steady_busy)
            into.unmeasured += gh - measured
        total.used += steady_busy
        mine_acc.used += steady_busy * 1.0
        if series is not None:
            series[b] += steady_busy * 1.0 / dur_h[b]
        if util > policy.busy_pct:
            mine_acc.busy_h[label] = mine_acc.busy_h.get(label, 0.0) + p.seen[b] * dur_h[b]
        b += 1
        # what compute checks of a bucket before this path, less what holds for the whole run
        # (the device, the grouping, the job and node of ``who``)
        if b >= n or not dur_h[b] or len(held_at[b]) != 1 or held_at[b][0] is not a:
            return b
        nxt, (lo, hi) = g.util[b], spans[b]
        if nxt is None or nxt > 100.0 or not (a.start <= lo and a.end >= hi) or p.util[b] is not None \
                or not p.seen[b] >= 1.0 or any(q is not p and q.seen[b] > 0 for q in present_at[b]):
            return b


T = TypeVar("T")


def _sweep(items: Sequence[T], ranges: Sequence[tuple[int, int]], n: int) -> Iterator[list[T]]:
    """Per bucket, the items whose bucket range ``[first, last]`` covers it (one pass, not n × items)."""
    order = sorted(range(len(items)), key=lambda i: ranges[i][0])
    active: list[int] = []
    j = 0
    for b in range(n):
        while j < len(order) and ranges[order[j]][0] <= b:
            active.append(order[j])
            j += 1
        if active:
            active = [i for i in active if ranges[i][1] >= b]
        yield [items[i] for i in active]


def _bucket_range(data: ReportData, t0: float, t1: float) -> tuple[int, int]:
    last = data.buckets - 1
    lo = int((max(t0, data.since) - data.start) // data.step_s)
    hi = int((min(t1, data.until) - data.start) // data.step_s)
    return max(lo, 0), min(hi, last)


STEADY = True  # count the common bucket without the general path's lists (tests compare both)


def _steady(a: AllocationSpan, p: ProcSeries, who: Who, b: int, lo: float, hi: float) -> bool:
    return a.start <= lo and a.end >= hi and who.job == a.job_id and who.node == a.node \
        and p.seen[b] >= 1.0 and p.util[b] is None


def _seen_range(seen: Sequence[float]) -> tuple[int, int]:
    if isinstance(seen, Sparse):  # only the buckets where it lives
        hits = [seen.first + i for i, s in enumerate(seen.values) if s]
        return (hits[0], hits[-1]) if hits else (len(seen), -1)
    hits = [i for i, s in enumerate(seen) if s]
    return (hits[0], hits[-1]) if hits else (len(seen), -1)




def _mig_util(present: list[ProcSeries], b: int) -> float | None:
    """NVML gives MIG devices no utilisation: no process means 0 %, else their SM utilisation."""
    total = 0.0
    for p in present:
        u = p.util[b]
        if u is None:
            return None
        total += u
    return min(total, 100.0)


def _split(present: list[ProcSeries], whos: dict[int, Who], overlaps: list[tuple[AllocationSpan, float]],
           b: int, util: float) -> list[tuple[Who, float, float]]:
    """Who a device's busy time in bucket ``b`` belongs to: (who, seen, fraction), fractions sum to 1."""
    out: list[tuple[Who, float, float]] = []
    rest = 1.0
    if present:
        weights = [p.seen[b] * u for p in present if (u := p.util[b]) is not None]
        if len(weights) == len(present) and util > 0:
            # their own busy time (seen × SM utilisation), at most the device's; all of them at
            # 0 % is a reading too (the device's busy time was someone else's), not "unknown"
            fracs = [wt / util for wt in weights]
            scale = max(sum(fracs), 1.0)
            fracs = [f / scale for f in fracs]
        else:  # as much as they could have been busy (seen at 100 %), by how long each was seen
            weights = [p.seen[b] for p in present]
            part = min(max(weights), 1.0)
            most = 1.0 if util <= 0 else min(part * 100.0 / util, 1.0)
            fracs = [most * wt / sum(weights) for wt in weights]
        out = [(whos[id(p)], p.seen[b], f) for p, f in zip(present, fracs, strict=True)]
        rest = 1.0 - sum(fracs)
    if overlaps and rest > 1e-12:  # each job its part of the rest; what no job held is nobody's
        total = max(sum(f for _, f in overlaps), 1.0)
        left = rest
        for a, f in overlaps:
            # never more than the job held: its part of the bucket (f, in units of the device's
            # busy time f / util) less what its own processes were already given
            own = sum(frac for (who, _, frac) in out if who.job == a.job_id and who.node == a.node)
            part = rest * f / total
            if util > 0:
                part = min(part, max(f * 100.0 / util - own, 0.0))
            out.append((Who(a.user, a.account, a.job_id, None, a.node, None), 0.0, part))
            left -= part
        rest = max(left, 0.0)
    if rest > 1e-12:
        out.append((Who(None, None, None, None, None, None), 0.0, rest))
    return out


def _idle_jobs(data: ReportData, policy: Policy) -> set[tuple[str, str]]:
    """Jobs whose devices stayed below ``idle_pct`` on average while measured, long enough to matter."""
    util_of = {(g.node, g.uuid): g for g in data.gpus}
    out: set[tuple[str, str]] = set()
    for a in data.allocations:
        measured = busy = 0.0
        b0, b1 = _bucket_range(data, a.start, a.end)
        for d in a.devices:
            g = util_of.get((a.node, d))
            if g is None:
                continue
            for b in range(b0, b1 + 1):
                u = g.util[b]
                if u is None:
                    continue
                lo, hi = data.bucket_span(b)
                t = overlap(a.start, a.end, lo, hi) * (g.cover[b] if g.cover else 1.0)
                measured += t
                busy += t * u / 100.0
        if measured and 100.0 * busy / measured < policy.idle_pct \
                and (measured - busy) / 3600.0 >= policy.min_idle_gpu_hours:
            out.add((a.node, a.job_id))
    return out
