"""The one door to NVML: the only module that imports ``pynvml``.

:class:`NvmlLibrary` initialises NVML on first use, once (a lock guards it), shuts it down at exit,
and offers one call helper that keeps the three outcomes apart: NOT_SUPPORTED (and a function
this driver or nvidia-ml-py lacks) raises :class:`NotSupported`, GPU_IS_LOST raises
:class:`GpuLost` naming the GPU, and any other NVML error a :class:`HardwareError` naming the call
and the GPU. Importing this module never touches the driver. Readers of nodes
(:mod:`gpuslurm.hw.nvml`), samples (:mod:`gpuslurm.hw.nvml_sampler`) and health
(:mod:`gpuslurm.hw.health`) call it; none of them sees ``pynvml``.
"""

from __future__ import annotations

import atexit
import ctypes
import threading
from typing import Any, NamedTuple

from gpuslurm.errors import HardwareError, NotSupported

# Return codes and enums from nvml.h; they are part of NVML's stable ABI.
NVML_SUCCESS = 0
NVML_ERROR_INVALID_ARGUMENT = 2
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_NO_PERMISSION = 4
NVML_ERROR_NOT_FOUND = 6
NVML_ERROR_INSUFFICIENT_SIZE = 7
NVML_ERROR_DRIVER_NOT_LOADED = 9
NVML_ERROR_LIBRARY_NOT_FOUND = 12
NVML_ERROR_FUNCTION_NOT_FOUND = 13
NVML_ERROR_GPU_IS_LOST = 15
NVML_DEVICE_MIG_ENABLE = 1
NVML_FEATURE_ENABLED = 1
NVML_TEMPERATURE_GPU = 0
MIB = 1024 * 1024
NVML_VALUE_NOT_AVAILABLE = (1 << 64) - 1  # usedGpuMemory under WDDM


class GpuProcessInfo(NamedTuple):
    """One entry of NVML's process list."""

    pid: int
    used_bytes: int | None  # None: the driver cannot say


class MemoryInfo(NamedTuple):
    """A device's memory in bytes; ``used`` leaves out the driver's reservation when NVML can."""

    total: int
    used: int
    reserved: int | None  # None: a driver without memory info v2 (its "used" includes it)


class _ProcessInfo(ctypes.Structure):
    """``nvmlProcessInfo_t`` as drivers before R535 and from R550 write it (24 bytes)."""

    _fields_ = [("pid", ctypes.c_uint), ("usedGpuMemory", ctypes.c_ulonglong),
                ("gpuInstanceId", ctypes.c_uint), ("computeInstanceId", ctypes.c_uint)]


class _ProcessInfoR535(ctypes.Structure):
    """The same struct as R535 drivers before 535.98 write it behind ``_v3`` (32 bytes)."""

    _fields_ = [*_ProcessInfo._fields_, ("usedGpuCcProtectedMemory", ctypes.c_ulonglong)]


class GpuLost(HardwareError):  # noqa: N818 - NVML's own name for the condition
    """NVML says a GPU fell off the bus; readers drop that GPU and go on with the others."""

    def __init__(self, index: int, call: str) -> None:
        super().__init__(f"GPU {index}: {call} reports the GPU is lost")
        self.index = index


def text(value: Any) -> str:
    """An NVML string (bytes from older nvidia-ml-py) as text, without padding."""
    if isinstance(value, bytes):
        value = value.decode("ascii", "replace")
    return str(value).strip("\x00 \n")


