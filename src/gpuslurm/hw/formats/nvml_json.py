"""gpuslurm's own dump of a node (``nvml.json`` in a capture bundle): read and write.

The format is the model itself as JSON, with a version number. Where a bundle holds it, it is
authoritative over the nvidia-smi text captures. Any top-level key may be absent: the bundle
reader then takes that fact from the other files.

    {"format": "gpuslurm-nvml", "version": 1, "hostname": "dgx01",
     "driver_version": "550.54.15", "cuda_version": "12.4", "memory_mib": 2064384,
     "gpus": [{"uuid": "GPU-…", "index": 0, "minor": 0, "bus_id": "00000000:18:00.0",
               "name": "NVIDIA H100 80GB HBM3", "memory_mib": 81559, "numa_node": 0,
               "cpu_affinity": [0, 1, …], "mig_mode": false, "compute_capability": "9.0",
               "mig_devices": [{"index": 0, "gi_id": 1, "ci_id": 0, "profile": "3g.40gb",
                                "memory_mib": 40192, "uuid": "MIG-…", "sm_count": 60,
                                "gi_minor": 12, "ci_minor": 13}]}],
     "links": [["X", "NV18", …], …],
     "cpus": [[os_id, core, socket, numa_node], …]}

``compute_capability`` is not a fact of the model (``nvidia-smi -q -x`` does not carry it): the
capture writes NVML's where it answers, and :func:`read_capabilities` reads it for ``pick
--min-cc`` and ``node-conf``'s ``cc_X.Y`` feature; a GPU without one falls back to the model table
(:mod:`gpuslurm.hw.model.capability`).
"""

from __future__ import annotations

import json

from gpuslurm.errors import CaptureError
from gpuslurm.hw.model.node import Cpu, Gpu, MigDevice, Node, link_from_text
from gpuslurm.ranges import MAX_CPUS, MAX_GPUS
from gpuslurm.safedir import read_regular_text
from gpuslurm.tuples import TYPE_CHECKING

if TYPE_CHECKING:  # annotations only: the hooks that read a cached node do without pathlib
    from pathlib import Path
    from typing import Any

__all__ = ["dump_node", "link_from_text", "load_partial", "node_from_dict", "node_to_dict",
           "read_capabilities"]

FORMAT = "gpuslurm-nvml"
VERSION = 1


def node_to_dict(node: Node, cc: dict[str, tuple[int, int]] | None = None) -> dict[str, Any]:
    """The JSON document; ``cc`` (GPU UUID → compute capability) adds ``compute_capability``."""
    doc: dict[str, Any] = {
        "format": FORMAT,
        "version": VERSION,
        "hostname": node.hostname,
        "driver_version": node.driver_version,
        "cuda_version": node.cuda_version,
        "memory_mib": node.memory_mib,
        "gpus": [
            {
                "uuid": g.uuid, "index": g.index, "minor": g.minor, "bus_id": g.bus_id,
                "name": g.name, "memory_mib": g.memory_mib, "numa_node": g.numa_node,
                "cpu_affinity": list(g.cpu_affinity), "mig_mode": g.mig_mode,
                "mig_devices": [
                    {"index": m.index, "gi_id": m.gi_id, "ci_id": m.ci_id, "profile": m.profile,
                     "memory_mib": m.memory_mib, "uuid": m.uuid, "sm_count": m.sm_count,
                     "gi_minor": m.gi_minor, "ci_minor": m.ci_minor}
                    for m in g.mig_devices
                ],
            }
            for g in node.gpus
        ],
        "links": None if node.links is None else [[str(c) for c in row] for row in node.links],
        "cpus": [[c.os_id, c.core, c.socket, c.numa_node] for c in node.cpus],
    }
    for gpu, item in zip(node.gpus, doc["gpus"], strict=True):
        if cc and gpu.uuid in cc:
            item["compute_capability"] = "{}.{}".format(*cc[gpu.uuid])
    return doc


def dump_node(node: Node, cc: dict[str, tuple[int, int]] | None = None) -> str:
    return json.dumps(node_to_dict(node, cc), indent=1) + "\n"


