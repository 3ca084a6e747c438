"""NVML events through the real pynvml and the replay library: a scenario's timed faults (an Xid,
an ECC count rising, a GPU falling off the bus) delivered once each, at their scenario time, to
whoever registered before; and gpuslurm's event thread (hw/live/nvml_events.py) reading them.

Registration happens at the replay clock's present; the test then moves the library's clock past
the events (``GPUSLURM_NVML_REPLAY_CLOCK``, which the library reads on every call: the process sets
it in its own environment), so nothing depends on how fast the machine is.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tests.helpers.nvml_replay import BUILTIN, LiveNode, MakeLiveNode, scenario_copy

from gpuslurm.hw.replay.bundle import read_bundle

AHEAD = 1000  # seconds from now to the timed events; the clock is moved past them after registering
XID, DBE, UNAVAILABLE, PSTATE = 0x8, 0x2, 0x4000, 0x4
NO_INSTANCE = 0xFFFFFFFF
TIMEOUT, GPU_IS_LOST = 10, 15

# raw pynvml: register every GPU for what it supports, jump the clock, list what arrives
RAW = """
import ctypes, json, os, time
import pynvml as n
n.nvmlInit()
s = n.nvmlEventSetCreate()
index, supported = {}, []
for i in range(n.nvmlDeviceGetCount()):
    h = n.nvmlDeviceGetHandleByIndex(i)
    t = n.nvmlDeviceGetSupportedEventTypes(h)
    supported.append(t)
    n.nvmlDeviceRegisterEvents(h, t, s)
    index[ctypes.cast(h, ctypes.c_void_p).value] = i
os.environ["GPUSLURM_NVML_REPLAY_CLOCK"] = "JUMP"
got = []
while True:
    try:
        d = n.nvmlEventSetWait_v2(s, 300)
    except n.NVMLError as e:
        got.append(["error", e.value])
        if e.value == n.NVML_ERROR_TIMEOUT:
            break
        continue
    got.append([index[ctypes.cast(d.device, ctypes.c_void_p).value], d.eventType, d.eventData,
                d.gpuInstanceId, d.computeInstanceId])
n.nvmlEventSetFree(s)
print(json.dumps({"supported": supported, "got": got}))
"""

# gpuslurm's event thread: start, jump the clock, drain until the thread has had its say
THREAD = """
import json, os, time
from pathlib import Path
from gpuslurm.hw.replay.bundle import read_bundle
from gpuslurm.hw.live.nvml_events import NvmlEvents
ev = NvmlEvents(read_bundle(Path(BUNDLE)).gpus, wait_ms=100)
why = ev.start()
os.environ["GPUSLURM_NVML_REPLAY_CLOCK"] = "JUMP"
events, problems = [], []
deadline = time.monotonic() + 30
while why is None and len(events) + len(problems) < WANT and time.monotonic() < deadline:
    e, p = ev.drain()
    events += [x._asdict() for x in e]
    problems += p
    time.sleep(0.05)
