"""The detector engine: cycles in, in time order; the violations current after each one out (pure).

No clock and no I/O: time is the cycles' ``ts``. One ``Detector`` watches one node. Its memory is
bounded by the jobs, processes and users present now times the longest window: a job that left,
a PID that exited, a user with no process any more are forgotten in the cycle they disappear.
A cycle not newer than the last one (a replay overlapping live data) is ignored.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from gpuslurm.config import DetectConfig
from gpuslurm.policy.defensive import HogWindows, Thresholds, thresholds
from gpuslurm.policy.idle import IdleTracker
from gpuslurm.policy.rogue import RogueTracker
from gpuslurm.policy.share import Quotas, ShareTracker
from gpuslurm.policy.usage import view
from gpuslurm.samples import Cycle, Violation

DEFENSIVE_NOTE = ", defensive mode"


class Detector:
    """Stateful hog detection for one node: rogue processes, idle allocations, over fair share."""

    def __init__(self, cfg: DetectConfig, shares: Mapping[str, float] | None = None) -> None:
        self.cfg = cfg
        d = cfg.defensive
        tight = thresholds(cfg, True)
        self._rogue = RogueTracker(cfg.rogue.exempt_users)
        self._idle = IdleTracker(cfg.idle, max(cfg.idle.window_s, tight.idle_window_s))
        self._share = ShareTracker(cfg.share, max(cfg.share.duration_s, tight.share_duration_s))
        self._quotas = Quotas(cfg.share, shares)
        self._hogs = HogWindows(d.window_s, d.lookback_s)
        self._kinds = frozenset(d.kinds)
        self._thresholds = thresholds(cfg, False)
        self._violations: tuple[Violation, ...] = ()
        self._last: float | None = None

    def set_shares(self, shares: Mapping[str, float] | None) -> None:
        """Slurm's shares (user → fraction of the node, 0–1), used when ``quota_source = "slurm"``."""
        self._quotas = Quotas(self.cfg.share, shares)

    @property
    def thresholds(self) -> Thresholds:
        """The thresholds the next cycle is judged by, and whether defensive mode is on."""
        return self._thresholds

    @property
    def violations(self) -> tuple[Violation, ...]:
        """The violations current after the last cycle."""
        return self._violations

    @property
    def history_s(self) -> float:
        """How many seconds of stored cycles :func:`rebuild` needs to pick up where this left off."""
        d = self.cfg.defensive
        longest = max(self._idle.keep_s, self._share.keep_s)
        # Defensive mode counts windows with violations, and a violation needs a full window of
        # samples before it is found: the lookback's first window needs that much before it.
        return longest + self._hogs.slots * d.window_s if d.enabled else longest

    def feed(self, cycle: Cycle) -> tuple[Violation, ...]:
        """Take one cycle; return the violations current now."""
        if self._last is not None and cycle.ts <= self._last:
            return self._violations
        self._last = cycle.ts
        cfg, th = self.cfg, self._thresholds
        note = DEFENSIVE_NOTE if th.defensive else ""
        v = view(cycle)
        found: list[Violation] = []
        if cfg.rogue.enabled:
            found += self._rogue.update(cycle, v)
        if cfg.idle.enabled:
            found += self._idle.update(cycle, v, th.idle_threshold_pct, th.idle_window_s, note)
        if cfg.share.enabled:
            found += self._share.update(cycle, v, th.share_threshold_pct, th.share_duration_s,
                                        self._quotas, note)
        found.sort(key=_order)
        self._violations = tuple(found)
        if cfg.defensive.enabled:
            hog = any(f.kind in self._kinds for f in found)
            fraction = self._hogs.record(cycle.ts, hog)
            self._thresholds = thresholds(cfg, fraction > cfg.defensive.fraction + 1e-9, fraction)
        return self._violations

    def state_size(self) -> int:
        """Samples and keys held: what must stay bounded however many jobs come and go."""
        return (len(self._rogue) + len(self._idle) + self._idle.samples() + len(self._share)
                + self._share.samples() + len(self._hogs))


def _order(v: Violation) -> tuple[str, str, int, str, str]:
    return (v.kind, v.job_id or "", v.pid or 0, v.gpu_uuid or "", v.user or "")


def rebuild(cycles: Iterable[Cycle], cfg: DetectConfig,
            shares: Mapping[str, float] | None = None, stored: Iterable[Violation] = ()) -> Detector:
    """A detector that has seen ``cycles`` (stored history, oldest first), e.g. after a restart.

    Load at least :attr:`Detector.history_s` seconds of history. A violation older than the history
    loaded gets a start no earlier than the history's first cycle, unless ``stored`` (the findings
    recorded before the restart) holds it: see :func:`resume`.
    """
    return resume(Detector(cfg, shares), cycles, stored)


def resume(det: Detector, cycles: Iterable[Cycle], stored: Iterable[Violation] = ()) -> Detector:
    """Feed ``det`` the stored history, then let a rogue process it still tracks keep the start a
    stored finding gave it: a finding that goes on across a restart stays one finding."""
    for cycle in cycles:
        det.feed(cycle)
    det._rogue.adopt(v for v in stored if v.kind == "rogue")
    return det
