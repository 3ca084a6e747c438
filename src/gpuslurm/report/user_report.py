"""The fair-share report by user or account from per-user sums (:class:`UserBuckets`; pure).

The same definitions as :func:`gpuslurm.report.compute.compute` (see its module), counted from
what Prometheus summed: allocated is each job's span in the window × its devices (the per-device
path's, exactly); unmeasured, the part of it on a device sampled only in part; used, the busy time
Prometheus gave each user, in jobs and outside them, and what nobody held, nobody's; idle, a
row's measured allocation less its use in its jobs. A job is idle by its devices' mean
utilisation while it held them, as there.
"""

from __future__ import annotations

from gpuslurm.report.prom_users import UserBuckets, as_report_data
from gpuslurm.report.rows import (
    NOBODY,
    Acc,
    Groups,
    Policy,
    Report,
    Totals,
    Who,
    finish_rows,
    overlap,
    recommendations,
)

BY_USERS = ("user", "account")


def compute_users(u: UserBuckets, by: str, policy: Policy) -> Report:
    """Rows by ``user`` or ``account`` from the window's per-user sums."""
    if by not in BY_USERS:
        raise ValueError(f"by must be one of {BY_USERS}, not {by!r}")
    data = as_report_data(u)
    spans = [data.bucket_span(b) for b in range(data.buckets)]
    hours = (u.until - u.since) / 3600.0
    capacity = u.gpus * hours
    groups = Groups(by)
    total = Acc(Who(None, None, None, None, None, None))
    in_jobs: dict[int, float] = {}  # id(acc) → its busy hours in its jobs
    jobs = {(a.node, a.job_id): a for a in u.allocations}
    for a in u.allocations:
        held_s = overlap(a.start, a.end, u.since, u.until) * len(a.devices)
        if held_s <= 0:
            continue
        acc = groups.get(Who(a.user, a.account, a.job_id, None, a.node, None))
        job = (a.node, a.job_id)
        unmeasured_s = min(u.unmeasured_s.get(job, 0.0), held_s)
        measured_s, mean = held_s - unmeasured_s, u.job_util.get(job)
        acc.jobs[job] = mean is not None and measured_s > 0 and 100.0 * mean < policy.idle_pct \
            and measured_s * (1.0 - mean) / 3600.0 >= policy.min_idle_gpu_hours
        for into in (acc, total):
            into.allocated += held_s / 3600.0
            into.unmeasured += unmeasured_s / 3600.0

    user_series: dict[str, list[float]] = {}

    def charge(who: Who, cells: dict[int, float], outside: bool) -> float:
        acc, hours_used = groups.get(who), 0.0
        series = user_series.setdefault(who.user, [0.0] * len(spans)) if who.user is not None else None
        for b, busy_s in cells.items():
            lo, hi = spans[b] if 0 <= b < len(spans) else (0.0, 0.0)
            if hi <= lo:
                continue
            hours_used += busy_s / 3600.0
            if series is not None:
                series[b] += busy_s / (hi - lo)
        acc.used += hours_used
        if outside:
            acc.outside += hours_used
            total.outside += hours_used
        else:
            in_jobs[id(acc)] = in_jobs.get(id(acc), 0.0) + hours_used
        return hours_used

    total.used = sum(busy for b, busy in u.total.items() if 0 <= b < len(spans)
                     and spans[b][1] > spans[b][0]) / 3600.0
    charged = 0.0
    for (user, account), cells in sorted(u.in_jobs.items()):
        charged += charge(Who(user or None, account or None, None, None, None, None), cells, False)
    for user, cells in sorted(u.outside.items()):
        charged += charge(Who(user or None, None, None, None, None, None), cells, True)
    rest = total.used - charged
    if rest > 1e-9 * max(total.used, 1.0):  # busy time no process and no job of anyone was on
        nobody = groups.get(Who(None, None, None, None, None, None))
        nobody.used += rest
        nobody.outside += rest
        total.outside += rest
    for acc in groups.accs.values():
        acc.idle = max(acc.allocated - acc.unmeasured - in_jobs.get(id(acc), 0.0), 0.0)
        total.idle += acc.idle

    rows = finish_rows(groups, u.violations, jobs, by, capacity, policy, data)
    totals = Totals(hours, u.gpus, capacity, total.allocated, total.used, total.idle, total.unmeasured,
                    100.0 * total.used / capacity if capacity else 0.0,
                    100.0 * total.allocated / capacity if capacity else 0.0, len(u.violations),
                    total.outside, None)
    return Report(u.source, u.since, u.until, u.step_s, by, totals, rows, recommendations(rows),
                  tuple((lo + hi) / 2 for lo, hi in spans),
                  tuple((user, tuple(s)) for user, s in sorted(user_series.items())), u.gaps)


__all__ = ["BY_USERS", "NOBODY", "compute_users"]
