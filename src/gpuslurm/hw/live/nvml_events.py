"""NVML's events (critical Xids, double-bit ECC, a GPU off the bus) in a thread, drained each cycle.

NVML reports an Xid only as an event to whoever registered before it happened, so the monitor
registers every GPU for the event types it wants and the driver supports, and a daemon thread
waits on the set (``nvmlEventSetWait_v2``, one second at a time, so closing never hangs) and queues
what arrives; :meth:`NvmlEvents.drain` hands the queue to the monitor's cycle, which never waits.
A double-bit ECC event is recorded as Xid 48, which the driver logs for the same fault; a GPU
unavailable event (R565 on) as the GPU lost. The GPU of an event is told by its handle, mapped to
the UUID when it was registered: the GPU of an Xid 79 answers GPU_IS_LOST to every query, its
UUID too. A wait that answers GPU_IS_LOST (a GPU fell off the bus; drivers before R565 have no
event for it) is a problem of the cycle, said once, and the thread goes on; the cycle's health
read names the GPU. When no GPU supports the wanted events, the driver has no event API, or it
lacks ``nvmlEventSetWait_v2`` (before R450: nvidia-ml-py calls only that),
:meth:`NvmlEvents.start` says so once and the kernel log stays the Xid source. All calls go
through :class:`gpuslurm.hw.live.nvml_lib.NvmlLibrary`.
"""

from __future__ import annotations

import ctypes
import threading
from collections import deque
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

from gpuslurm.errors import GpuslurmError, NotSupported
from gpuslurm.hw.live.nvml_lib import GpuLost

if TYPE_CHECKING:
    from gpuslurm.hw.model.node import Gpu

# nvmlEventType* bits (nvml.h, stable ABI)
EVENT_DOUBLE_BIT_ECC = 0x2
EVENT_XID_CRITICAL = 0x8
EVENT_GPU_UNAVAILABLE = 0x4000
WANTED = EVENT_DOUBLE_BIT_ECC | EVENT_XID_CRITICAL | EVENT_GPU_UNAVAILABLE
NVML_ERROR_TIMEOUT = 10
DBE_XID = 48
NO_INSTANCE = 0xFFFFFFFF  # nvmlEventData_t's gpuInstanceId when the event is the whole GPU's
MAX_QUEUED = 10_000  # a storm of events cannot grow the monitor without bound


class XidEvent(NamedTuple):
    uuid: str
    code: int  # the Xid (0 with ``lost``)
    gpu_instance: int | None = None  # the MIG GPU instance the Xid is attributed to
    lost: bool = False  # the GPU fell off the bus


def _key(handle: Any) -> Any:
    """What identifies a device handle: its address for nvidia-ml-py's ctypes pointers."""
    if isinstance(handle, ctypes._Pointer):
        return ctypes.cast(handle, ctypes.c_void_p).value
    return handle


class NvmlEvents:
    """Registers ``gpus`` for Xid and double-bit ECC events and queues them from a thread."""

    def __init__(self, gpus: Sequence[Gpu], module: Any | None = None, wait_ms: int = 1000) -> None:
        from gpuslurm.hw.live.nvml_lib import NvmlLibrary

        self.gpus = list(gpus)
        self.nvml = NvmlLibrary(module)
        self.wait_ms = wait_ms
        self._set: Any = None
        self._uuid_of: dict[Any, str] = {}  # by handle (_key)
        self._lost_said = False
        self._queue: deque[XidEvent] = deque(maxlen=MAX_QUEUED)
        self._problems: deque[str] = deque(maxlen=100)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> str | None:
        """Register and start the thread; why not, in one line, when no GPU supports the events."""
        call = self.nvml.call
        try:
            self._set = call("nvmlEventSetCreate")
            if not self._has_wait():
                self._free()
                return ("NVML events are not available (this driver has no nvmlEventSetWait_v2, added in "
                        "R450); Xids come from the kernel log only")
        except (NotSupported, GpuslurmError) as exc:
            return f"NVML events are not available ({exc}); Xids come from the kernel log only"
        registered = 0
        for gpu in self.gpus:
            try:
                handle = call("nvmlDeviceGetHandleByIndex", gpu.index, gpu=gpu.index)
                supported = int(call("nvmlDeviceGetSupportedEventTypes", handle, gpu=gpu.index))
                if not supported & WANTED:
                    continue
                call("nvmlDeviceRegisterEvents", handle, supported & WANTED, self._set, gpu=gpu.index)
            except (NotSupported, GpuslurmError):
                continue
            self._uuid_of[_key(handle)] = gpu.uuid
            registered += 1
        if not registered:
            self._free()
            return "no GPU supports NVML's Xid or ECC events; Xids come from the kernel log only"
        self._thread = threading.Thread(target=self._run, name="gpuslurm-nvml-events", daemon=True)
        self._thread.start()
        return None

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                data = self.nvml.call("nvmlEventSetWait_v2", self._set, self.wait_ms,
                                      allow=(NVML_ERROR_TIMEOUT,))
            except GpuLost:
                # a GPU fell off the bus (no event type for it before R565): the cycle's health
                # read names it; say it once, and go on waiting for the other GPUs' events
                if not self._lost_said:
                    self._lost_said = True
                    with self._lock:
                        self._problems.append("NVML event wait: a GPU is lost (GPU_IS_LOST); "
                                              "the health check names it")
                self._stop.wait(self.wait_ms / 1000)  # never spin on a driver that repeats it
                continue
            except (NotSupported, GpuslurmError) as exc:
                with self._lock:
                    self._problems.append(f"NVML event wait failed: {exc}")
                self._stop.wait(5.0)  # a failing driver must not spin the thread
                continue
            if data is None:
                continue
            event = self._event(data)
            if event is not None:
                with self._lock:
                    self._queue.append(event)

    def _has_wait(self) -> bool:
        nvml = self.nvml.module()
        return not hasattr(nvml, "_nvmlGetFunctionPointer") or self.nvml.driver_has("nvmlEventSetWait_v2")

    def _event(self, data: Any) -> XidEvent | None:
        uuid = self._uuid_of.get(_key(data.device))
        if uuid is None:  # not a handle we registered: ask (a lost GPU cannot answer)
            try:
                uuid = str(self.nvml.call("nvmlDeviceGetUUID", data.device))
            except GpuslurmError:
                return None
        kind = int(data.eventType)
        if kind & EVENT_XID_CRITICAL:
            gi = int(data.gpuInstanceId)
            return XidEvent(uuid, int(data.eventData), None if gi == NO_INSTANCE else gi)
        if kind & EVENT_DOUBLE_BIT_ECC:
            return XidEvent(uuid, DBE_XID)
        if kind & EVENT_GPU_UNAVAILABLE:
            return XidEvent(uuid, 0, lost=True)
        return None

    def drain(self) -> tuple[list[XidEvent], list[str]]:
        """The events and problems queued since the last call; never waits for the thread."""
        with self._lock:
            events, problems = list(self._queue), list(self._problems)
            self._queue.clear()
            self._problems.clear()
        return events, problems

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2 * self.wait_ms / 1000 + 1)
            self._thread = None
        self._free()

    def _free(self) -> None:
        if self._set is not None:
            try:
                self.nvml.call("nvmlEventSetFree", self._set)
            except GpuslurmError:
                pass
            self._set = None
