"""The replay scenario file (pure): which processes use which GPU, how busy and how full, over time.

A replayed node (a capture bundle) has no live utilisation. The monitor takes it from a scenario
file: ``$GPUSLURM_SCENARIO`` (a file, or a directory holding ``scenario.json``), else
``scenario.json`` beside the bundle's files. No scenario: every GPU idle, with no process.

::

    {"start": 1700000000,
     "steps": [
       {"at": 0,  "gpus": {"GPU-a…": {"util": 90, "mem_mib": 30000, "power_w": 300, "temp_c": 61}},
                  "procs": [{"pid": 1234, "gpu": "GPU-b…", "mem_mib": 5000, "sm": 80}]},
       {"at": 60, "gpus": {"GPU-b…": {"lost": true, "xid": [79]}}},
       {"at": 90, "gpus": {"GPU-a…": {"temp_c": 97, "ecc_uncorrectable": 2}}}]}

Each step describes the whole node from ``start + at`` until the next step: a GPU a step does not
mention is idle (0 %, its processes' memory), one marked ``lost`` has fallen off the bus (the
monitor records that and carries on), and only the processes the step lists exist. ``start``
(Unix seconds) defaults to the file's modification time, so a test that rewrites the file
(atomically) makes its first step begin at once. A file with no ``steps`` is a single step.
Timed faults: ``xid`` lists the Xids a GPU (or, by its UUID, a MIG device's GPU instance) logs
when the step begins (NVML delivers each once as an event; an Xid stays on its GPU, so the health
read of a replayed node reports every Xid logged so far); ``ecc_uncorrectable`` is the GPU's
volatile uncorrectable ECC count from that step on, carried into later steps until one sets it
again, and never lower than before (a volatile count only grows until the GPU is reset); a rise
is a double-bit ECC event. ``temp_c`` over steps is a temperature ramp, ``lost`` a GPU falling
off the bus. :func:`gpuslurm.hw.replay.scenario.health_at` lays a step's faults over
``health.json``'s facts, so the health gate and the monitor see them at the scenario's time, as the
replay NVML library serves them.
``gpu`` may name a MIG device by its UUID. A GPU in MIG mode reports no utilisation, whole or
per process, whatever the scenario says: NVML has none for it (nvidia-smi shows N/A). A UUID
that is neither a GPU nor a MIG device of the bundle is an error naming the file and the entry.
The file is re-read when it changes; a broken rewrite keeps the previous scenario and is
reported as a problem. Every value is bounded (what the replay NVML library accepts too): NaN,
Infinity, a number out of range, a wrong type or text that is not UTF-8 is an error naming the
entry.
"""

from __future__ import annotations

import json
import math
from typing import Any, NamedTuple

from gpuslurm.errors import CaptureError
from gpuslurm.hw.model.node import Node
from gpuslurm.samples import GpuSample, ProcessReading

_GPU_KEYS = {"util": "util_pct", "mem_mib": "mem_used_mib", "power_w": "power_w", "temp_c": "temp_c"}
# upper bounds, as the replay NVML library checks them (tests/hw/nvml/libnvml_replay.c)
_LIMITS = {"util": 100.0, "mem_mib": float(1 << 24), "power_w": 1e5, "temp_c": 1000.0, "sm": 100.0}
_PROC_KEYS = frozenset({"pid", "gpu", "mem_mib", "sm"})
MAX_STEPS = 4096
MAX_PROCS_PER_GPU = 64
MAX_XIDS = 16  # per GPU and step
MAX_XID = 9999
MAX_ECC = 10**9
MAX_SECONDS = 1e10  # 'start' (Unix seconds, year 2286) and 'at'
MAX_PID = 1 << 30


class Step(NamedTuple):
    at: float
    gpus: dict[str, GpuSample]  # by GPU or MIG UUID (lower case): the values the step sets, ts 0
    procs: tuple[ProcessReading, ...] | None  # None: the step lists none ("procs" absent)
    lost: frozenset[str] = frozenset()  # GPU UUIDs (lower case) that fell off the bus
    xids: tuple[tuple[str, str | None, int], ...] = ()  # (GPU UUID, MIG UUID or None, Xid) at ``at``
    ecc: tuple[tuple[str, int], ...] = ()  # (GPU UUID, volatile uncorrectable ECC count) from ``at`` on