def read_capabilities(path: Path) -> dict[str, tuple[int, int]]:
    """GPU UUID → compute capability from ``nvml.json``'s ``"compute_capability": "9.0"`` entries;
    GPUs without one are left out. A wrong value is a CaptureError naming the GPU, as in
    :func:`load_partial` (which checks the rest of the file)."""
    raw = _read(path)
    out: dict[str, tuple[int, int]] = {}
    gpus = raw.get("gpus")
    for i, g in enumerate(gpus if isinstance(gpus, list) else ()):
        if not isinstance(g, dict) or g.get("compute_capability") is None:
            continue
        text, uuid = g["compute_capability"], g.get("uuid")
        major, dot, minor = text.partition(".") if isinstance(text, str) else ("", "", "")
        if not (dot and major.isascii() and major.isdigit() and minor.isascii() and minor.isdigit()
                and len(major) <= 2 and len(minor) <= 2 and isinstance(uuid, str)):
            raise CaptureError(f"gpus[{i}].compute_capability: must be \"<major>.<minor>\" such as "
                               f"\"9.0\" on a GPU with a uuid, not {_show(text)}", path)
        out[uuid] = (int(major), int(minor))
    return out


def node_from_dict(raw: Any, source: str) -> Node:
    """The Node a :func:`node_to_dict` document describes, every value checked (CaptureError
    naming ``source`` and the field); used for the hooks' cache of a replayed node."""
    if not isinstance(raw, dict) or raw.get("format") != FORMAT or raw.get("version") != VERSION:
        raise CaptureError("not a gpuslurm node document of this version", source)
    try:
        fields = _partial(raw)
    except _FieldError as exc:
        raise CaptureError(str(exc), source) from None
    if "hostname" not in fields or "gpus" not in fields:
        raise CaptureError("hostname and gpus are missing", source)
    return Node(**fields, source=str(raw.get("source") or source))


def load_partial(path: Path) -> dict[str, Any]:
    """Read ``nvml.json`` and check every value; returns only the keys it holds, as model values.

    Keys returned: any of hostname, driver_version, cuda_version, memory_mib, gpus (tuple[Gpu]),
    links (matrix), cpus (tuple[Cpu]). Any wrong type, out-of-range number, ``NaN``/``Infinity``
    or repeated GPU index, minor or UUID is one CaptureError naming the file and the field.
    """
    raw = _read(path)
    try:
        return _partial(raw)
    except _FieldError as exc:
        raise CaptureError(str(exc), path) from None


def _read(path: Path) -> dict[str, Any]:
    """The checked top level of ``nvml.json`` (format and version); CaptureError otherwise."""
    try:
        raw = json.loads(read_regular_text(str(path)), parse_constant=_no_constant)
    except UnicodeDecodeError as exc:
        raise CaptureError(f"not UTF-8 text (byte {exc.start})", path) from None
    except json.JSONDecodeError as exc:
        raise CaptureError(f"not valid JSON (line {exc.lineno}: {exc.msg})", path) from None
    except ValueError as exc:  # _no_constant's refusal, or a number too long to be one
        raise CaptureError(f"not valid JSON: {exc}", path) from None
    except RecursionError:
        raise CaptureError("not valid JSON: nested too deeply", path) from None
    except OSError as exc:
        raise CaptureError(f"cannot read: {exc.strerror}", path) from None
    if not isinstance(raw, dict) or raw.get("format") != FORMAT:
        raise CaptureError(f"not a gpuslurm NVML dump (expected \"format\": \"{FORMAT}\")", path)
    if raw.get("version") != VERSION:
        raise CaptureError(f"unsupported version {_show(raw.get('version'))} "
                           f"(this gpuslurm reads {VERSION})", path)
    return raw


