"""Live sampling for the monitor: every GPU's utilisation, memory, power, temperature and processes.

The samples are :mod:`gpuslurm.samples` values, the same the replay sampler
(:mod:`gpuslurm.hw.replay.scenario`) returns; NVML is reached through :mod:`gpuslurm.hw.live.nvml_lib`.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from gpuslurm.errors import HardwareError, NotSupported
from gpuslurm.hw.live.nvml_lib import (
    MIB,
    NVML_DEVICE_MIG_ENABLE,
    NVML_ERROR_NOT_FOUND,
    NVML_SUCCESS,
    NVML_TEMPERATURE_GPU,
    GpuLost,
    MemoryInfo,
    NvmlLibrary,
)
from gpuslurm.hw.live.nvml_lib import text as _text
from gpuslurm.samples import GpuSample, ProcessReading, Reading


class _Device(NamedTuple):
    gpu: int  # NVML index
    uuid: str
    handle: Any
    migs: tuple[tuple[str, Any], ...]  # (MIG UUID, handle)


class NvmlSampler:
    """Utilisation, memory, power, temperature and processes of every GPU, one pass per read().

    Devices are enumerated on the first read (handles stay valid until the driver unloads). A
    query the driver does not support is not asked again; a lost GPU or a failing call costs
    that GPU this pass and is reported as a problem, never raised.
    """

    def __init__(self, module: Any | None = None) -> None:
        self._nvml = NvmlLibrary(module)
        self._devices: tuple[_Device, ...] | None = None
        self._enum_problems: tuple[tuple[str, str, str], ...] = ()
        self._unsupported: set[tuple[str, int]] = set()
        self._last_seen: dict[int, int] = {}  # per GPU: newest process sample, NVML's µs clock

    def close(self) -> None:
        self._nvml.close()

    def _enumerate(self) -> tuple[_Device, ...]:
        call = self._nvml.call
        devices: list[_Device] = []
        problems: list[tuple[str, str, str]] = []
        for i in range(int(call("nvmlDeviceGetCount"))):
            try:
                handle = call("nvmlDeviceGetHandleByIndex", i, gpu=i)
                uuid = _text(call("nvmlDeviceGetUUID", handle, gpu=i))
                migs: list[tuple[str, Any]] = []
                mode = self._nvml.optional("nvmlDeviceGetMigMode", handle, gpu=i)
                if mode is not None and int(mode[0]) == NVML_DEVICE_MIG_ENABLE:
                    for slot in range(int(call("nvmlDeviceGetMaxMigDeviceCount", handle, gpu=i))):
                        mig = call("nvmlDeviceGetMigDeviceHandleByIndex", handle, slot, gpu=i,
                                   allow=(NVML_ERROR_NOT_FOUND,))
                        if mig is not None:
                            migs.append((_text(call("nvmlDeviceGetUUID", mig, gpu=i)), mig))
            except GpuLost as exc:
                problems.append(("gpu-lost", f"index {i}", str(exc)))
                continue
            except HardwareError as exc:
                problems.append(("nvml-error", f"index {i}", str(exc)))
                continue
            devices.append(_Device(i, uuid, handle, tuple(migs)))
        self._enum_problems = tuple(problems)
        return tuple(devices)

    def _opt(self, name: str, dev: _Device, *args: Any) -> Any:
        key = (name, dev.gpu)
        if key in self._unsupported:
            return None
        try:
            return self._nvml.call(name, *args, gpu=dev.gpu)
        except NotSupported:
            self._unsupported.add(key)
            return None

    def _memory(self, dev: _Device, handle: Any) -> MemoryInfo | None:
        key = ("memory", dev.gpu)
        if key in self._unsupported:
            return None
        try:
            return self._nvml.memory_info(handle, gpu=dev.gpu)
        except NotSupported:
            self._unsupported.add(key)
            return None

    def read(self, now: float = 0.0) -> Reading:
        """Sample every device once; ``now`` stamps the samples (NVML samples the present)."""
        if self._devices is None:
            self._devices = self._enumerate()
        devices: list[GpuSample] = []
        processes: list[ProcessReading] = []
        problems = list(self._enum_problems)
        for dev in self._devices:
            try:
                d, p = self._read_device(dev, now)
            except GpuLost as exc:
                problems.append(("gpu-lost", dev.uuid, str(exc)))
                continue
            except HardwareError as exc:
                problems.append(("nvml-error", dev.uuid, str(exc)))
                continue
            devices.extend(d)
            processes.extend(p)
        return Reading(tuple(devices), tuple(processes), tuple(problems))

    def _read_device(self, dev: _Device, now: float) -> tuple[list[GpuSample], list[ProcessReading]]:
        h = dev.handle
        util = self._opt("nvmlDeviceGetUtilizationRates", dev, h)
        mem = self._memory(dev, h)
        power = self._opt("nvmlDeviceGetPowerUsage", dev, h)
        temp = self._opt("nvmlDeviceGetTemperature", dev, h, NVML_TEMPERATURE_GPU)
        energy = self._opt("nvmlDeviceGetTotalEnergyConsumption", dev, h)
        out = [GpuSample(
            now, dev.uuid, None, None if util is None else float(util.gpu),
            None if mem is None else int(mem.used) / MIB, None if mem is None else int(mem.total) / MIB,
            None if power is None else int(power) / 1000.0, None if temp is None else float(temp),
            None if energy is None else float(energy))]
        procs: list[ProcessReading] = []
        if dev.migs:
            for mig_uuid, mh in dev.migs:
                mmem = self._memory(dev, mh)
                out.append(GpuSample(now, dev.uuid, mig_uuid, None,
                                     None if mmem is None else int(mmem.used) / MIB,
                                     None if mmem is None else int(mmem.total) / MIB))
                procs.extend(self._processes(dev, mh, mig_uuid, {}))
        else:
            procs = self._processes(dev, h, None, self._sm_util(dev))
        return out, procs

    def _processes(self, dev: _Device, handle: Any, mig_uuid: str | None,
                   sm: dict[int, float]) -> list[ProcessReading]:
        seen: dict[int, ProcessReading] = {}
        for graphics in (False, True):
            key = ("graphics processes" if graphics else "compute processes", dev.gpu)
            if key in self._unsupported:
                continue
            try:
                found = self._nvml.running_processes(handle, graphics=graphics, gpu=dev.gpu)
            except NotSupported:
                self._unsupported.add(key)
                continue
            for p in found:
                if p.pid not in seen:
                    seen[p.pid] = ProcessReading(
                        p.pid, dev.uuid, mig_uuid, None if p.used_bytes is None else p.used_bytes / MIB,
                        sm.get(p.pid))
        return list(seen.values())

    def _sm_util(self, dev: _Device) -> dict[int, float]:
        """Per-process SM utilisation from the samples NVML took since the last pass."""
        samples = None
        key = ("nvmlDeviceGetProcessUtilization", dev.gpu)
        if key not in self._unsupported:
            try:
                # NOT_FOUND (and, from some nvidia-ml-py versions, SUCCESS raised as an
                # error) mean there is no new sample: not a failure.
                samples = self._nvml.call(key[0], dev.handle, self._last_seen.get(dev.gpu, 0),
                                              gpu=dev.gpu, allow=(NVML_ERROR_NOT_FOUND, NVML_SUCCESS))
            except NotSupported:
                self._unsupported.add(key)
        newest: dict[int, tuple[int, float]] = {}
        for s in samples or ():
            stamp, util = int(s.timeStamp), int(s.smUtil)
            if util <= 100 and stamp >= newest.get(int(s.pid), (-1, 0.0))[0]:
                newest[int(s.pid)] = (stamp, float(util))
            if stamp > self._last_seen.get(dev.gpu, 0):
                self._last_seen[dev.gpu] = stamp
        return {pid: util for pid, (_, util) in newest.items()}
