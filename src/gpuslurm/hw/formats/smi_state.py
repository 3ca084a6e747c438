"""The moment an ``nvidia-smi -q -x`` capture recorded: what each GPU was doing (pure).

A capture is a fact about a node at one instant, not only about its hardware: each GPU's
utilisation, memory used, temperature, power draw and the processes holding it. The replay
sampler starts from this state (a scenario moves it on from there), so every view of a replayed
capture shows what the capture shows.

GPUs are matched to the node by PCI bus id, never by UUID: placeholder captures repeat one UUID
and the bundle reader gives the later GPU a synthetic one. Processes keep the name the capture
gives them (the base name of ``process_name``): their PIDs were another machine's, so nothing
may look them up in this machine's ``/proc``. "N/A" and absent fields are None; a value that is
present but malformed or out of range is a CaptureError naming the GPU and the field.
"""

from __future__ import annotations

import math
import re
import xml.etree.ElementTree as ET

from gpuslurm.errors import CaptureError
from gpuslurm.hw.formats.smi_xml import parse_bus_id, xml_root
from gpuslurm.hw.model.node import Node
from gpuslurm.samples import GpuSample, ProcessReading, Reading

__all__ = ["MAX_NAME", "parse_smi_state"]

_NOT_SUPPORTED = frozenset({"N/A", "[N/A]", "Not Supported", "[Not Supported]", "Unknown Error",
                            "[Unknown Error]", "Requested functionality has been deprecated"})
_QUANTITY_RE = re.compile(r"^(\d{1,9}(?:\.\d{1,6})?)\s*(%|C|W|MiB)$")
# upper bounds, as the scenario and the replay NVML library take them
_LIMITS = {"%": 100.0, "C": 1000.0, "W": 1e5, "MiB": float(1 << 24)}
MAX_PID = 1 << 30
MAX_NAME = 64  # characters of a captured process name kept
MAX_PROCS_PER_GPU = 64
# where each DTD keeps the board's power draw, best first (v13 average, v12, v11)
_POWER_PATHS = ("gpu_power_readings/average_power_draw", "gpu_power_readings/power_draw",
                "gpu_power_readings/instant_power_draw", "power_readings/power_draw",
                "power_readings/average_power_draw", "power_readings/instant_power_draw")


def _text(elem: ET.Element, path: str) -> str | None:
    found = elem.find(path)
    if found is None or found.text is None:
        return None
    return found.text.strip()


def _quantity(elem: ET.Element, path: str, unit: str, what: str, source: str) -> float | None:
    text = _text(elem, path)
    if text is None or text in _NOT_SUPPORTED:
        return None
    m = _QUANTITY_RE.match(text)
    if m is None or m.group(2) != unit:
        shown = text if len(text) <= 40 else text[:37] + "..."
        raise CaptureError(f"{what} <{path.rsplit('/', 1)[-1]}> is {shown!r}, expected '<n> {unit}'", source)
    value = float(m.group(1))
    if not math.isfinite(value) or value > _LIMITS[unit]:
        raise CaptureError(f"{what} <{path.rsplit('/', 1)[-1]}> is {text!r}, more than "
                           f"{_LIMITS[unit]:g} {unit}", source)
    return value


def _power(elem: ET.Element, what: str, source: str) -> float | None:
    for path in _POWER_PATHS:
        value = _quantity(elem, path, "W", what, source)
        if value is not None:
            return value
    return None


def _process_name(text: str | None) -> str | None:
    """The base name of a captured process name, printable and bounded; None when it says nothing."""
    if not text or text in _NOT_SUPPORTED:
        return None
    base = text.rstrip("/").rsplit("/", 1)[-1]
    clean = "".join(c if c.isprintable() else "?" for c in base)[:MAX_NAME]
    return clean or None


def _whole(text: str | None, what: str, source: str, most: int) -> int | None:
    if text is None or text in _NOT_SUPPORTED:
        return None
    if not (text.isascii() and text.isdigit() and len(text) <= len(str(most)) and int(text) <= most):
        shown = text if len(text) <= 40 else text[:37] + "..."
        raise CaptureError(f"{what} is {shown!r}, expected a whole number up to {most}", source)
    return int(text)


def parse_smi_state(text: str, source: str, node: Node) -> Reading:
    """The devices and processes ``text`` (``nvidia-smi -q -x``) recorded for ``node``'s GPUs.

    Samples are stamped 0; a GPU of the capture that ``node`` does not have (by bus id) is left
    out, as is a MIG device or process whose MIG device the node does not know by its GPU and
    compute instance ids.
    """
    root = xml_root(text, source)
    by_bus = {g.bus_id: g for g in node.gpus}
    devices: list[GpuSample] = []
    procs: list[ProcessReading] = []
    for pos, elem in enumerate(root.findall("gpu")):
        what = f"<gpu> {pos}"
        bus_text = _text(elem, "pci/pci_bus_id") or elem.get("id")
        gpu = by_bus.get(parse_bus_id(bus_text, f"{what} bus id", source)) if bus_text else None
        if gpu is None:
            continue
        devices.append(GpuSample(
            0.0, gpu.uuid, None,
            _quantity(elem, "utilization/gpu_util", "%", what, source),
            _quantity(elem, "fb_memory_usage/used", "MiB", what, source), float(gpu.memory_mib),
            _power(elem, what, source),
            _quantity(elem, "temperature/gpu_temp", "C", what, source)))
        migs = {(m.gi_id, m.ci_id): m for m in gpu.mig_devices}
        for i, m_elem in enumerate(elem.findall("mig_devices/mig_device")):
            m_what = f"{what} <mig_device> #{i}"
            gi = _whole(_text(m_elem, "gpu_instance_id"), f"{m_what} <gpu_instance_id>", source, 1 << 20)
            ci = _whole(_text(m_elem, "compute_instance_id"), f"{m_what} <compute_instance_id>", source,
                        1 << 20)
            mig = migs.get((gi, ci)) if gi is not None and ci is not None else None
            if mig is None or not mig.uuid:
                continue
            used = _quantity(m_elem, "fb_memory_usage/used", "MiB", m_what, source)
            if used is None:
                used = _quantity(m_elem, "shared_fb_memory_usage/used", "MiB", m_what, source)
            devices.append(GpuSample(0.0, gpu.uuid, mig.uuid, None, used, float(mig.memory_mib)))
        infos = elem.findall("processes/process_info")
        if len(infos) > MAX_PROCS_PER_GPU:
            raise CaptureError(f"{what} lists {len(infos)} processes, more than {MAX_PROCS_PER_GPU}", source)
        for i, p_elem in enumerate(infos):
            p_what = f"{what} <process_info> #{i}"
            pid = _whole(_text(p_elem, "pid"), f"{p_what} <pid>", source, MAX_PID)
            if not pid:
                continue  # nvidia-smi in a container shows processes it cannot see without a PID
            gi = _whole(_text(p_elem, "gpu_instance_id"), f"{p_what} <gpu_instance_id>", source, 1 << 20)
            ci = _whole(_text(p_elem, "compute_instance_id"), f"{p_what} <compute_instance_id>", source,
                        1 << 20)
            mig_uuid = None
            if gi is not None and ci is not None:
                mig = migs.get((gi, ci))
                if mig is None or not mig.uuid:
                    continue
                mig_uuid = mig.uuid
            procs.append(ProcessReading(pid, gpu.uuid, mig_uuid,
                                        _quantity(p_elem, "used_memory", "MiB", p_what, source), None,
                                        _process_name(_text(p_elem, "process_name"))))
    return Reading(tuple(devices), tuple(procs))
