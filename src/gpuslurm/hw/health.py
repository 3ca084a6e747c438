"""Per-GPU health facts for the hooks' health gate: from NVML, or from a replay scenario.

A replayed node (``--from``/``GPUSLURM_CAPTURE``) takes its health from ``health.json`` beside
the bundle's other files, keyed by GPU UUID (and the bundle's replay scenario, when it has one,
adds its timed faults: :func:`gpuslurm.hw.scenario.health_at`)::

    {"GPU-…": {"lost": false, "xid": [79], "temperature_c": 95, "ecc_uncorrectable": 0,
               "retired_pages_pending": false, "remap_pending": false, "remap_failed": false,
               "memory_used_mib": 0, "processes": [{"pid": 4242, "user": "alice", "used_mib": 900}],
               "clock_events": ["hw_thermal"]}}

Every key is optional; a GPU or key the file does not mention is unknown, and unknown facts never
fail a check. No ``health.json`` means nothing is known. An unknown key is an error, so a typo
cannot silently turn a check off.

Live, NVML gives temperature, volatile uncorrectable ECC, row remapping (or retired pages on
older GPUs), used memory, the processes on each GPU and why its clocks are held down
(``clock_events``, NVML's clock event reasons by name, :data:`CLOCK_EVENTS`). Xid errors are not
kept by NVML for a one-shot query (they arrive as events), so live Xids are left to the monitor.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence

from gpuslurm.errors import CaptureError, HardwareError, NotSupported
from gpuslurm.hw.procfs import PROC_ROOT, owner_uid
from gpuslurm.safedir import read_regular
from gpuslurm.tuples import TYPE_CHECKING, NamedTuple

if TYPE_CHECKING:
    from typing import Any

    from gpuslurm.hw.model import Gpu
    from gpuslurm.hw.source import HardwareSource

SCENARIO_FILE = "health.json"
MAX_SCENARIO_BYTES = 1 << 20

# nvml.h enums (stable ABI)
NVML_TEMPERATURE_GPU = 0
NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 1
NVML_VOLATILE_ECC = 0
NVML_FEATURE_ENABLED = 1
MIB = 1024 * 1024
# nvmlClocksEventReason* bits (nvml.h), by the names health.json and status use
CLOCK_EVENTS = {
    "gpu_idle": 0x1, "applications_clocks": 0x2, "sw_power_cap": 0x4, "hw_slowdown": 0x8,
    "sync_boost": 0x10, "sw_thermal": 0x20, "hw_thermal": 0x40, "hw_power_brake": 0x80,
    "display_clocks": 0x100, "board_limit": 0x200, "reliability": 0x400,
}
# the reasons that mean the GPU is slowed by a fault or its cooling, not by policy or idleness
SLOWDOWNS = ("hw_slowdown", "sw_thermal", "hw_thermal", "hw_power_brake")


class GpuProcess(NamedTuple):
    """A process holding a context on a GPU."""

    pid: int
    user: str | None = None  # None when its owner could not be named
    used_mib: int | None = None


class GpuHealth(NamedTuple):
    """What is known about one GPU's health right now; ``None`` means unknown."""

    uuid: str
    lost: bool = False
    error: str | None = None  # why the facts could not be read (treated as lost)
    xid: tuple[int, ...] = ()  # Xid errors logged since the last check
    temperature_c: int | None = None
    ecc_uncorrectable: int | None = None  # volatile count
    retired_pages_pending: bool | None = None
    remap_pending: bool | None = None
    remap_failed: bool | None = None
    memory_used_mib: int | None = None
    processes: tuple[GpuProcess, ...] | None = None
    clock_events: tuple[str, ...] | None = None  # active clock event reasons (CLOCK_EVENTS names)


_BOOL_KEYS = ("lost", "retired_pages_pending", "remap_pending", "remap_failed")
_INT_KEYS = ("temperature_c", "ecc_uncorrectable", "memory_used_mib")


