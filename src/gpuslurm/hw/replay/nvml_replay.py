"""Writes the nvml.json that the test NVML library (tests/hw/nvml/libnvml_replay.c) serves.

It is :func:`gpuslurm.hw.formats.nvml_json.node_to_dict` plus what the C library needs to answer NVML's
own questions without parsing topology text or scenarios: per GPU, the NVLinks (remote bus id, or
a switch), the PCIe common-ancestor level towards every other GPU and the health facts of a
``health.json``; and the scenario's steps as NVML would report them (what
:func:`gpuslurm.hw.replay.scenario.readings` gives the replay sampler), at absolute times. The C side
validates every field. A step's timed faults become NVML events (``"events"``: GPU position, MIG
slot, ``nvmlEventType`` bit, data) and its ECC count ``"ecc_uncorrectable"`` on the GPU's entry.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from gpuslurm.hw.formats.nvml_json import node_to_dict
from gpuslurm.hw.formats.scenario import Scenario
from gpuslurm.hw.model.health import CLOCK_EVENTS, GpuHealth
from gpuslurm.hw.model.node import LinkKind, Node
from gpuslurm.hw.replay.scenario import readings
from gpuslurm.samples import Reading

__all__ = ["dump_replay", "replay_dict"]

# NVML's nvmlGpuTopologyLevel_t for each PCIe path kind (inverse of nvml.TOPOLOGY_LEVELS)
_LEVELS = {LinkKind.PIX: 10, LinkKind.PXB: 20, LinkKind.PHB: 30, LinkKind.NODE: 40,
           LinkKind.SYS: 50}
MAX_NVLINKS = 18  # NVML_NVLINK_MAX_LINKS
# nvmlEventType* bits (nvml.h)
EVENT_DBE = 0x2
EVENT_XID = 0x8
EVENT_GPU_UNAVAILABLE = 0x4000


def replay_dict(node: Node, *, driver_version: str | None = None, privileged: bool = True,
                processes: Mapping[int, list[tuple[int, int | None]]] | None = None,
                health: Mapping[str, GpuHealth] | None = None, reserved_mib: Mapping[int, int] | None = None,
                scenario: Scenario | None = None, start: float = 0.0,
                captured: Reading | None = None) -> dict[str, Any]:
    """The model as nvml.json with an added ``"replay"`` section for the C library.

    ``driver_version`` replaces the node's (the library's struct layouts and entry points follow
    it); ``privileged=False`` makes GPU/compute-instance lookups answer NO_PERMISSION, as NVML
    does for a user who is not root; ``processes`` maps a GPU index to the compute processes it
    has before any scenario step, as (pid, used MiB or None); ``health`` gives each GPU's facts by UUID
    (:func:`gpuslurm.hw.replay.health.read_scenario`); ``reserved_mib`` the driver's reserved memory
    per GPU index (memory v1's "used" includes it, v2's does not); ``scenario`` its steps, the
    first beginning at ``start`` (Unix seconds); ``captured`` the state the bundle's capture
    recorded (:func:`gpuslurm.hw.replay.bundle.read_captured_state`), served from the epoch until the
    first step and carried into the steps as the replay sampler carries it: utilisation, memory
    used, temperature, power and processes (NVML has no process names).
    """
    out = node_to_dict(node)
    if driver_version is not None:
        out["driver_version"] = driver_version
    gpus = node.gpus
    links = node.links
    facts = {k.lower(): v for k, v in (health or {}).items()}
    per_gpu: list[dict[str, Any]] = []
    for a in range(len(gpus)):
        levels: list[int] = []
        nvlinks: list[str] = []
        row = links[a] if links is not None else ()
        nv = {b: link.nvlinks or 1 for b, link in enumerate(row)
              if b != a and link.kind is LinkKind.NVLINK}
        # All peers at one count and more links than one GPU has: an NVSwitch fabric.
        switched = len(nv) > 1 and len(set(nv.values())) == 1 and sum(nv.values()) > MAX_NVLINKS
        if switched:
            nvlinks = ["switch"] * min(next(iter(nv.values())), MAX_NVLINKS)
        else:
            for b, count in sorted(nv.items()):
                nvlinks += [gpus[b].bus_id] * count
            nvlinks = nvlinks[:MAX_NVLINKS]
        for b in range(len(gpus)):
            kind = row[b].kind if b < len(row) else LinkKind.UNKNOWN
            levels.append(_LEVELS.get(kind, 0 if b == a else -1))
        entry: dict[str, Any] = {"nvlinks": nvlinks, "topology": levels}
        fact = facts.get(gpus[a].uuid.lower())
        reserved = (reserved_mib or {}).get(gpus[a].index)
        if fact is not None or reserved is not None:
            entry["health"] = _health(fact, reserved)
        per_gpu.append(entry)
    base = [{"gpu": pos, "mig": -1, "pid": pid, "used_mib": mib}
            for pos, g in enumerate(gpus) for pid, mib in (processes or {}).get(g.index, [])]
    steps = _steps(node, scenario, start, facts, captured) if scenario is not None else []
    if captured is not None:  # in force from the epoch until the scenario's first step
        steps.insert(0, _captured_step(node, captured, base, facts))
    out["replay"] = {"gpus": per_gpu, "privileged": privileged, "processes": base, "steps": steps}
    return out


def _captured_step(node: Node, captured: Reading, processes: list[dict[str, Any]],
                   facts: Mapping[str, GpuHealth]) -> dict[str, Any]:
    """The capture's state as the library's first step. Given ``processes`` (a test's, as the base
    state holds them) replace the capture's, and ``health.json``'s memory used and temperature
    win over the capture's figures, as they do before any step."""
    step = _served(node, readings(node, None, captured=captured), 0.0, [])
    said = {pos: facts.get(g.uuid.lower()) for pos, g in enumerate(node.gpus)}
    for d in step["devices"]:
        fact = said.get(d["gpu"]) if d["mig"] < 0 else None
        if processes:  # memory used is then theirs, as before any step
            del d["mem_used_mib"]
        if fact is not None and fact.memory_used_mib is not None:
            d["mem_used_mib"] = fact.memory_used_mib
        if fact is not None and fact.temperature_c is not None:
            d["temp_c"] = fact.temperature_c
    if processes:
        step["processes"] = processes
    return step


