"""The one door to NVML: the only module that imports ``pynvml``.

:class:`NvmlLibrary` initialises NVML on first use, once (a lock guards it), shuts it down at exit,
and offers one call helper that keeps the three outcomes apart: NOT_SUPPORTED (and a function
this driver or nvidia-ml-py lacks) raises :class:`NotSupported`, GPU_IS_LOST raises
:class:`GpuLost` naming the GPU, and any other NVML error a :class:`HardwareError` naming the call
and the GPU. Importing this module never touches the driver. :func:`use_library` names the NVML
library to load by path (``[paths] nvml_library``) for processes that get no ``LD_LIBRARY_PATH``,
such as the hooks slurmd runs. Readers of nodes
(:mod:`gpuslurm.hw.live.nvml`), samples (:mod:`gpuslurm.hw.live.nvml_sampler`) and health
(:mod:`gpuslurm.hw.health`) call it; none of them sees ``pynvml``.
"""

from __future__ import annotations

import atexit
import ctypes
import os
import stat
import threading
from typing import Any, NamedTuple

from gpuslurm.errors import HardwareError, InputError, NotSupported

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
SONAME = "libnvidia-ml.so.1"  # the name nvidia-ml-py loads
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
    """``nvmlProcessInfo_t`` as drivers before R535 and from 535.104 (R545, R550, ...) write it (24 bytes)."""

    _fields_ = [("pid", ctypes.c_uint), ("usedGpuMemory", ctypes.c_ulonglong),
                ("gpuInstanceId", ctypes.c_uint), ("computeInstanceId", ctypes.c_uint)]


class _ProcessInfoR535(ctypes.Structure):
    """The same struct as R535 drivers before 535.98 write it behind ``_v3`` (32 bytes)."""

    _fields_ = [*_ProcessInfo._fields_, ("usedGpuCcProtectedMemory", ctypes.c_ulonglong)]


class GpuLost(HardwareError):  # noqa: N818 - NVML's own name for the condition
    """NVML says a GPU fell off the bus; readers drop that GPU and go on with the others."""

    def __init__(self, index: int | None, call: str) -> None:
        # None: a call of no one GPU (an event set's wait) reports that some GPU is lost
        super().__init__(f"GPU {index}: {call} reports the GPU is lost" if index is not None
                         else f"NVML {call} reports a GPU is lost")
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
                module = self._module
                if module is None:
                    module = _import_pynvml()
                    if _library_path:
                        _preload(_library_path)
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
        32-byte ones there (``usedGpuCcProtectedMemory``, added without a version bump), 535.98
        dropped ``_v3``, and 535.104 (then R545 and later) brought it back with 24-byte entries
        beside ``nvmlDeviceGetRunningProcessDetailList``. Which layout a driver writes is told by
        its entry points, as nvitop probes them: ``_v3`` with confidential computing
        (``nvmlDeviceGetConfComputeMemSizeInfo``) but without the detail list is the 32-byte
        struct; ``_v3`` with the detail list, 24 bytes; without ``_v3``, ``_v2`` and 24 bytes.
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


# -- which NVML library: by name (the dynamic loader's search), or the one the config names -----

_library_path = ""
_preloaded: ctypes.CDLL | None = None  # kept: the loaded NVML stays for the process's life


class NvmlLibraryError(InputError):
    """``[paths] nvml_library`` names a file root must not load, or one that is not NVML."""


def use_library(path: str) -> None:
    """Load NVML from ``path`` (absolute; "" = by name) when it is first initialised.

    One NVML per process, as nvidia-ml-py keeps one: a process-wide choice, made by whoever read
    the config (the hooks, the monitor) before any reader initialises NVML.
    """
    global _library_path
    _library_path = path


def _preload(path: str) -> None:
    """Load ``path`` so that nvidia-ml-py's ``CDLL("libnvidia-ml.so.1")`` gets this object.

    The dynamic loader answers a dlopen by name with an object already loaded whose soname is
    that name, so nvidia-ml-py is left as it is (no handle of its set from outside). The path is
    checked like every path root uses (safedir: no symlinks, every directory and the file root's
    or ours and not writable by others), the file is opened once and loaded through that
    descriptor (no swap between check and load), and a dlopen by name that must not load
    anything confirms the soname before NVML is initialised.
    """
    global _preloaded
    if _preloaded is not None:
        return
    from gpuslurm.hw.live.procfs import fd_path
    from gpuslurm.safedir import open_dir, why_refused

    where = "[paths] nvml_library"
    if not os.path.isabs(path) or os.path.normpath(path) != path:
        raise NvmlLibraryError(f"{where} must be an absolute, normalised path", source=path)
    directory, name = os.path.split(path)
    try:
        dfd = open_dir(directory, error=NvmlLibraryError)
    except NvmlLibraryError as exc:
        raise NvmlLibraryError(f"{where}: {exc.message}", source=exc.source) from None
    if dfd is None:
        raise NvmlLibraryError(f"{where}: no such directory", source=directory)
    try:
        try:
            fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dfd)
        except OSError as exc:
            raise NvmlLibraryError(f"{where}: refusing to load: {why_refused(dfd, name, exc)}",
                                   source=path) from None
    finally:
        os.close(dfd)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise NvmlLibraryError(f"{where}: refusing to load: not a regular file", source=path)
        if st.st_uid not in (0, os.geteuid()):
            raise NvmlLibraryError(f"{where}: refusing to load: owned by uid {st.st_uid}", source=path)
        if st.st_mode & 0o022:
            raise NvmlLibraryError(f"{where}: refusing to load: writable by group or others "
                                   f"(mode {stat.S_IMODE(st.st_mode):04o})", source=path)
        try:
            lib = ctypes.CDLL(fd_path(fd))
        except OSError as exc:
            raise NvmlLibraryError(f"{where}: cannot load: {exc}", source=path) from None
    finally:
        os.close(fd)
    try:
        by_name = ctypes.CDLL(SONAME, mode=os.RTLD_NOLOAD)
    except OSError:
        by_name = None
    if by_name is None or by_name._handle != lib._handle:
        raise NvmlLibraryError(f"{where}: not loaded under the name {SONAME} (its soname differs, or "
                               f"another {SONAME} was loaded first)", source=path)
    _preloaded = lib


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
    if code == NVML_ERROR_GPU_IS_LOST:
        return GpuLost(gpu, name)
    return HardwareError(f"NVML {name} failed{where}: {message}")


def _import_pynvml() -> Any:
    try:
        import pynvml  # on first use: importing gpuslurm must not need the package
    except ImportError:
        raise HardwareError("NVML is not available: the nvidia-ml-py package is not installed") from None
    return pynvml