def read_health(gpus: Sequence[Gpu], source: HardwareSource, *,
                captured: bool = False) -> dict[str, GpuHealth]:
    """Health of ``gpus`` (physical GPUs) keyed by UUID, from ``source``'s bundle or NVML.

    ``captured``: a GPU's temperature that ``health.json`` does not give is the one the bundle's
    ``nvidia-smi -q -x`` recorded, as the replay NVML library serves it (the commands and the
    monitor; the hooks read ``health.json`` alone and stay free of the XML parser).
    """
    bundle = source.bundle
    if bundle is None:
        return NvmlHealthReader().read(gpus)
    facts = read_scenario(os.path.join(bundle, SCENARIO_FILE), [g.uuid for g in gpus])
    if captured:
        facts = _captured_temperatures(bundle, source, facts)
    return _timed(bundle, source, facts)


def _captured_temperatures(bundle: str, source: HardwareSource,
                           facts: dict[str, GpuHealth]) -> dict[str, GpuHealth]:
    import math  # not at the top: the hooks' warm path imports this module (test_placement_cache)
    from pathlib import Path

    from gpuslurm.hw.bundle import read_captured_state

    node = _nodes.get(bundle) or _nodes.setdefault(bundle, source.node(links=False))
    state = read_captured_state(Path(bundle), node)
    temps = {d.gpu_uuid: d.temp_c for d in state.devices if d.mig_uuid is None} if state else {}
    out = {}
    for uuid, fact in facts.items():
        temp = temps.get(uuid)
        if fact.temperature_c is None and not fact.lost and temp is not None:
            fact = fact._replace(temperature_c=math.floor(temp + 0.5))  # NVML's whole degrees
        out[uuid] = fact
    return out


def _timed(bundle: str, source: HardwareSource, facts: dict[str, GpuHealth]) -> dict[str, GpuHealth]:
    """``facts`` with the replay scenario's timed faults now (Xids, ECC, temperature, lost GPUs),
    when the bundle has a scenario (:func:`gpuslurm.hw.scenario.health_at`)."""
    if not os.environ.get("GPUSLURM_SCENARIO") and not os.path.isfile(os.path.join(bundle, "scenario.json")):
        return facts  # the hooks' usual case: nothing heavy imported (tests/hooks/test_cache.py)
    from pathlib import Path

    from gpuslurm.hw.scenario import health_at, load_scenario, scenario_path

    path = scenario_path(Path(bundle))
    if path is None:
        return facts
    import time

    try:
        st = os.stat(path)
    except OSError as exc:
        raise CaptureError(f"cannot read: {exc.strerror}", source=path) from None
    # the monitor reads health every cycle: parse the bundle once, the scenario when it changes
    stamp = (str(path), st.st_mtime_ns, st.st_size, st.st_ino)
    cached = _scenarios.get(bundle)
    if cached is None or cached[0] != stamp:
        node = _nodes.get(bundle) or _nodes.setdefault(bundle, source.node(links=False))
        cached = _scenarios[bundle] = (stamp, *load_scenario(path, node))
    return health_at(cached[1], cached[2], time.time(), facts)


_nodes: dict[str, Any] = {}  # bundle path -> Node
_scenarios: dict[str, tuple[tuple[str, int, int, int], Any, float]] = {}  # bundle -> (stamp, Scenario, start)


def read_scenario(path: str | os.PathLike[str], uuids: Sequence[str]) -> dict[str, GpuHealth]:
    """Facts for ``uuids`` from a ``health.json`` scenario; all unknown when the file is absent."""
    try:
        data = read_regular(os.fspath(path), MAX_SCENARIO_BYTES)  # a FIFO here hung the prolog
    except FileNotFoundError:
        return {u: GpuHealth(u) for u in uuids}
    except OSError as exc:
        raise CaptureError(f"cannot read: {exc.strerror}", source=path) from None
    return parse_scenario(data.decode("utf-8", "replace"), os.fspath(path), uuids)


