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

from typing import NamedTuple


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
