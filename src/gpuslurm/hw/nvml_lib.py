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
import threading
from typing import Any

from gpuslurm.errors import HardwareError, NotSupported

# Return codes and enums from nvml.h; they are part of NVML's stable ABI.
NVML_SUCCESS = 0
NVML_ERROR_INVALID_ARGUMENT = 2
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_NOT_FOUND = 6
NVML_ERROR_DRIVER_NOT_LOADED = 9
NVML_ERROR_LIBRARY_NOT_FOUND = 12
NVML_ERROR_FUNCTION_NOT_FOUND = 13
NVML_ERROR_GPU_IS_LOST = 15
NVML_DEVICE_MIG_ENABLE = 1
NVML_FEATURE_ENABLED = 1
NVML_TEMPERATURE_GPU = 0
MIB = 1024 * 1024


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
        where = "" if gpu is None else f" for GPU {gpu}"
        fn = getattr(nvml, name, None)
        if fn is None:
            raise NotSupported(f"NVML {name} is not in this nvidia-ml-py")
        try:
            return fn(*args)
        except nvml.NVMLError as exc:
            code = exc.value
            if code in allow:
                return None
            if code in (NVML_ERROR_NOT_SUPPORTED, NVML_ERROR_FUNCTION_NOT_FOUND):
                raise NotSupported(f"NVML {name} is not supported{where}: {exc}") from None
            if code == NVML_ERROR_GPU_IS_LOST and gpu is not None:
                raise GpuLost(gpu, name) from None
            raise HardwareError(f"NVML {name} failed{where}: {exc}") from None

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


def _import_pynvml() -> Any:
    try:
        import pynvml  # on first use: importing gpuslurm must not need the package
    except ImportError:
        raise HardwareError("NVML is not available: the nvidia-ml-py package is not installed") from None
    return pynvml
