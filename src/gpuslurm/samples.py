"""The values samplers produce and everything downstream consumes (monitor, store, detectors, report).

At the floor of the package: the NVML and replay samplers (``gpuslurm.hw``) return
:class:`GpuSample` and :class:`ProcessReading` directly, the monitor attributes the readings to
jobs (:class:`ProcSample`), and policy and report read the same types, so none of them imports
another's copy.

Times are Unix seconds (float). A device is named by its UUID: the GPU's, or the MIG device's
(``mig_uuid``) with its parent GPU's in ``gpu_uuid``. Unknown facts are ``None``, never 0: an
idle-allocation rule must not mistake "NVML could not say" for "0 % busy".
NamedTuples rather than dataclasses: a cycle creates hundreds of them (8 GPUs × 64 processes).
"""

from __future__ import annotations

import math
from typing import NamedTuple

# The most one GPU draws, with a wide margin (H100 SXM 700 W, B200 1 kW, GB300 1.4 kW). Energy that
# implies more over an interval is no GPU's: a broken or forged capture, a counter that jumped.
MAX_GPU_POWER_W = 5000.0


class GpuSample(NamedTuple):
    """One GPU (or MIG device) at one instant."""

    ts: float
    gpu_uuid: str
    mig_uuid: str | None = None
    util_pct: float | None = None  # SM/GPU utilisation over NVML's last sample period
    mem_used_mib: float | None = None
    mem_total_mib: float | None = None
    power_w: float | None = None
    temp_c: float | None = None
    # NVML's total energy counter (mJ since the driver loaded; it restarts with a driver reload or
    # GPU reset); None where the GPU has none (before Volta, MIG devices)
    energy_mj: float | None = None


class ProcessReading(NamedTuple):
    """A process with a context on a GPU or MIG device, as a sampler sees it (not yet attributed)."""

    pid: int
    gpu_uuid: str
    mig_uuid: str | None = None
    mem_mib: float | None = None
    sm_util_pct: float | None = None
    # set only for a process a replayed capture recorded: its PID was another machine's, so it is
    # shown by this name and never looked up in this machine's /proc
    name: str | None = None


class Reading(NamedTuple):
    """One sampling pass: devices, processes, and ``(kind, subject, detail)`` of what failed."""

    devices: tuple[GpuSample, ...]
    processes: tuple[ProcessReading, ...]
    problems: tuple[tuple[str, str, str], ...] = ()


class ProcSample(NamedTuple):
    """One process holding a context on a GPU, attributed to a job when possible."""

    ts: float
    gpu_uuid: str
    pid: int
    mig_uuid: str | None = None
    name: str | None = None  # comm / executable base name
    uid: int | None = None
    user: str | None = None
    job_id: str | None = None  # None: in no job (no scheduler's job cgroup, session or map)
    mem_mib: float | None = None
    sm_util_pct: float | None = None  # per-process SM utilisation (NVML's process samples)
    started: float | None = None  # process start time, for "running since"


class Allocation(NamedTuple):
    """A job's GPUs on this node (from the prolog's job map, else squeue)."""

    job_id: str
    user: str
    uid: int
    uuids: tuple[str, ...]  # GPU or MIG UUIDs the job was given
    start: float
    account: str | None = None
    source: str = "map"  # "map" or "squeue"


class ScanProblem(NamedTuple):
    """Something one cycle could not read (a PID that exited, /proc unreadable, a lost GPU).

    Recorded, never raised: the monitor must survive all of them.
    """

    ts: float
    kind: str  # "pid-gone", "proc-unreadable", "gpu-lost", "nvml-error", ...
    subject: str  # the PID, GPU UUID or path concerned
    detail: str = ""


class Cycle(NamedTuple):
    """Everything one monitor cycle saw on one node."""

    ts: float
    node: str
    gpus: tuple[GpuSample, ...]
    procs: tuple[ProcSample, ...]
    allocations: tuple[Allocation, ...]
    problems: tuple[ScanProblem, ...] = ()


class Violation(NamedTuple):
    """A detector's finding, in terms an admin can act on."""

    kind: str  # "rogue", "idle", "over-share"
    node: str
    user: str | None
    job_id: str | None
    pid: int | None
    process: str | None
    gpu_uuid: str | None
    start: float  # when the condition began
    duration_s: float
    evidence: str  # one sentence: what was measured against which threshold
    severity: str = "warning"


def plausible_power_w(watts: float | None) -> float | None:
    """A power reading one GPU can draw (a number in 0..MAX_GPU_POWER_W), else None."""
    if watts is None or not math.isfinite(watts) or not 0.0 <= watts <= MAX_GPU_POWER_W:
        return None
    return watts


def plausible_power_sql(column: str) -> str:
    """:func:`plausible_power_w` as an SQL expression over ``column`` (a stored REAL: NULL for a
    reading that is not a number in 0..MAX_GPU_POWER_W; SQLite stores no NaN, and text or a blob
    compares above any number). A plain expression, not a Python function SQLite calls per row: the
    report sums months of samples (tests/report/test_report_energy.py checks the two agree)."""
    return f"CASE WHEN {column} BETWEEN 0 AND {MAX_GPU_POWER_W!r} THEN {column} END"


def plausible_power_sum_sql(total: str, count: str) -> str:
    """The same bound as an SQL condition on a minute row's ``total`` of ``count`` power readings:
    true where the sum is one that ``count`` plausible readings make (false for a row the rollup
    summed from absurd ones, which then counts as a minute without readings)."""
    return (f"(typeof({count}) = 'integer' AND {count} > 0 "
            f"AND {total} BETWEEN 0 AND {count} * {MAX_GPU_POWER_W!r})")


def plausible_counter_mj(mj: float | None) -> float | None:
    """A reading of NVML's energy counter (an unsigned 64-bit count of mJ), else None."""
    if mj is None or not math.isfinite(mj) or not 0.0 <= mj < 2.0**64:
        return None
    return mj


def counter_rise_j(before_mj: float | None, after_mj: float | None, dt_s: float) -> float | None:
    """The energy between two readings of NVML's total energy counter ``dt_s`` apart, in J, where it
    is one GPU's: the counter rose, by at most MAX_GPU_POWER_W over ``dt_s``. Else None: it fell
    (restarted with a driver reload or GPU reset), jumped beyond any GPU, or a reading is missing or
    not a number; the caller counts the power readings instead. The one bound for jobstats and the
    store's minute rows alike."""
    if before_mj is None or after_mj is None or not math.isfinite(dt_s) or dt_s < 0:
        return None
    rise = after_mj - before_mj  # NaN or infinite when either reading is
    if not math.isfinite(rise) or not 0.0 <= rise <= MAX_GPU_POWER_W * 1000.0 * dt_s:
        return None
    return rise / 1000.0


def interval_energy_j(before_mj: float | None, after_mj: float | None, power0_w: float | None,
                      power1_w: float | None, dt_s: float) -> tuple[float, str] | None:
    """One interval's energy between two samples ``dt_s`` apart and where it came from: the
    counter's rise (:func:`counter_rise_j`), else the trapezoid of two plausible power readings
    ("power"), else None."""
    rise = counter_rise_j(before_mj, after_mj, dt_s)
    if rise is not None:
        return rise, "counter"
    w0, w1 = plausible_power_w(power0_w), plausible_power_w(power1_w)
    if w0 is None or w1 is None or not math.isfinite(dt_s) or dt_s <= 0:
        return None
    return (w0 + w1) / 2 * dt_s, "power"