class NvmlLibrary:
    """NVML through ``module`` (``pynvml``, imported on first use, or a stand-in with its API)."""

    def __init__(self, module: Any | None = None) -> None:
        self._module = module
        self._nvml: Any | None = None
        self._lock = threading.Lock()
        self._process_abi: tuple[str, type[ctypes.Structure]] | None = None

    def module(self) -> Any:
        """The initialised NVML module (initialising it on the first call)."""
        with self._lock:
            if self._nvml is None:
                module = self._module if self._module is not None else _import_pynvml()
                try:
                    module.nvmlInit()
                except module.NVMLError as exc:
                    if exc.value in (NVML_ERROR_LIBRARY_NOT_FOUND, NVML_ERROR_DRIVER_NOT_LOADED):
                        raise HardwareError(f"NVML is not available: {exc}") from None
                    raise HardwareError(f"NVML nvmlInit failed: {exc}") from None
                self._nvml = module
                atexit.register(self.close)
            return self._nvml

    def close(self) -> None:
        """Shut NVML down if this library started it (also run at interpreter exit)."""
        with self._lock:
            nvml, self._nvml = self._nvml, None
            if nvml is None:
                return
            atexit.unregister(self.close)
            try:
                nvml.nvmlShutdown()
            except nvml.NVMLError:
                pass  # shutting down: nothing useful to do about it

    def call(self, name: str, *args: Any, gpu: int | None = None, allow: tuple[int, ...] = ()) -> Any:
        """Call ``name``; codes in ``allow`` give None, NOT_SUPPORTED raises NotSupported."""
        nvml = self.module()
        fn = getattr(nvml, name, None)
        if fn is None:
            raise NotSupported(f"NVML {name} is not in this nvidia-ml-py")
        try:
            return fn(*args)
        except nvml.NVMLError as exc:
            if exc.value in allow:
                return None
            raise _error(name, exc.value, str(exc), gpu) from None
        except getattr(nvml, "NVMLLibraryMismatchError", nvml.NVMLError) as exc:
            # nvidia-ml-py 13's unversioned process queries on a driver without their _v3
            raise NotSupported(f"NVML {name} is not in this driver: {exc}") from None

    def optional(self, name: str, *args: Any, gpu: int | None = None) -> Any:
        """:meth:`call`, with None where the driver does not support it."""
        try:
            return self.call(name, *args, gpu=gpu)
        except NotSupported:
            return None

    def first(self, names: tuple[str, ...], *args: Any, gpu: int | None = None) -> Any:
        """The first of ``names`` that this pynvml and driver provide (newest first)."""
        for name in names[:-1]:
            try:
                return self.call(name, *args, gpu=gpu)
            except NotSupported:
                continue
        return self.call(names[-1], *args, gpu=gpu)

    def has(self, name: str) -> bool:
        """Whether this nvidia-ml-py offers ``name`` (the driver may still say not supported)."""
        return hasattr(self.module(), name)

    def driver_has(self, symbol: str) -> bool:
        """Whether the loaded NVML library exports ``symbol`` (nvidia-ml-py's own lookup)."""
        nvml = self.module()
        try:
            nvml._nvmlGetFunctionPointer(symbol)
        except nvml.NVMLError:
            return False
        return True

    def memory_info(self, handle: Any, *, gpu: int | None = None) -> MemoryInfo:
        """Memory of ``handle``: v2 where the driver has it, since v1's "used" includes the memory
        the driver reserves for itself (hundreds of MiB on an idle GPU, which the epilog's
        memory-released check would take for a job's leftovers); nvidia-smi shows v2's figure."""
        nvml = self.module()
        version = getattr(nvml, "nvmlMemory_v2", None)
        if version is not None:
            try:
                m = self.call("nvmlDeviceGetMemoryInfo", handle, version, gpu=gpu)
                return MemoryInfo(int(m.total), int(m.used), int(m.reserved))
            except NotSupported:
                pass  # a driver before R510: v1
        m = self.call("nvmlDeviceGetMemoryInfo", handle, gpu=gpu)
        return MemoryInfo(int(m.total), int(m.used), None)

    def running_processes(self, handle: Any, *, graphics: bool = False,
                          gpu: int | None = None) -> list[GpuProcessInfo]:
        """The compute (or ``graphics``) processes on ``handle``, read with the driver's layout.

        nvidia-ml-py reads ``_v3`` lists as 24-byte entries, but R535 drivers before 535.98 write
        32-byte ones there (``usedGpuCcProtectedMemory``, added without a version bump), and
        535.98 dropped ``_v3`` again. Which layout a driver writes is told by its entry points,
        as nvitop probes them: ``_v3`` with confidential computing
        (``nvmlDeviceGetConfComputeMemSizeInfo``) but without the R550 detail list is the
        32-byte struct; without ``_v3``, ``_v2`` and 24 bytes.
        """
        kind = "Graphics" if graphics else "Compute"
        nvml = self.module()
        if not hasattr(nvml, "_nvmlGetFunctionPointer"):  # a stand-in module: its own reading
            return [GpuProcessInfo(int(p.pid), _bytes(getattr(p, "usedGpuMemory", None)))
                    for p in self.call(f"nvmlDeviceGet{kind}RunningProcesses", handle, gpu=gpu) or ()]
        suffix, entry = self._processes_abi()
        name = f"nvmlDeviceGet{kind}RunningProcesses{suffix}"
        try:
            fn = nvml._nvmlGetFunctionPointer(name)
        except nvml.NVMLError as exc:
            raise _error(name, exc.value, str(exc), gpu) from None
        count = ctypes.c_uint(0)
        code = fn(handle, ctypes.byref(count), None)
        for _ in range(3):  # the list may grow between the calls
            if code != NVML_ERROR_INSUFFICIENT_SIZE:
                break
            count.value = count.value * 2 + 5
            entries = (entry * count.value)()
            code = fn(handle, ctypes.byref(count), entries)
            if code == NVML_SUCCESS:
                return [GpuProcessInfo(int(e.pid), _bytes(int(e.usedGpuMemory)))
                        for e in entries[: count.value]]
        if code == NVML_SUCCESS:
            return []
        raise _error(name, code, _error_text(nvml, code), gpu)

    def _processes_abi(self) -> tuple[str, type[ctypes.Structure]]:
        if self._process_abi is None:
            if self.driver_has("nvmlDeviceGetComputeRunningProcesses_v3"):
                wide = (self.driver_has("nvmlDeviceGetConfComputeMemSizeInfo")
                        and not self.driver_has("nvmlDeviceGetRunningProcessDetailList"))
                self._process_abi = ("_v3", _ProcessInfoR535 if wide else _ProcessInfo)
            else:
                self._process_abi = ("_v2", _ProcessInfo)
        return self._process_abi


def _bytes(value: Any) -> int | None:
    return None if value is None or int(value) == NVML_VALUE_NOT_AVAILABLE else int(value)


def _error_text(nvml: Any, code: int) -> str:
    try:
        return str(nvml.NVMLError(code))
    except Exception:  # a message only: never fail while explaining a failure
        return f"NVML error {code}"


def _error(name: str, code: int, message: str, gpu: int | None) -> HardwareError:
    """The exception for NVML ``code`` from ``name``: not supported, GPU lost, or a failure."""
    where = "" if gpu is None else f" for GPU {gpu}"
    if code in (NVML_ERROR_NOT_SUPPORTED, NVML_ERROR_FUNCTION_NOT_FOUND):
        return NotSupported(f"NVML {name} is not supported{where}: {message}")
    if code == NVML_ERROR_GPU_IS_LOST and gpu is not None:
        return GpuLost(gpu, name)
    return HardwareError(f"NVML {name} failed{where}: {message}")


def _import_pynvml() -> Any:
    try:
        import pynvml  # on first use: importing gpuslurm must not need the package
    except ImportError:
        raise HardwareError("NVML is not available: the nvidia-ml-py package is not installed") from None
    return pynvml
