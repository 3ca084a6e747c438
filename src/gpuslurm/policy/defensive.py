"""Defensive mode: tighter thresholds while hogs are common on the node (pure)."""

from __future__ import annotations

import math
from collections import deque
from typing import NamedTuple

from gpuslurm.config import DetectConfig


class Thresholds(NamedTuple):
    """The thresholds in force, and why."""

    defensive: bool
    hog_fraction: float  # of the lookback's windows that had a hog
    idle_threshold_pct: float
    idle_window_s: float
    share_threshold_pct: float
    share_duration_s: float


def thresholds(cfg: DetectConfig, defensive: bool, hog_fraction: float = 0.0) -> Thresholds:
    """The normal thresholds, or the tightened ones in defensive mode."""
    idle, share, d = cfg.idle, cfg.share, cfg.defensive
    if not defensive:
        return Thresholds(False, hog_fraction, idle.threshold_pct, idle.window_s, share.threshold_pct,
                          share.duration_s)
    return Thresholds(True, hog_fraction, min(100.0, idle.threshold_pct * d.idle_threshold_factor),
                      idle.window_s * d.idle_window_factor, share.threshold_pct * d.share_threshold_factor,
                      share.duration_s * d.share_duration_factor)


class HogWindows:
    """Which of the last lookback's fixed windows (epoch-aligned) had a hog."""

    def __init__(self, window_s: float, lookback_s: float) -> None:
        self._window = window_s
        self.slots = max(1, math.ceil(lookback_s / window_s - 1e-9))
        self._marked: deque[int] = deque()  # indices of windows with a hog, ascending

    def record(self, ts: float, hog: bool) -> float:
        """Note whether this cycle saw a hog; returns the fraction of windows that had one."""
        index = math.floor(ts / self._window)
        if hog and (not self._marked or self._marked[-1] != index):
            self._marked.append(index)
        while self._marked and self._marked[0] <= index - self.slots:
            self._marked.popleft()
        return len(self._marked) / self.slots

    def __len__(self) -> int:
        return len(self._marked)
