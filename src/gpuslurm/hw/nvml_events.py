"""NVML's events (critical Xids, double-bit ECC) in a thread of their own, drained once per cycle.

NVML reports an Xid only as an event to whoever registered before it happened, so the monitor
registers every GPU for the event types it wants and the driver supports, and a daemon thread
waits on the set (``nvmlEventSetWait_v2``, one second at a time, so closing never hangs) and queues
what arrives; :meth:`NvmlEvents.drain` hands the queue to the monitor's cycle, which never waits.
A double-bit ECC event is recorded as Xid 48, which the driver logs for the same fault. When no GPU
supports the wanted events (or the driver has no event API) :meth:`NvmlEvents.start` says so once
and the kernel log stays the Xid source. All calls go through :class:`gpuslurm.hw.nvml_lib.NvmlLibrary`.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

from gpuslurm.errors import GpuslurmError, NotSupported

if TYPE_CHECKING:
    from gpuslurm.hw.identity import AnyGpu

# nvmlEventType* bits (nvml.h, stable ABI)
EVENT_DOUBLE_BIT_ECC = 0x2
EVENT_XID_CRITICAL = 0x8
WANTED = EVENT_DOUBLE_BIT_ECC | EVENT_XID_CRITICAL
NVML_ERROR_TIMEOUT = 10
DBE_XID = 48
MAX_QUEUED = 10_000  # a storm of events cannot grow the monitor without bound


class XidEvent(NamedTuple):
    uuid: str
    code: int


class NvmlEvents:
    """Registers ``gpus`` for Xid and double-bit ECC events and queues them from a thread."""

    def __init__(self, gpus: Sequence[AnyGpu], module: Any | None = None, wait_ms: int = 1000) -> None:
        from gpuslurm.hw.nvml_lib import NvmlLibrary

        self.gpus = list(gpus)
        self.nvml = NvmlLibrary(module)
        self.wait_ms = wait_ms
        self._set: Any = None
        self._uuid_of: dict[int, str] = {}
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
            self._uuid_of[gpu.index] = gpu.uuid
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

    def _event(self, data: Any) -> XidEvent | None:
        try:
            uuid = str(self.nvml.call("nvmlDeviceGetUUID", data.device))
        except GpuslurmError:
            return None
        kind = int(getattr(data, "eventType", 0))
        if kind & EVENT_XID_CRITICAL:
            return XidEvent(uuid, int(getattr(data, "eventData", 0)))
        if kind & EVENT_DOUBLE_BIT_ECC:
            return XidEvent(uuid, DBE_XID)
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