def _partial(raw: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key in ("hostname", "driver_version", "cuda_version"):
        if raw.get(key) is not None:
            out[key] = _str(raw, key, key)
    if raw.get("memory_mib") is not None:
        out["memory_mib"] = _int(raw, "memory_mib", "memory_mib", 0, _MAX_MIB)
    if raw.get("gpus") is not None:
        gpus = tuple(_gpu(g, f"gpus[{i}]") for i, g in enumerate(_list(raw, "gpus", "gpus")))
        for attr in ("index", "minor", "uuid"):
            seen: set[object] = set()
            for i, g in enumerate(gpus):
                value = getattr(g, attr)
                if value in seen:
                    raise _FieldError(f"gpus[{i}].{attr}: {_show(value)} is used by two GPUs")
                seen.add(value)
        out["gpus"] = gpus
    if raw.get("links") is not None:
        rows = []
        for i, row in enumerate(_list(raw, "links", "links")):
            if not isinstance(row, list) or not all(isinstance(c, str) for c in row):
                raise _FieldError(f"links[{i}]: must be a list of link names such as \"NV4\"")
            try:
                rows.append(tuple(link_from_text(c) for c in row))
            except ValueError as exc:
                raise _FieldError(f"links[{i}]: {exc}") from None
        out["links"] = tuple(rows)
    if raw.get("cpus"):
        cpus = []
        for i, c in enumerate(_list(raw, "cpus", "cpus")):
            where = f"cpus[{i}]"
            if not isinstance(c, list) or len(c) != 4:
                raise _FieldError(f"{where}: must be [cpu, core, socket, numa node]")
            ids = {k: v for k, v in zip(("cpu", "core", "socket", "numa"), c, strict=True)}
            top = MAX_CPUS - 1
            cpus.append(Cpu(_int(ids, "cpu", where, 0, top), _int(ids, "core", where, 0, top),
                            _int(ids, "socket", where, 0, top),
                            _int(ids, "numa", where, 0, top, optional=True)))
        out["cpus"] = tuple(cpus)
    return out


def _gpu(g: Any, where: str) -> Gpu:
    if not isinstance(g, dict):
        raise _FieldError(f"{where}: must be an object, not {_show(g)}")
    return Gpu(
        uuid=_str(g, "uuid", where), index=_int(g, "index", where, 0, MAX_GPUS - 1),
        minor=_int(g, "minor", where, 0, _MAX_MINOR), bus_id=_str(g, "bus_id", where),
        name=_str(g, "name", where), memory_mib=_int(g, "memory_mib", where, 0, _MAX_MIB),
        numa_node=_int(g, "numa_node", where, 0, MAX_CPUS - 1, optional=True),
        cpu_affinity=tuple(_int({"cpu_affinity": c}, "cpu_affinity", where, 0, MAX_CPUS - 1)
                           for c in _list(g, "cpu_affinity", where, optional=True)),
        mig_mode=_bool(g, "mig_mode", where),
        mig_devices=tuple(_mig(m, f"{where}.mig_devices[{i}]")
                          for i, m in enumerate(_list(g, "mig_devices", where, optional=True))),
    )


def _mig(m: Any, where: str) -> MigDevice:
    if not isinstance(m, dict):
        raise _FieldError(f"{where}: must be an object, not {_show(m)}")
    return MigDevice(
        index=_int(m, "index", where, 0, MAX_GPUS - 1), gi_id=_int(m, "gi_id", where, 0, _MAX_MINOR),
        ci_id=_int(m, "ci_id", where, 0, _MAX_MINOR), profile=_str(m, "profile", where),
        memory_mib=_int(m, "memory_mib", where, 0, _MAX_MIB),
        uuid=_str(m, "uuid", where, optional=True),
        sm_count=_int(m, "sm_count", where, 0, 1 << 20, optional=True),
        gi_minor=_int(m, "gi_minor", where, 0, _MAX_MINOR, optional=True),
        ci_minor=_int(m, "ci_minor", where, 0, _MAX_MINOR, optional=True))


_MAX_MIB = 1 << 40  # a mebibyte count beyond any machine (an exbibyte)
_MAX_MINOR = (1 << 20) - 1  # Linux minor numbers are 20 bits


class _FieldError(Exception):
    """One field of nvml.json is wrong; the message names it."""


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a number JSON allows")


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _missing(obj: dict[str, Any], key: str, where: str, optional: bool) -> bool:
    if obj.get(key) is not None:
        return False
    if optional:
        return True
    raise _FieldError(f"{_name(where, key)}: missing")


def _name(where: str, key: str) -> str:
    return key if where == key else f"{where}.{key}"


def _str(obj: dict[str, Any], key: str, where: str, optional: bool = False) -> Any:
    if _missing(obj, key, where, optional):
        return None
    value = obj[key]
    if not isinstance(value, str):
        raise _FieldError(f"{_name(where, key)}: must be a string, not {_show(value)}")
    return value


def _int(obj: dict[str, Any], key: str, where: str, lo: int, hi: int, optional: bool = False) -> Any:
    if _missing(obj, key, where, optional):
        return None
    value = obj[key]
    if not isinstance(value, int) or isinstance(value, bool) or not lo <= value <= hi:
        raise _FieldError(f"{_name(where, key)}: must be a whole number from {lo} to {hi}, "
                          f"not {_show(value)}")
    return value


def _bool(obj: dict[str, Any], key: str, where: str) -> bool | None:
    value = obj.get(key)
    if value is not None and not isinstance(value, bool):
        raise _FieldError(f"{_name(where, key)}: must be true, false or null, not {_show(value)}")
    return value


def _list(obj: dict[str, Any], key: str, where: str, optional: bool = False) -> list[Any]:
    if _missing(obj, key, where, optional):
        return []
    value = obj[key]
    if not isinstance(value, list):
        raise _FieldError(f"{_name(where, key)}: must be a list, not {_show(value)}")
    return value
