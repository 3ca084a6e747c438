"""Over fair share: a user who keeps a GPU busy while their usage of the node is over quota (pure).

Usage is a fraction of the node's GPU capacity: the sum over the user's devices of utilisation ×
the device's fraction of a physical GPU, over the number of physical GPUs. Quotas are fractions
of the same capacity.
"""

from __future__ import annotations

from collections.abc import Mapping

from gpuslurm.config import ShareDetect
from gpuslurm.policy.series import EPS, Series, judged
from gpuslurm.policy.usage import CycleView, device_of, proc_util, user_of
from gpuslurm.policy.wording import name_proc, pct, span
from gpuslurm.samples import Cycle, ProcSample, Violation


class _Entry:
    __slots__ = ("series", "start")

    def __init__(self, ts: float) -> None:
        self.series = Series(ts)
        self.start: float | None = None


class Quotas:
    """A user's quota: users table, then Slurm's share (if configured), then accounts, then default."""

    def __init__(self, cfg: ShareDetect, shares: Mapping[str, float] | None = None) -> None:
        self._users = dict(cfg.users)
        self._accounts = dict(cfg.accounts)
        self._default = cfg.default_quota
        self._shares = shares if cfg.quota_source == "slurm" else None

    def of(self, user: str, account: str | None) -> float:
        q = self._users.get(user)
        if q is not None:
            return q
        if self._shares is not None and (s := self._shares.get(user)) is not None:
            return min(max(float(s), 0.0), 1.0)
        if account is not None and (q := self._accounts.get(account)) is not None:
            return q
        return self._default


class ShareTracker:
    """Windows per user and per (user, device); forgotten when the user leaves the device or node."""

    def __init__(self, cfg: ShareDetect, keep_s: float) -> None:
        self._cfg = cfg
        self.keep_s = keep_s
        self._users: dict[str, Series] = {}
        self._devs: dict[tuple[str, str], _Entry] = {}

    def update(self, cycle: Cycle, v: CycleView, threshold: float, duration: float,
               quotas_of: Quotas, note: str) -> list[Violation]:
        ts, cfg = cycle.ts, self._cfg
        groups: dict[tuple[str, str], list[ProcSample]] = {}
        quotas: dict[str, float] = {}
        for proc in cycle.procs:
            user = user_of(proc, v.allocs)
            if user is None:
                continue
            q = quotas.get(user)
            if q is None:
                alloc = v.allocs.get(proc.job_id) if proc.job_id is not None else None
                q = quotas[user] = quotas_of.of(user, alloc.account if alloc else None)
            if q >= 1.0 - EPS:
                continue  # nobody can use more than the whole node: no need to watch
            key = (user, device_of(proc))
            group = groups.get(key)
            if group is None:
                groups[key] = [proc]
            else:
                group.append(proc)

        usage: dict[str, float | None] = {}
        dev_util: dict[tuple[str, str], float | None] = {}
        for key, procs in groups.items():
            user, dev = key
            u = dev_util[key] = _user_on_device(procs, dev, v)
            if u is not None and v.capacity:
                usage[user] = (usage.get(user) or 0.0) + u / 100.0 * v.weight.get(dev, 1.0) / v.capacity
            else:
                usage.setdefault(user, None)

        users: dict[str, Series] = {}
        for user, frac in usage.items():
            series = users[user] = self._users.get(user) or Series(ts)
            series.add(ts, frac)
            series.trim(ts - self.keep_s - EPS)
        self._users = users

        found: list[Violation] = []
        devs: dict[tuple[str, str], _Entry] = {}
        for key, procs in groups.items():
            entry = devs[key] = self._devs.get(key) or _Entry(ts)
            entry.series.add(ts, dev_util[key])
            entry.series.trim(ts - self.keep_s - EPS)
            user = key[0]
            busy = judged(entry.series, ts, duration, cfg.min_samples, cfg.min_coverage)
            used = judged(users[user], ts, duration, cfg.min_samples, cfg.min_coverage)
            if busy is None or busy <= threshold + EPS or used is None or used <= quotas[user] + EPS:
                entry.start = None
                continue
            if entry.start is None:
                entry.start = max(ts - duration, entry.series.first)
            found.append(_violation(cycle, v, key, procs, entry.start, busy, used, quotas[user],
                                    threshold, duration, note))
        self._devs = devs
        return found

    def samples(self) -> int:
        return sum(len(s) for s in self._users.values()) + sum(len(e.series) for e in self._devs.values())

    def __len__(self) -> int:
        return len(self._users) + len(self._devs)


def _user_on_device(procs: list[ProcSample], dev: str, v: CycleView) -> float | None:
    if len(procs) == len(v.procs_on[dev]):
        return v.util.get(dev)  # the device is all theirs: its own figure is the best one
    total = 0.0
    for p in procs:
        u = proc_util(p, v)
        if u is None:
            return None
        total += u
    return min(total, 100.0)


def _violation(cycle: Cycle, v: CycleView, key: tuple[str, str], procs: list[ProcSample], start: float,
               busy: float, used: float, q: float, threshold: float, duration: float,
               note: str) -> Violation:
    user, dev = key
    top = max(procs, key=lambda p: (proc_util(p, v) or -1.0, -p.pid))
    more = f" and {len(procs) - 1} more of {user}'s processes" if len(procs) > 1 else ""
    evidence = (f"{name_proc(top)}{more} on {dev}: {pct(busy)} for {span(cycle.ts - start)}, over "
                f"{user}'s {pct(q * 100)} quota ({user} used {pct(used * 100)} of the node's GPUs over "
                f"the last {span(duration)}; hog above {pct(threshold)} for {span(duration)}{note})")
    return Violation("over-share", cycle.node, user, top.job_id, top.pid, top.name, dev, start,
                     cycle.ts - start, evidence)
