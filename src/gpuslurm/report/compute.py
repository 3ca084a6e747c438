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

from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import NamedTuple, TypeVar

from gpuslurm.policy.wording import pct, tenths
from gpuslurm.report.data import AllocationSpan, Gap, GpuSeries, ProcSeries, ReportData, Sparse
from gpuslurm.samples import Violation

BY_CHOICES = ("user", "account", "job", "process")
NOBODY = "(nobody)"  # busy time with neither a process nor a job to pin it on
NO_ACCOUNT = "(no account)"
NO_JOB = "(no job)"


J_PER_KWH = 3.6e6


class Policy(NamedTuple):
    """Quotas and thresholds the report judges by (built from the config by the CLI)."""

    quota_of: Callable[[str, str | None], float]  # (user, account) → fraction of capacity, 0–1
    account_quotas: Mapping[str, float]
    busy_pct: float = 80.0  # a process above this is "hogging" (evidence lines)
    idle_pct: float = 5.0  # an allocation whose mean utilisation is below this is idle
    min_idle_gpu_hours: float = 0.25  # idle allocations smaller than this are not worth a word


class Row(NamedTuple):
    key: str  # the user, account, job id, or ``python (PID 12345, job 812)``
    user: str | None
    account: str | None
    job_id: str | None
    pid: int | None
    node: str | None
    allocated_gpu_hours: float
    used_gpu_hours: float
    idle_gpu_hours: float
    unmeasured_gpu_hours: float
    share_pct: float  # used / capacity
    quota_pct: float | None  # None: no quota applies (an account without an entry)
    over_quota: bool
    jobs: int
    idle_jobs: int
    violations: int
    rogue_processes: int  # distinct processes found running outside any job
    evidence: tuple[str, ...]
    outside_gpu_hours: float = 0.0  # of used: by processes in no job, or by nobody
    # the energy of the GPUs the row's jobs held, shared by the time each job held them (whole
    # GPUs; None: no energy known, and for process rows)
    energy_kwh: float | None = None


class Totals(NamedTuple):
    hours: float
    gpus: int  # physical GPUs seen in the window
    capacity_gpu_hours: float
    allocated_gpu_hours: float
    used_gpu_hours: float
    idle_gpu_hours: float
    unmeasured_gpu_hours: float
    utilisation_pct: float  # used / capacity
    allocated_pct: float  # allocated / capacity
    violations: int
    outside_gpu_hours: float = 0.0  # of used: outside any job
    energy_kwh: float | None = None  # every GPU's, allocated or not; None: unknown


class Report(NamedTuple):
    source: str
    since: float
    until: float
    step_s: float
    by: str
    totals: Totals
    rows: tuple[Row, ...]  # most used first
    recommendations: tuple[str, ...]
    times: tuple[float, ...]  # bucket midpoints, for charts
    user_gpus: tuple[tuple[str, tuple[float, ...]], ...]  # per user: GPUs busy on average per bucket
    gaps: tuple[Gap, ...] = ()  # a node's monitor down inside the window: its time there is unmeasured



class Who(NamedTuple):
    """Whom some GPU time belongs to; a row keeps the fields its grouping is about."""

    user: str | None
    account: str | None
    job: str | None
    pid: int | None
    node: str | None
    name: str | None


class _Acc:
    __slots__ = ("allocated", "busy_h", "energy_j", "idle", "jobs", "outside", "unmeasured", "used",
                 "violations", "who")

    def __init__(self, who: Who) -> None:
        self.who = who
        self.allocated = self.used = self.idle = self.unmeasured = self.outside = 0.0
        self.energy_j: float | None = None
        self.jobs: dict[tuple[str, str], bool] = {}  # (node, job id) → idle?
        self.busy_h: dict[str, float] = {}  # process label → hours above busy_pct
        self.violations: list[Violation] = []


class _Groups:
    """Accumulators keyed by the row they feed: user, account, job or process."""

    def __init__(self, by: str) -> None:
        self.by = by
        self.accs: dict[str, _Acc] = {}

    def key(self, w: Who) -> str:
        if self.by == "user":
            return w.user or NOBODY
        if self.by == "account":
            return w.account or (NO_ACCOUNT if w.user else NOBODY)
        if self.by == "job":
            return w.job or (NO_JOB if w.user else NOBODY)
        if w.pid is None:
            return f"(no process, job {w.job})" if w.job else NOBODY
        return _label(w.name, w.pid, w.job)

    def get(self, w: Who) -> _Acc:
        k = self.key(w)
        acc = self.accs.get(k)
        if acc is None:
            if self.by == "user":
                w = Who(w.user, None, None, None, None, None)
            elif self.by == "account":
                w = Who(None, w.account, None, None, None, None)
            elif self.by == "job":
                w = Who(w.user, w.account, w.job, None, w.node if w.job else None, None)
            acc = self.accs[k] = _Acc(w)
        return acc


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

    groups = _Groups(by)
    user_series: dict[str, list[float]] = {}
    # the totals: one computation whatever the grouping (the jobs' allocations, the devices' use)
    total = _Acc(Who(None, None, None, None, None, None))
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
                f = _overlap(a.start, a.end, lo, hi) / (hi - lo)
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
                    label = _label(p.name, p.pid, p.job_id)
                    acc.busy_h[label] = acc.busy_h.get(label, 0.0) + p.seen[b] * dur_h[b]

    for v in data.violations:
        alloc = jobs.get((v.node, v.job_id)) if v.job_id is not None else None
        groups.get(Who(v.user or (alloc.user if alloc else None), alloc.account if alloc else None,
                       v.job_id, v.pid, v.node, v.process)).violations.append(v)

    rows = tuple(sorted((_row(k, acc, by, capacity, policy, data) for k, acc in groups.accs.items()
                         if acc.allocated or acc.used or acc.violations),
                        key=lambda r: (-r.used_gpu_hours, -r.allocated_gpu_hours, r.key)))
    totals = Totals(hours, physical, capacity, total.allocated, total.used, total.idle, total.unmeasured,
                    100.0 * total.used / capacity if capacity else 0.0,
                    100.0 * total.allocated / capacity if capacity else 0.0, len(data.violations),
                    total.outside, None if total.energy_j is None else total.energy_j / J_PER_KWH)
    return Report(data.source, data.since, data.until, data.step_s, by, totals, rows,
                  _recommendations(rows), tuple((lo + hi) / 2 for lo, hi in spans),
                  tuple((u, tuple(s)) for u, s in sorted(user_series.items())), data.gaps)