class Scenario(NamedTuple):
    start: float | None
    steps: tuple[Step, ...]  # sorted by ``at``


def parse_scenario(text: str, source: str, node: Node) -> Scenario:
    """Parse and check a scenario against ``node`` (pure); CaptureError names the entry at fault."""
    try:
        doc = json.loads(text, parse_constant=_no_constant)
    except ValueError as exc:
        raise CaptureError(f"not valid JSON: {exc}", source=source) from None
    except RecursionError:
        raise CaptureError("not valid JSON: nested too deeply", source=source) from None
    if not isinstance(doc, dict):
        raise CaptureError("must be a JSON object", source=source)
    parents: dict[str, tuple[str, str | None]] = {g.uuid.lower(): (g.uuid, None) for g in node.gpus}
    for g in node.gpus:
        for m in g.mig_devices:
            if m.uuid:
                parents[m.uuid.lower()] = (g.uuid, m.uuid)
    start = doc.get("start")
    if start is not None and not (_is_number(start) and 0 <= start <= MAX_SECONDS):
        raise CaptureError(f"'start' must be Unix seconds, not {_show(start)}", source=source)
    if "steps" in doc:
        if extra := set(doc) - {"start", "steps"}:
            raise CaptureError(f"unknown key {sorted(extra)[0]!r}", source=source)
        raw_steps = doc["steps"]
        if not isinstance(raw_steps, list) or not raw_steps:
            raise CaptureError("'steps' must be a non-empty list", source=source)
        if len(raw_steps) > MAX_STEPS:
            raise CaptureError(f"'steps': more than {MAX_STEPS} steps", source=source)
        where = [f"steps[{i}]" for i in range(len(raw_steps))]
    else:
        raw_steps = [{k: v for k, v in doc.items() if k != "start"}]
        where = [""]
    steps = [_step(item, w, source, parents, node.hostname) for item, w in zip(raw_steps, where, strict=True)]
    ordered = tuple(sorted(steps, key=lambda s: s.at))
    count: dict[str, int] = {}
    for step in ordered:
        for uuid, value in step.ecc:
            if value < count.get(uuid, 0):
                raise CaptureError(f"ecc_uncorrectable of {uuid} falls from {count[uuid]} to {value} at "
                                   f"{step.at:g} s: a volatile count only grows until the GPU is reset",
                                   source=source)
            count[uuid] = value
    return Scenario(None if start is None else float(start), ordered)


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a number JSON allows")


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _label(uuid: Any) -> str:
    """A key from the file, shown safely (it may hold anything)."""
    return uuid if isinstance(uuid, str) and uuid.isascii() and uuid.isprintable() and len(uuid) <= 80 \
        else _show(uuid)


def _unknown(uuid: Any, where: str, source: str, host: str) -> CaptureError:
    return CaptureError(f"{where}: unknown GPU {_show(uuid)}: not a GPU or MIG device of {host}",
                        source=source)


