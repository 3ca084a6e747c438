"""A time series of possibly-unknown values with O(log n) window averages (pure)."""

from __future__ import annotations

from bisect import bisect_left
from typing import NamedTuple

# Comparisons against thresholds tolerate float noise from the running sums: 5.000000000001
# must still count as "at most 5 %".
EPS = 1e-9


class Window(NamedTuple):
    """What a series holds between a start time and now."""

    samples: int  # every sample, known or not
    known: int  # samples whose value was known
    mean: float | None  # mean of the known values; None when none was known


class Series:
    """Samples appended in time order; any trailing window's mean in O(log n).

    Running totals taken *before* each sample let a window be a subtraction, so the same series
    answers for a normal and a tightened (defensive) window without rescanning.
    """

    __slots__ = ("_before_known", "_before_sum", "_known", "_sum", "_ts", "first")

    def __init__(self, first: float) -> None:
        self.first = first  # when the key was first seen: a window is judged only once covered
        self._ts: list[float] = []
        self._before_sum: list[float] = []
        self._before_known: list[int] = []
        self._sum = 0.0
        self._known = 0

    def add(self, ts: float, value: float | None) -> None:
        self._ts.append(ts)
        self._before_sum.append(self._sum)
        self._before_known.append(self._known)
        if value is not None:
            self._sum += value
            self._known += 1

    def window(self, since: float) -> Window:
        """The samples at or after ``since``."""
        i = bisect_left(self._ts, since)
        n = len(self._ts) - i
        if n == 0:
            return Window(0, 0, None)
        known = self._known - self._before_known[i]
        mean = (self._sum - self._before_sum[i]) / known if known else None
        return Window(n, known, mean)

    def trim(self, before: float) -> None:
        """Forget samples older than ``before`` (memory stays bounded by the longest window)."""
        i = bisect_left(self._ts, before)
        if i:
            del self._ts[:i], self._before_sum[:i], self._before_known[:i]

    def __len__(self) -> int:
        return len(self._ts)


def judged(series: Series, now: float, span: float, min_samples: int, min_coverage: float) -> float | None:
    """The mean over the last ``span`` seconds, or None when there is not enough data for a verdict.

    Enough means: the key was watched for the whole span, at least ``min_samples`` known samples,
    and at least ``min_coverage`` of the samples known.
    """
    if series.first > now - span + EPS:
        return None
    win = series.window(now - span - EPS)
    if win.mean is None or win.known < min_samples or win.known < min_coverage * win.samples - EPS:
        return None
    return win.mean
