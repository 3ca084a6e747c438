"""What a report source hands to the report: time-bucketed series and spans (neutral, pure values).

Every source (``query.load_sqlite``, a Prometheus loader) produces one :class:`ReportData` for a
window ``[since, until)`` cut into buckets of ``step_s`` seconds. Bucket ``i`` covers
``[start + i * step_s, start + (i + 1) * step_s)`` clipped to the window; ``start`` is ``since``
rounded down to a multiple of ``step_s`` (so minute rollups never straddle two buckets when
``step_s`` is a multiple of 60). Each series holds one value per bucket.

A bucket's mean utilisation holds only for the part of it the monitor sampled (it may have
started, stopped or restarted inside it): :attr:`GpuSeries.cover` says how much, and the report
counts the rest of the bucket as unmeasured. Unknown stays ``None``, never 0: a bucket without a
sample is "not measured", not "idle".
Devices are named by UUID: a GPU's, or a MIG device's with its parent in ``gpu_uuid``.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import NamedTuple, TypeVar, overload

from gpuslurm.samples import Violation

T = TypeVar("T")


class Sparse(Sequence[T]):
    """A series' value per bucket, held only where it lives: ``values`` from bucket ``first`` on,
    ``fill`` in the other buckets of ``n``. A process (or job) of a 12-hour life in a 30-day window
    of 2,000 buckets holds 18 values, not 2,000. Equal to any sequence with the same items."""

    __slots__ = ("fill", "first", "n", "values")

    def __init__(self, n: int, first: int, values: Sequence[T], fill: T) -> None:
        self.n, self.first, self.values, self.fill = n, first, tuple(values), fill

    @overload
    def __getitem__(self, i: int) -> T: ...
    @overload
    def __getitem__(self, i: slice) -> Sequence[T]: ...
    def __getitem__(self, i: int | slice) -> T | Sequence[T]:
        if isinstance(i, int) and 0 <= i < self.n:  # the report's hot path: one bucket
            j = i - self.first
            return self.values[j] if 0 <= j < len(self.values) else self.fill
        if isinstance(i, slice):
            return tuple(self)[i]
        if not -self.n <= i < 0:
            raise IndexError(i)
        return self[i + self.n]

    def __len__(self) -> int:
        return self.n

    def __iter__(self) -> Iterator[T]:
        yield from (self.fill for _ in range(self.first))
        yield from self.values
        yield from (self.fill for _ in range(self.n - self.first - len(self.values)))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Sequence) and len(other) == self.n and tuple(self) == tuple(other)

    def __hash__(self) -> int:
        return hash(tuple(self))

    def __repr__(self) -> str:
        return f"Sparse(n={self.n}, first={self.first}, values={self.values!r})"


class GpuSeries(NamedTuple):
    """One device's utilisation over the window."""

    node: str
    uuid: str  # the device: GPU UUID, or MIG UUID
    gpu_uuid: str  # its physical GPU (== uuid for a whole GPU)
    util: tuple[float | None, ...]  # mean utilisation % per bucket; None: no known sample
    # fraction (0–1) of each bucket the samples behind ``util`` cover (samples × sampling interval
    # over the bucket); () means every bucket with a ``util`` is fully covered
    cover: tuple[float, ...] = ()
    # how users know it: its index ("3"; a MIG device "3.1"); "" when the source cannot say
    label: str = ""
    # the whole GPU's energy (J) per bucket (its power sampled × the interval); None (or ()): unknown
    energy_j: tuple[float | None, ...] = ()


class ProcSeries(NamedTuple):
    """One process on one device over the window (a PID reused later is another series)."""

    node: str
    device: str  # GPU or MIG UUID it held a context on
    pid: int
    name: str | None
    user: str | None  # owner's name, else None (see ``uid``)
    uid: int | None
    job_id: str | None  # None: in no job
    seen: Sequence[float]  # fraction (0–1) of each bucket it was seen in; 0: absent
    util: Sequence[float | None]  # its own mean SM utilisation % per bucket; None: unknown/absent


class AllocationSpan(NamedTuple):
    """A job's devices on one node, from when it started to when it was last seen."""

    node: str
    job_id: str
    user: str
    account: str | None
    devices: tuple[str, ...]  # GPU or MIG UUIDs
    start: float
    end: float  # :func:`held_until` its last sighting (for a running job: the newest sample's)


class Gap(NamedTuple):
    """A time a node's monitor (or its exporter, for Prometheus) left without samples, inside the
    window: from its last sample before to its first after (:data:`GAP_INTERVALS`)."""

    node: str
    start: float  # the last sample before the gap
    end: float  # the first sample after it


# A node has a gap where two of its samples are more than this many sampling (or scrape) intervals
# apart: a cycle that ran late, or one scrape that failed, is not one.
GAP_INTERVALS = 3.0


class ReportData(NamedTuple):
    """Everything a report needs for one window, from any source."""

    source: str  # for the header: "sqlite:/var/lib/gpuslurm/monitor.db", "prometheus:http://..."
    since: float
    until: float
    start: float  # left edge of bucket 0 (<= since)
    step_s: float
    gpus: tuple[GpuSeries, ...]
    procs: tuple[ProcSeries, ...]
    allocations: tuple[AllocationSpan, ...]
    violations: tuple[Violation, ...]  # findings overlapping the window
    # times a node seen in the window had no samples in it (its monitor down): unmeasured, named
    gaps: tuple[Gap, ...] = ()

    @property
    def buckets(self) -> int:
        return bucket_count(self.start, self.until, self.step_s)

    def bucket_span(self, i: int) -> tuple[float, float]:
        """Bucket ``i`` as ``(lo, hi)`` seconds, clipped to the window."""
        lo = self.start + i * self.step_s
        return max(lo, self.since), min(lo + self.step_s, self.until)


def held_until(last_seen: float, interval: float | None) -> float:
    """A job's end, whatever the source: the end of the last monitor cycle (or scrape) that saw it.

    A cycle stands for its interval, as a sample does; ending the job at its last cycle would leave
    its processes' last interval outside the job. ``interval`` None (unknown): the cycle itself.
    """
    return last_seen + (interval or 0.0)


def bucket_start(since: float, step_s: float) -> float:
    """The left edge of bucket 0: ``since`` rounded down to a multiple of ``step_s``."""
    return (since // step_s) * step_s


def bucket_count(start: float, until: float, step_s: float) -> int:
    n = int((until - start) // step_s)
    return n + 1 if start + n * step_s < until else n


def auto_step(since: float, until: float, max_buckets: int = 2000) -> float:
    """A bucket width for the window: whole minutes, at most ``max_buckets`` buckets (charts, speed);
    past 5 minutes, whole 5 minutes (what the Prometheus source's 5-minute rules can answer)."""
    span = max(until - since, 60.0)
    minutes = -(-span // (60 * max_buckets))  # ceiling
    if minutes > 5:
        minutes = -(-minutes // 5) * 5
    return 60.0 * max(1.0, minutes)