def _step(item: Any, where: str, source: str, parents: dict[str, tuple[str, str | None]],
          host: str) -> Step:
    if not isinstance(item, dict):
        raise CaptureError(f"{where or 'the scenario'} must be an object", source=source)
    if extra := set(item) - {"at", "gpus", "procs"}:
        raise CaptureError(f"{where + ': ' if where else ''}unknown key {_label(sorted(extra)[0])!r}",
                           source=source)
    at = item.get("at", 0)
    if not _is_number(at) or not 0 <= at <= MAX_SECONDS:
        raise CaptureError(f"{where or 'the scenario'}: 'at' must be seconds from the start, not {_show(at)}",
                           source=source)
    gpus: dict[str, GpuSample] = {}
    lost: set[str] = set()
    xids: list[tuple[str, str | None, int]] = []
    ecc: list[tuple[str, int]] = []
    raw_gpus = item.get("gpus", {})
    if not isinstance(raw_gpus, dict):
        raise CaptureError("'gpus' must be an object keyed by GPU UUID", source=f"{source} {where}".strip())
    for uuid, spec in raw_gpus.items():
        here = f"{where}.gpus[{_label(uuid)!r}]".lstrip(".")
        if uuid.lower() not in parents:
            raise _unknown(uuid, f"{where}.gpus".lstrip("."), source, host)
        if not isinstance(spec, dict):
            raise CaptureError(f"{here} must be an object", source=source)
        parent, mig = parents[uuid.lower()]
        values: dict[str, Any] = {}
        for key, value in spec.items():
            if key == "lost":
                if not isinstance(value, bool):
                    raise CaptureError(f"{here}: 'lost' must be true or false", source=source)
                if value:
                    lost.add(uuid.lower())
            elif key in _GPU_KEYS:
                values[_GPU_KEYS[key]] = _measure(value, f"{here}.{key}", source, _LIMITS[key])
            elif key == "xid":
                if not isinstance(value, list) or not 0 < len(value) <= MAX_XIDS:
                    raise CaptureError(f"{here}.xid must be a list of 1 to {MAX_XIDS} Xid codes",
                                       source=source)
                xids += [(parent, mig, _whole(x, f"{here}.xid", source, 1, MAX_XID)) for x in value]
            elif key == "ecc_uncorrectable":
                if mig is not None:
                    raise CaptureError(f"{here}: ecc_uncorrectable is a GPU's count, not a MIG device's",
                                       source=source)
                ecc.append((parent, _whole(value, f"{here}.ecc_uncorrectable", source, 0, MAX_ECC)))
            else:
                raise CaptureError(f"{here}: unknown key {_label(key)!r}", source=source)
        gpus[uuid.lower()] = GpuSample(0.0, uuid, **values)
    if "procs" not in item:
        return Step(float(at), gpus, None, frozenset(lost), tuple(xids), tuple(ecc))
    raw_procs = item["procs"]
    if not isinstance(raw_procs, list):
        raise CaptureError("'procs' must be a list", source=f"{source} {where}".strip())
    procs: list[ProcessReading] = []
    for i, p in enumerate(raw_procs):
        here = f"{where}.procs[{i}]".lstrip(".")
        if not isinstance(p, dict) or "pid" not in p or "gpu" not in p:
            raise CaptureError(f"{here} must be an object with 'pid' and 'gpu'", source=source)
        if extra := set(p) - _PROC_KEYS:
            raise CaptureError(f"{here}: unknown key {_label(sorted(extra)[0])!r}", source=source)
        pid = p["pid"]
        if not isinstance(pid, int) or isinstance(pid, bool) or not 0 < pid <= MAX_PID:
            raise CaptureError(f"{here}: 'pid' must be a process id, not {_show(pid)}", source=source)
        gpu = p["gpu"]
        if not isinstance(gpu, str) or gpu.lower() not in parents:
            raise _unknown(gpu, here, source, host)
        parent, mig = parents[gpu.lower()]
        if sum(1 for q in procs if q.gpu_uuid == parent) >= MAX_PROCS_PER_GPU:
            raise CaptureError(f"{here}: more than {MAX_PROCS_PER_GPU} processes on GPU {parent}",
                               source=source)
        mem = _measure(p["mem_mib"], f"{here}.mem_mib", source, _LIMITS["mem_mib"]) if "mem_mib" in p \
            else None
        sm = _measure(p["sm"], f"{here}.sm", source, _LIMITS["sm"]) if "sm" in p else None
        procs.append(ProcessReading(pid, parent, mig, mem, sm))
    return Step(float(at), gpus, tuple(procs), frozenset(lost), tuple(xids), tuple(ecc))


def _measure(value: Any, where: str, source: str, top: float) -> float:
    if not _is_number(value) or not 0 <= value <= top:
        want = "a percentage (0-100)" if top == 100 else f"a number from 0 to {top:g}"
        raise CaptureError(f"{where} must be {want}, not {_show(value)}", source=source)
    return float(value)


def _whole(value: Any, where: str, source: str, lo: int, hi: int) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not lo <= value <= hi:
        raise CaptureError(f"{where} must be a whole number from {lo} to {hi}, not {_show(value)}",
                           source=source)
    return value


def decode(data: bytes, source: str) -> str:
    """The file's text; not UTF-8 is an error naming the first bad byte."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise CaptureError(f"not UTF-8 text (byte {exc.start})", source=source) from None