def parse_scenario(text: str, source: str, uuids: Sequence[str]) -> dict[str, GpuHealth]:
    """Parse a ``health.json`` text (pure); every entry is validated, wanted or not."""
    try:
        doc = json.loads(text)
    except ValueError as exc:
        raise CaptureError(f"not valid JSON: {exc}", source=source) from None
    if not isinstance(doc, dict):
        raise CaptureError("must be a JSON object keyed by GPU UUID", source=source)
    parsed = {key.lower(): _entry(key, value, source) for key, value in doc.items()}
    return {u: parsed[u.lower()]._replace(uuid=u) if u.lower() in parsed else GpuHealth(u)
            for u in uuids}


def _entry(uuid: str, value: Any, source: str) -> GpuHealth:
    name = uuid if uuid.isascii() and uuid.isprintable() else repr(uuid)  # a key may hold anything
    if not isinstance(value, dict):
        raise CaptureError(f"{name}: must be an object", source=source)
    fields: dict[str, Any] = {}
    for key, item in value.items():
        where = f"{name}: {key!r}"
        if key in _BOOL_KEYS:
            if not isinstance(item, bool):
                raise CaptureError(f"{where} must be true or false", source=source)
            fields[key] = item
        elif key in _INT_KEYS:
            fields[key] = _int(item, where, source)
        elif key == "xid":
            if not isinstance(item, list):
                raise CaptureError(f"{where} must be a list of Xid codes", source=source)
            fields[key] = tuple(_int(x, where, source) for x in item)
        elif key == "clock_events":
            if not isinstance(item, list) or any(x not in CLOCK_EVENTS for x in item):
                raise CaptureError(f"{where} must be a list of {', '.join(CLOCK_EVENTS)}", source=source)
            fields[key] = tuple(sorted(set(item), key=list(CLOCK_EVENTS).index))
        elif key == "processes":
            if not isinstance(item, list):
                raise CaptureError(f"{where} must be a list of processes", source=source)
            fields[key] = tuple(_process(p, where, source) for p in item)
        else:
            raise CaptureError(f"{name}: unknown key {key!r}", source=source)
    return GpuHealth(uuid, **fields)


def _process(item: Any, where: str, source: str) -> GpuProcess:
    if not isinstance(item, dict) or "pid" not in item:
        raise CaptureError(f"{where}: each process must be an object with a pid", source=source)
    if extra := set(item) - {"pid", "user", "used_mib"}:
        raise CaptureError(f"{where}: unknown process key {sorted(extra)[0]!r}", source=source)
    user = item.get("user")
    if user is not None and not isinstance(user, str):
        raise CaptureError(f"{where}: a process user must be a string", source=source)
    used = item.get("used_mib")
    return GpuProcess(_int(item["pid"], where, source), user,
                      None if used is None else _int(used, where, source))


def _int(item: Any, where: str, source: str) -> int:
    if not isinstance(item, int) or isinstance(item, bool) or item < 0:
        raise CaptureError(f"{where} must be a whole number, not {item!r}", source=source)
    return item


class NvmlHealthReader:
    """Reads health facts through an NVML backend (``module``: ``pynvml`` or a stand-in).

    It holds the backend rather than being one so that replaying never imports the NVML module.
    """

    def __init__(self, module: Any | None = None) -> None:
        from gpuslurm.hw.nvml_lib import NvmlLibrary

        nvml = NvmlLibrary(module)
        self._call = nvml.call
        self._optional = nvml.optional
        self._running = nvml.running_processes
        self._memory = nvml.memory_info
        self._first = nvml.first

    def read(self, gpus: Sequence[Gpu]) -> dict[str, GpuHealth]:
        from gpuslurm.hw.nvml_lib import GpuLost

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


def clock_event_names(reasons: int) -> tuple[str, ...]:
    """The names of the clock event reason bits set in ``reasons`` (unknown bits are left out)."""
    return tuple(name for name, bit in CLOCK_EVENTS.items() if reasons & bit)


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