time.sleep(0.5)  # anything more would be a duplicate
e, p = ev.drain()
events += [x._asdict() for x in e]
problems += p
ev.close()
print(json.dumps({"why": why, "events": events, "problems": problems}))
"""


def _run(node: LiveNode, script: str, **subst: Any) -> dict[str, Any]:
    for key, value in {"JUMP": str(AHEAD + 10), **subst}.items():
        script = script.replace(key, str(value))
    out: dict[str, Any] = json.loads(node.python(script))
    return out


def _faults(uuids: list[str]) -> list[dict[str, Any]]:
    """Xid 13 on GPU 0 now (before anyone registered: never delivered); then Xid 79 and the fall
    off the bus on GPU 3, GPU 1's ECC count from 0 to 2 (one double-bit event), its temperature
    ramping, and an Xid 48 on GPU 2, all AHEAD seconds on."""
    return [
        {"at": 0, "gpus": {uuids[0]: {"xid": [13]}, uuids[1]: {"ecc_uncorrectable": 0, "temp_c": 50}}},
        {
            "at": AHEAD,
            "gpus": {uuids[3]: {"xid": [79], "lost": True}, uuids[1]: {"ecc_uncorrectable": 2, "temp_c": 80}},
        },
        {
            "at": AHEAD + 1,
            "gpus": {uuids[3]: {"lost": True}, uuids[1]: {"temp_c": 96}, uuids[2]: {"xid": [48]}},
        },
    ]


def test_timed_events_arrive_once_in_the_r450_layout(live_node: MakeLiveNode, tmp_path: Path) -> None:
    uuids = [g.uuid for g in read_bundle(BUILTIN / "dgx-h100").gpus]
    node = live_node(scenario_copy(tmp_path, BUILTIN / "dgx-h100", _faults(uuids)))
    out = _run(node, RAW)
    ecc_on = XID | PSTATE | DBE | 0x1
    assert out["supported"] == [XID | PSTATE, ecc_on] + [XID | PSTATE] * 6  # ECC events where ECC is on
    assert out["got"] == [
        [3, XID, 79, NO_INSTANCE, NO_INSTANCE],
        [1, DBE, 0, NO_INSTANCE, NO_INSTANCE],
        ["error", GPU_IS_LOST],  # R535 has no event type for it: the wait says so, once
        [2, XID, 48, NO_INSTANCE, NO_INSTANCE],
        ["error", TIMEOUT],  # nothing twice; Xid 13 happened before registration
    ]
    # the same under AddressSanitizer and UBSan (a memory error in the event code aborts)
    sanitized = LiveNode(node.lib.sanitized(), node.bundle, node.nvml_json, node.log, node.config)
    assert _run(sanitized, RAW) == out


def test_the_event_thread_maps_a_lost_gpus_xid_by_its_handle(live_node: MakeLiveNode, tmp_path: Path) -> None:
    gpus = read_bundle(BUILTIN / "dgx-h100").gpus
    bundle = scenario_copy(tmp_path, BUILTIN / "dgx-h100", _faults([g.uuid for g in gpus]))
    out = _run(live_node(bundle), THREAD, BUNDLE=repr(str(bundle)), WANT=4)
    assert out["why"] is None
    # GPU 3 answers GPU_IS_LOST to nvmlDeviceGetUUID: its Xid 79 is still its own
    assert [(e["uuid"], e["code"], e["gpu_instance"], e["lost"]) for e in out["events"]] == [
        (gpus[3].uuid, 79, None, False),
        (gpus[1].uuid, 48, None, False),
        (gpus[2].uuid, 48, None, False),
    ]
    assert len(out["problems"]) == 1 and "GPU is lost" in out["problems"][0]


def test_a_mig_devices_xid_names_its_gpu_instance(live_node: MakeLiveNode, tmp_path: Path) -> None:
    gpus = read_bundle(BUILTIN / "a100-mig").gpus
    parent = next(g for g in gpus if g.mig_mode and len(g.mig_devices) > 1)
    mig = parent.mig_devices[1]
    assert mig.uuid is not None and mig.gi_id != mig.ci_id
    bundle = scenario_copy(
        tmp_path, BUILTIN / "a100-mig", [{"at": AHEAD, "gpus": {mig.uuid: {"xid": [31, 94]}}}]
    )
    node = live_node(bundle)
    raw = _run(node, RAW)
    assert raw["got"] == [
        [parent.index, XID, 31, mig.gi_id, mig.ci_id],
        [parent.index, XID, 94, mig.gi_id, mig.ci_id],
        ["error", TIMEOUT],
    ]
    out = _run(node, THREAD, BUNDLE=repr(str(bundle)), WANT=2)
    assert [(e["uuid"], e["code"], e["gpu_instance"]) for e in out["events"]] == [
        (parent.uuid, 31, mig.gi_id),
        (parent.uuid, 94, mig.gi_id),
    ]


def test_r565_reports_the_fall_off_the_bus_as_an_event(live_node: MakeLiveNode, tmp_path: Path) -> None:
    gpus = read_bundle(BUILTIN / "l40s-4x").gpus
    bundle = scenario_copy(
        tmp_path, BUILTIN / "l40s-4x", [{"at": AHEAD, "gpus": {gpus[2].uuid: {"xid": [79], "lost": True}}}]
    )
    node = live_node(bundle, driver_version="570.86.15")
    raw = _run(node, RAW)
    assert raw["supported"][2] == XID | PSTATE | UNAVAILABLE | 0x8000
    assert raw["got"] == [
        [2, XID, 79, NO_INSTANCE, NO_INSTANCE],
        [2, UNAVAILABLE, 0, NO_INSTANCE, NO_INSTANCE],
        ["error", TIMEOUT],
    ]
    out = _run(node, THREAD, BUNDLE=repr(str(bundle)), WANT=2)
    assert [(e["code"], e["lost"]) for e in out["events"]] == [(79, False), (0, True)]
    assert out["problems"] == []


def test_before_r450_the_wait_writes_the_short_struct(live_node: MakeLiveNode, tmp_path: Path) -> None:
    gpus = read_bundle(BUILTIN / "l40s-4x").gpus
    bundle = scenario_copy(
        tmp_path, BUILTIN / "l40s-4x", [{"at": AHEAD, "gpus": {gpus[1].uuid: {"xid": [79]}}}]
    )
    node = live_node(bundle, driver_version="440.64.00")
    out = _run(node, THREAD, BUNDLE=repr(str(bundle)), WANT=1)
    assert out["why"] is not None and "R450" in out["why"] and "kernel log" in out["why"]
    # the unversioned wait a pre-R450 driver exports: 24 bytes, no instance ids
    short = node.python(
        RAW.replace("n.nvmlEventSetWait_v2(s, 300)", "wait(s)")
        .replace("d.gpuInstanceId, d.computeInstanceId", "d.tail")
        .replace("n.nvmlInit()", V1_WAIT + "n.nvmlInit()")
        .replace("JUMP", str(AHEAD + 10))
    )
    assert json.loads(short)["got"] == [
        [1, XID, 79, 0xA5A5A5A5A5A5A5A5],
        ["error", TIMEOUT],
    ]  # the tail untouched


V1_WAIT = """
class V1(ctypes.Structure):
    _fields_ = [("device", n.c_nvmlDevice_t), ("eventType", ctypes.c_ulonglong),
                ("eventData", ctypes.c_ulonglong), ("tail", ctypes.c_ulonglong)]