def _health(fact: GpuHealth | None, reserved: int | None) -> dict[str, Any]:
    out: dict[str, Any] = {} if reserved is None else {"memory_reserved_mib": reserved}
    if fact is None:
        return out
    out.update(temperature_c=fact.temperature_c, ecc_uncorrectable=fact.ecc_uncorrectable,
               retired_pages_pending=fact.retired_pages_pending, memory_used_mib=fact.memory_used_mib,
               lost=fact.lost)
    if fact.clock_events is not None:
        out["clock_event_reasons"] = sum(CLOCK_EVENTS[name] for name in set(fact.clock_events))
    if fact.remap_pending is not None or fact.remap_failed is not None:
        out.update(remap_pending=bool(fact.remap_pending), remap_failed=bool(fact.remap_failed))
    return out


def _where(node: Node) -> dict[str, tuple[int, int]]:
    """GPU or MIG UUID -> (GPU position, MIG slot or -1)."""
    where: dict[str, tuple[int, int]] = {}
    for pos, g in enumerate(node.gpus):
        where[g.uuid] = (pos, -1)
        for slot, m in enumerate(g.mig_devices):
            if m.uuid:
                where[m.uuid] = (pos, slot)
    return where


def _served(node: Node, reading: Reading, at: float, devices: list[dict[str, Any]],
            ecc: Mapping[str, int | None] | None = None,
            events: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """One step of the library's ``steps``: ``reading``'s devices after ``devices`` (lost ones)."""
    where = _where(node)
    ecc = ecc or {}
    for d in reading.devices:
        pos, mig = where[d.mig_uuid or d.gpu_uuid]
        devices.append({"gpu": pos, "mig": mig, "util": d.util_pct, "mem_used_mib": d.mem_used_mib,
                        "power_w": d.power_w, "temp_c": d.temp_c,
                        **({"ecc_uncorrectable": ecc[d.gpu_uuid]}
                           if mig < 0 and ecc.get(d.gpu_uuid) is not None else {})})
    procs = [{"gpu": where[p.gpu_uuid][0], "mig": where[p.mig_uuid][1] if p.mig_uuid else -1,
              "pid": p.pid, "used_mib": p.mem_mib, "sm": p.sm_util_pct} for p in reading.processes]
    return {"at": at, "devices": devices, "processes": procs, "events": events or []}


def _steps(node: Node, scenario: Scenario, start: float,
           facts: Mapping[str, GpuHealth], captured: Reading | None = None) -> list[dict[str, Any]]:
    """Each step as NVML serves it, with its ``events``: the Xids it logs, a double-bit ECC event
    where the ECC count rises, and a GPU falling off the bus (nvmlEventTypeGpuUnavailableError;
    the library answers GPU_IS_LOST to a set not registered for it)."""
    where = _where(node)
    base = {g.uuid: facts.get(g.uuid.lower()) for g in node.gpus}
    ecc: dict[str, int | None] = {u: f.ecc_uncorrectable if f is not None else None for u, f in base.items()}
    was_lost = {u for u, f in base.items() if f is not None and f.lost}
    steps: list[dict[str, Any]] = []
    for step in scenario.steps:
        reading = readings(node, step, captured=captured)
        lost = {uuid for kind, uuid, _ in reading.problems if kind == "gpu-lost"}
        devices: list[dict[str, Any]] = [{"gpu": where[uuid][0], "mig": -1, "lost": True}
                                         for uuid in sorted(lost)]
        events: list[dict[str, Any]] = [
            {"gpu": where[parent][0], "mig": where[mig][1] if mig else -1, "type": EVENT_XID, "data": code}
            for parent, mig, code in step.xids]
        for parent, count in step.ecc:
            if count > (ecc[parent] or 0):
                events.append({"gpu": where[parent][0], "mig": -1, "type": EVENT_DBE, "data": 0})
            ecc[parent] = count
        events += [{"gpu": where[uuid][0], "mig": -1, "type": EVENT_GPU_UNAVAILABLE, "data": 0}
                   for uuid in sorted(lost - was_lost)]
        was_lost = lost | {u for u, f in base.items() if f is not None and f.lost}
        steps.append(_served(node, reading, start + step.at, devices, ecc, events))
    return steps


def dump_replay(node: Node, *, driver_version: str | None = None, privileged: bool = True,
                processes: Mapping[int, list[tuple[int, int | None]]] | None = None,
                health: Mapping[str, GpuHealth] | None = None, reserved_mib: Mapping[int, int] | None = None,
                scenario: Scenario | None = None, start: float = 0.0, captured: Reading | None = None) -> str:
    """:func:`replay_dict` as the text of an nvml.json."""
    return json.dumps(replay_dict(node, driver_version=driver_version, privileged=privileged,
                                  processes=processes, health=health, reserved_mib=reserved_mib,
                                  scenario=scenario, start=start, captured=captured), indent=1) + "\n"