def _steady_run(b: int, held_at: list[list[AllocationSpan]], present_at: list[list[ProcSeries]],
                g: GpuSeries, w: float, dur_h: list[float], spans: list[tuple[float, float]],
                whos: dict[int, Who], groups: _Groups, total: _Acc, user_series: dict[str, list[float]],
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
    label = _label(p.name, p.pid, p.job_id)
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


def _label(name: str | None, pid: int, job: str | None) -> str:
    return f"{name or 'process'} (PID {pid}, {'job ' + job if job else 'no job'})"


def _overlap(a0: float, a1: float, b0: float, b1: float) -> float:
    return max(0.0, min(a1, b1) - max(a0, b0))


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
                t = _overlap(a.start, a.end, lo, hi) * (g.cover[b] if g.cover else 1.0)
                measured += t
                busy += t * u / 100.0
        if measured and 100.0 * busy / measured < policy.idle_pct \
                and (measured - busy) / 3600.0 >= policy.min_idle_gpu_hours:
            out.add((a.node, a.job_id))
    return out


def _row(key: str, acc: _Acc, by: str, capacity: float, policy: Policy, data: ReportData) -> Row:
    w = acc.who
    share = 100.0 * acc.used / capacity if capacity else 0.0
    quota: float | None = None
    if by == "account":
        q = policy.account_quotas.get(w.account) if w.account else None
        quota = None if q is None else q * 100.0
    elif w.user is not None:
        quota = policy.quota_of(w.user, w.account) * 100.0
    over = quota is not None and share > quota + 1e-9
    merged = _merged(acc.violations, data)
    evidence = [_violation_line(v) for v in merged]
    if over and quota is not None:
        for label, h in sorted(acc.busy_h.items(), key=lambda kv: (-kv[1], kv[0])):
            evidence.append(f"{label}: {tenths(h)} h at >{pct(policy.busy_pct)} "
                            f"(expected quota: {pct(quota)})")
    rogue = len({(v.node, v.pid) for v in merged if v.kind == "rogue"})
    return Row(key, w.user, w.account, w.job, w.pid, w.node, acc.allocated, acc.used, acc.idle,
               acc.unmeasured, share, quota, over, len(acc.jobs), sum(acc.jobs.values()),
               len(merged), rogue, tuple(evidence), acc.outside,
               None if acc.energy_j is None else acc.energy_j / J_PER_KWH)


def _merged(vs: list[Violation], data: ReportData) -> list[Violation]:
    """One finding per (kind, process, device), its time clipped to the window and summed."""
    out: dict[tuple[object, ...], Violation] = {}
    for v in vs:
        k = (v.kind, v.node, v.pid, v.job_id, v.gpu_uuid, v.user)
        t = _overlap(v.start, v.start + v.duration_s, data.since, data.until)
        old = out.get(k)
        out[k] = v._replace(duration_s=t + (old.duration_s if old else 0.0),
                            start=min(v.start, old.start) if old else v.start)
    return sorted(out.values(), key=lambda v: (-v.duration_s, v.kind, v.pid or 0))


def _violation_line(v: Violation) -> str:
    hours = f"{tenths(v.duration_s / 3600)} h in the window"
    if v.evidence:  # the detector's sentence already names the process, job and GPU
        return f"{v.kind} ({hours}): {v.evidence}"
    who = (_label(v.process, v.pid, v.job_id) if v.pid is not None
           else f"job {v.job_id}" if v.job_id else v.user or "?")
    where = f" on {v.gpu_uuid}" if v.gpu_uuid else ""
    return f"{v.kind} ({hours}): {who}{where}"


def _recommendations(rows: tuple[Row, ...]) -> tuple[str, ...]:
    out: list[str] = []
    for r in rows:
        if r.key == NOBODY:
            continue
        if r.idle_jobs:
            what = "idle allocation" if r.idle_jobs == 1 else "idle allocations"
            out.append(f"{r.key}: {r.idle_jobs} {what}, {tenths(r.idle_gpu_hours)} idle GPU-hours"
                       " — ask to release GPUs or use --time")
        if r.over_quota and r.quota_pct is not None:
            out.append(f"{r.key}: used {pct(r.share_pct)} of GPU capacity against a {pct(r.quota_pct)}"
                       " quota — lower its priority or cap its GPUs (gpuslurm throttle)")
        if r.rogue_processes:
            n = r.rogue_processes
            out.append(f"{r.key}: {n} GPU process{'es' if n > 1 else ''} outside any job"
                       " — stop them; GPU work goes through the scheduler (sbatch/srun, qsub)")
    return tuple(out)