def wait(s):
    d = V1(tail=0xA5A5A5A5A5A5A5A5)
    r = n._nvmlGetFunctionPointer("nvmlEventSetWait")(s, ctypes.byref(d), ctypes.c_uint(300))
    if r:
        raise n.NVMLError(r)
    return d
"""


def test_a_driver_without_the_event_api(live_node: MakeLiveNode, tmp_path: Path) -> None:
    gpus = read_bundle(BUILTIN / "l40s-4x").gpus
    bundle = scenario_copy(
        tmp_path, BUILTIN / "l40s-4x", [{"at": AHEAD, "gpus": {gpus[1].uuid: {"xid": [79]}}}]
    )
    plain = live_node(bundle)
    for missing, said in (
        (("nvmlEventSetCreate",), "nvmlEventSetCreate"),
        (("nvmlDeviceRegisterEvents", "nvmlDeviceGetSupportedEventTypes"), "no GPU supports"),
    ):
        node = LiveNode(plain.lib.without(*missing), plain.bundle, plain.nvml_json, plain.log, plain.config)
        out = _run(node, THREAD, BUNDLE=repr(str(bundle)), WANT=1)
        assert said in out["why"] and "kernel log" in out["why"] and out["events"] == []


def test_a_failing_wait_is_a_problem_not_a_crash(live_node: MakeLiveNode, tmp_path: Path) -> None:
    """The set freed under the thread: the library answers INVALID_ARGUMENT to every wait."""
    bundle = scenario_copy(tmp_path, BUILTIN / "l40s-4x", [{"at": AHEAD, "gpus": {}}])
    script = THREAD.replace(
        'os.environ["GPUSLURM_NVML_REPLAY_CLOCK"] = "JUMP"', 'ev.nvml.call("nvmlEventSetFree", ev._set)'
    )
    out = _run(live_node(bundle), script, BUNDLE=repr(str(bundle)), WANT=1)
    assert out["events"] == [] and len(out["problems"]) == 1  # said once per 5 s, not in a spin
    assert "event wait failed" in out["problems"][0]
