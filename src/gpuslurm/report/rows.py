"""The fair-share report's values and rows: policy, rows, totals, and a row's evidence and advice.

What a report is (its definitions: :mod:`gpuslurm.report.compute`), shared by the per-device
computation and the per-user one from Prometheus' aggregates (:mod:`gpuslurm.report.prom_users`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import NamedTuple

from gpuslurm.policy.wording import pct, tenths
from gpuslurm.report.data import AllocationSpan, Gap, ReportData
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


class Acc:
    __slots__ = ("allocated", "busy_h", "energy_j", "idle", "jobs", "outside", "unmeasured", "used",
                 "violations", "who")

    def __init__(self, who: Who) -> None:
        self.who = who
        self.allocated = self.used = self.idle = self.unmeasured = self.outside = 0.0
        self.energy_j: float | None = None
        self.jobs: dict[tuple[str, str], bool] = {}  # (node, job id) → idle?
        self.busy_h: dict[str, float] = {}  # process label → hours above busy_pct
        self.violations: list[Violation] = []


class Groups:
    """Accumulators keyed by the row they feed: user, account, job or process."""

    def __init__(self, by: str) -> None:
        self.by = by
        self.accs: dict[str, Acc] = {}

    def key(self, w: Who) -> str:
        if self.by == "user":
            return w.user or NOBODY
        if self.by == "account":
            return w.account or (NO_ACCOUNT if w.user else NOBODY)
        if self.by == "job":
            return w.job or (NO_JOB if w.user else NOBODY)
        if w.pid is None:
            return f"(no process, job {w.job})" if w.job else NOBODY
        return proc_label(w.name, w.pid, w.job)

    def get(self, w: Who) -> Acc:
        k = self.key(w)
        acc = self.accs.get(k)
        if acc is None:
            if self.by == "user":
                w = Who(w.user, None, None, None, None, None)
            elif self.by == "account":
                w = Who(None, w.account, None, None, None, None)
            elif self.by == "job":
                w = Who(w.user, w.account, w.job, None, w.node if w.job else None, None)
            acc = self.accs[k] = Acc(w)
        return acc


def proc_label(name: str | None, pid: int, job: str | None) -> str:
    return f"{name or 'process'} (PID {pid}, {'job ' + job if job else 'no job'})"


def overlap(a0: float, a1: float, b0: float, b1: float) -> float:
    return max(0.0, min(a1, b1) - max(a0, b0))


def make_row(key: str, acc: Acc, by: str, capacity: float, policy: Policy, data: ReportData) -> Row:
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


def finish_rows(groups: Groups, violations: Sequence[Violation],
                jobs: Mapping[tuple[str, str], AllocationSpan], by: str, capacity: float,
                policy: Policy, data: ReportData) -> tuple[Row, ...]:
    """Each finding to its row (the job's user and account where it names a job), then the rows
    that hold anything, busiest first: the last step of both fair-share computations."""
    for v in violations:
        alloc = jobs.get((v.node, v.job_id)) if v.job_id is not None else None
        groups.get(Who(v.user or (alloc.user if alloc else None), alloc.account if alloc else None,
                       v.job_id, v.pid, v.node, v.process)).violations.append(v)
    return tuple(sorted((make_row(k, acc, by, capacity, policy, data) for k, acc in groups.accs.items()
                         if acc.allocated or acc.used or acc.violations),
                        key=lambda r: (-r.used_gpu_hours, -r.allocated_gpu_hours, r.key)))


def _merged(vs: list[Violation], data: ReportData) -> list[Violation]:
    """One finding per (kind, process, device), its time clipped to the window and summed."""
    out: dict[tuple[object, ...], Violation] = {}
    for v in vs:
        k = (v.kind, v.node, v.pid, v.job_id, v.gpu_uuid, v.user)
        t = overlap(v.start, v.start + v.duration_s, data.since, data.until)
        old = out.get(k)
        out[k] = v._replace(duration_s=t + (old.duration_s if old else 0.0),
                            start=min(v.start, old.start) if old else v.start)
    return sorted(out.values(), key=lambda v: (-v.duration_s, v.kind, v.pid or 0))


def _violation_line(v: Violation) -> str:
    hours = f"{tenths(v.duration_s / 3600)} h in the window"
    if v.evidence:  # the detector's sentence already names the process, job and GPU
        return f"{v.kind} ({hours}): {v.evidence}"
    who = (proc_label(v.process, v.pid, v.job_id) if v.pid is not None
           else f"job {v.job_id}" if v.job_id else v.user or "?")
    where = f" on {v.gpu_uuid}" if v.gpu_uuid else ""
    return f"{v.kind} ({hours}): {who}{where}"


def recommendations(rows: tuple[Row, ...]) -> tuple[str, ...]:
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
