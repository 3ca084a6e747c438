"""The NVML event thread against the pynvml stand-in: Xids and double-bit ECC queued, never blocking
a cycle; a driver without events falls back to the kernel log and says so once."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

from fakes import fake_pynvml as fp
from gpuslurm.hw.identity import GpuIdentity
from gpuslurm.hw.nvml_events import EVENT_DOUBLE_BIT_ECC, EVENT_XID_CRITICAL, NvmlEvents, XidEvent

GPUS = [GpuIdentity(fp.uuid(i), i, i, f"00000000:{i:02X}:00.0") for i in range(3)]


@dataclass
class EventfulFake(fp.FakeNvml):
    """The stand-in with NVML's event calls; ``pending`` is what the driver will report."""

    pending: list[tuple[int, int, int]] = field(default_factory=list)  # (gpu, type, data)
    registered: dict[int, int] = field(default_factory=dict)
    freed: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def nvmlEventSetCreate(self) -> object:  # noqa: N802
        self._enter("nvmlEventSetCreate")
        return object()

    def nvmlDeviceGetSupportedEventTypes(self, handle: fp.Handle) -> int:  # noqa: N802
        return int(self._gpu("nvmlDeviceGetSupportedEventTypes", handle).get("events", 0))

    def nvmlDeviceRegisterEvents(self, handle: fp.Handle, types: int, event_set: object) -> None:  # noqa: N802
        self._gpu("nvmlDeviceRegisterEvents", handle)
        self.registered[handle.gpu] = types

    def nvmlEventSetWait_v2(self, event_set: object, timeout_ms: int) -> Any:  # noqa: N802
        with self.lock:
            item = self.pending.pop(0) if self.pending else None
        if item is None:
            time.sleep(min(timeout_ms, 20) / 1000)
            raise fp.NVMLError(10)  # NVML_ERROR_TIMEOUT
        gpu, kind, data = item
        return SimpleNamespace(device=fp.Handle(gpu), eventType=kind, eventData=data)

    def nvmlEventSetFree(self, event_set: object) -> None:  # noqa: N802
        self.freed += 1


def _fake(**kw: Any) -> EventfulFake:
    gpus = [dict(g) for g in fp.dgx_h100()[:3]]
    for i, g in enumerate(gpus):
        g["uuid"] = fp.uuid(i)
        g["events"] = EVENT_XID_CRITICAL | EVENT_DOUBLE_BIT_ECC | 0x4
    return EventfulFake(gpus=gpus, **kw)


def _drain_until(ev: NvmlEvents, n: int) -> list[XidEvent]:
    got: list[XidEvent] = []
    deadline = time.monotonic() + 10
    while len(got) < n and time.monotonic() < deadline:
        got += ev.drain()[0]
        time.sleep(0.01)
    return got


def test_xid_and_dbe_events_reach_the_queue() -> None:
    fake = _fake()
    ev = NvmlEvents(GPUS, module=fake, wait_ms=20)
    assert ev.start() is None
    assert fake.registered == {0: 0xA, 1: 0xA, 2: 0xA}  # only the wanted types, of those supported
    start = time.monotonic()
    assert ev.drain() == ([], [])  # nothing yet, and no wait
    assert time.monotonic() - start < 1.0
    with fake.lock:
        fake.pending += [(1, EVENT_XID_CRITICAL, 79), (2, EVENT_DOUBLE_BIT_ECC, 0), (0, 0x4, 0)]
    got = _drain_until(ev, 2)
    ev.close()
    assert got == [XidEvent(fp.uuid(1), 79), XidEvent(fp.uuid(2), 48)]
    assert fake.freed == 1


def test_no_event_support_says_so_once_and_starts_no_thread() -> None:
    fake = _fake()
    for g in fake.gpus:
        g["events"] = 0x4  # pstate changes only
    ev = NvmlEvents(GPUS, module=fake)
    why = ev.start()
    assert why is not None and "kernel log" in why
    assert ev._thread is None and fake.freed == 1
    old = NvmlEvents(GPUS, module=_fake(absent={"nvmlEventSetCreate"}))
    assert "kernel log" in (old.start() or "")


def test_a_failing_wait_is_a_problem_not_a_crash() -> None:
    fake = _fake(errors={"nvmlEventSetWait_v2": fp.NVML_ERROR_UNKNOWN})
    fake.errors.pop("nvmlEventSetWait_v2")
    ev = NvmlEvents(GPUS, module=fake, wait_ms=20)
    assert ev.start() is None
    fake.errors["nvmlEventSetWait_v2"] = fp.NVML_ERROR_UNKNOWN
    fake.nvmlEventSetWait_v2 = _failing(fake)  # type: ignore[method-assign]
    deadline = time.monotonic() + 10
    problems: list[str] = []
    while not problems and time.monotonic() < deadline:
        problems = ev.drain()[1]
        time.sleep(0.01)
    ev.close()
    assert problems and "event wait failed" in problems[0]


def _failing(fake: EventfulFake) -> Any:
    def wait(event_set: object, timeout_ms: int) -> Any:
        raise fp.NVMLError(fp.NVML_ERROR_UNKNOWN)
    return wait
