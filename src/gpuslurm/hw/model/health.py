"""A GPU's health facts as values: what the hooks' gate and the monitor judge.

Where they come from: NVML (:mod:`gpuslurm.hw.live.nvml_health`), a bundle's ``health.json``
(:mod:`gpuslurm.hw.formats.health_json`) and its replay scenario
(:mod:`gpuslurm.hw.replay.health`), chosen by :func:`gpuslurm.hw.health.read_health`.
"""

from __future__ import annotations

from gpuslurm.tuples import NamedTuple  # not typing's: the hooks' health gate imports this

# nvmlClocksEventReason* bits (nvml.h), by the names health.json and status use
CLOCK_EVENTS = {
    "gpu_idle": 0x1, "applications_clocks": 0x2, "sw_power_cap": 0x4, "hw_slowdown": 0x8,
    "sync_boost": 0x10, "sw_thermal": 0x20, "hw_thermal": 0x40, "hw_power_brake": 0x80,
    "display_clocks": 0x100, "board_limit": 0x200, "reliability": 0x400,
}
# the reasons that mean the GPU is slowed by a fault or its cooling, not by policy or idleness
SLOWDOWNS = ("hw_slowdown", "sw_thermal", "hw_thermal", "hw_power_brake")


class GpuProcess(NamedTuple):
    """A process holding a context on a GPU."""

    pid: int
    user: str | None = None  # None when its owner could not be named
    used_mib: int | None = None


class GpuHealth(NamedTuple):
    """What is known about one GPU's health right now; ``None`` means unknown."""

    uuid: str
    lost: bool = False
    error: str | None = None  # why the facts could not be read (treated as lost)
    xid: tuple[int, ...] = ()  # Xid errors logged since the last check
    temperature_c: int | None = None
    ecc_uncorrectable: int | None = None  # volatile count
    retired_pages_pending: bool | None = None
    remap_pending: bool | None = None
    remap_failed: bool | None = None
    memory_used_mib: int | None = None
    processes: tuple[GpuProcess, ...] | None = None
    clock_events: tuple[str, ...] | None = None  # active clock event reasons (CLOCK_EVENTS names)


def clock_event_names(reasons: int) -> tuple[str, ...]:
    """The names of the clock event reason bits set in ``reasons`` (unknown bits are left out)."""
    return tuple(name for name, bit in CLOCK_EVENTS.items() if reasons & bit)
