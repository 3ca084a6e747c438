"""A GPU's health facts from NVML, for the health gate and the monitor.

NVML gives temperature, volatile uncorrectable ECC, row remapping (or retired pages on older
GPUs), used memory, the processes on each GPU and why its clocks are held down (``clock_events``,
NVML's clock event reasons by name, :data:`gpuslurm.hw.model.health.CLOCK_EVENTS`). Xid errors
are not kept by NVML for a one-shot query (they arrive as events), so live Xids are left to the
monitor.
"""

from __future__ import annotations

from collections.abc import Sequence

from gpuslurm.errors import HardwareError, NotSupported
from gpuslurm.hw.live.procfs import PROC_ROOT, owner_uid
from gpuslurm.hw.model.health import GpuHealth, GpuProcess, clock_event_names
from gpuslurm.tuples import TYPE_CHECKING  # typing is not imported on the hooks' path

if TYPE_CHECKING:
    from typing import Any

    from gpuslurm.hw.model.node import Gpu

# nvml.h enums (stable ABI)
NVML_TEMPERATURE_GPU = 0
NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 1
NVML_VOLATILE_ECC = 0
NVML_FEATURE_ENABLED = 1
MIB = 1024 * 1024


class NvmlHealthReader:
    """Reads health facts through an NVML backend (``module``: ``pynvml`` or a stand-in).

    It holds the backend rather than being one so that replaying never imports the NVML module.
    """

    def __init__(self, module: Any | None = None) -> None:
        from gpuslurm.hw.live.nvml_lib import NvmlLibrary

        nvml = NvmlLibrary(module)
        self._call = nvml.call
        self._optional = nvml.optional
        self._running = nvml.running_processes
        self._memory = nvml.memory_info
        self._first = nvml.first

    def read(self, gpus: Sequence[Gpu]) -> dict[str, GpuHealth]:
        from gpuslurm.hw.live.nvml_lib import GpuLost

        out: dict[str, GpuHealth] = {}
        for gpu in gpus:
            try:
                out[gpu.uuid] = self._read_one(gpu)
            except GpuLost:
                out[gpu.uuid] = GpuHealth(gpu.uuid, lost=True)
            except HardwareError as exc:  # not "not supported": a failure, so the gate must see it
                out[gpu.uuid] = GpuHealth(gpu.uuid, error=str(exc))
        return out

    def _read_one(self, gpu: Gpu) -> GpuHealth:
        i = gpu.index
        handle = self._call("nvmlDeviceGetHandleByIndex", i, gpu=i)
        found = str(self._call("nvmlDeviceGetUUID", handle, gpu=i))
        if found != gpu.uuid:  # the driver renumbered (a GPU fell off the bus): do not guess
            raise HardwareError(f"NVML index {i} is now {found}, not {gpu.uuid}")
        temp = self._optional("nvmlDeviceGetTemperature", handle, NVML_TEMPERATURE_GPU, gpu=i)
        ecc = self._optional("nvmlDeviceGetTotalEccErrors", handle, NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
                             NVML_VOLATILE_ECC, gpu=i)
        remap_pending = remap_failed = retired = None
        rows = self._optional("nvmlDeviceGetRemappedRows", handle, gpu=i)
        if rows is not None:
            remap_pending, remap_failed = bool(rows[2]), bool(rows[3])
        else:  # before Ampere: page retirement instead of row remapping
            pending = self._optional("nvmlDeviceGetRetiredPagesPendingStatus", handle, gpu=i)
            retired = None if pending is None else int(pending) == NVML_FEATURE_ENABLED
        try:
            memory = self._memory(handle, gpu=i)
        except NotSupported:
            memory = None
        try:
            reasons = self._first(("nvmlDeviceGetCurrentClocksEventReasons",
                                   "nvmlDeviceGetCurrentClocksThrottleReasons"), handle, gpu=i)
        except NotSupported:
            reasons = None
        return GpuHealth(
            gpu.uuid,
            temperature_c=None if temp is None else int(temp),
            ecc_uncorrectable=None if ecc is None else int(ecc),
            retired_pages_pending=retired, remap_pending=remap_pending, remap_failed=remap_failed,
            memory_used_mib=None if memory is None else int(memory.used) // MIB,
            processes=self._processes(handle, i),
            clock_events=None if reasons is None else clock_event_names(int(reasons)),
        )

    def _processes(self, handle: Any, i: int) -> tuple[GpuProcess, ...] | None:
        seen: dict[int, GpuProcess] = {}
        known = False
        for graphics in (False, True):
            try:
                procs = self._running(handle, graphics=graphics, gpu=i)
            except NotSupported:
                continue
            known = True
            for p in procs:
                if p.pid not in seen:
                    seen[p.pid] = GpuProcess(p.pid, process_owner(p.pid),
                                             None if p.used_bytes is None else p.used_bytes // MIB)
        return tuple(seen.values()) if known else None


def process_owner(pid: int, proc_root: str = PROC_ROOT) -> str | None:
    """The user name owning ``pid`` (its uid as text when unnamed); None if it is gone."""
    try:
        uid = owner_uid(pid, proc_root)
    except OSError:
        return None
    import pwd

    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)
