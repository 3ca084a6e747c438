"""gpuslurm's own dump of a node (``nvml.json`` in a capture bundle): read and write.

The format is the model itself as JSON, with a version number. Where a bundle holds it, it is
authoritative over the nvidia-smi text captures. Any top-level key may be absent: the bundle
reader then takes that fact from the other files.

    {"format": "gpuslurm-nvml", "version": 1, "hostname": "dgx01",
     "driver_version": "550.54.15", "cuda_version": "12.4", "memory_mib": 2064384,
     "gpus": [{"uuid": "GPU-…", "index": 0, "minor": 0, "bus_id": "00000000:18:00.0",
               "name": "NVIDIA H100 80GB HBM3", "memory_mib": 81559, "numa_node": 0,
               "cpu_affinity": [0, 1, …], "mig_mode": false,
               "mig_devices": [{"index": 0, "gi_id": 1, "ci_id": 0, "profile": "3g.40gb",
                                "memory_mib": 40192, "uuid": "MIG-…", "sm_count": 60,
                                "gi_minor": 12, "ci_minor": 13}]}],
     "links": [["X", "NV18", …], …],
     "cpus": [[os_id, core, socket, numa_node], …]}
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from gpuslurm.errors import CaptureError
from gpuslurm.hw.model import Cpu, Gpu, MigDevice, Node, link_from_text

__all__ = ["dump_node", "link_from_text", "load_partial", "node_to_dict"]

FORMAT = "gpuslurm-nvml"
VERSION = 1


def node_to_dict(node: Node) -> dict[str, Any]:
    return {
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


def dump_node(node: Node) -> str:
    return json.dumps(node_to_dict(node), indent=1) + "\n"


def load_partial(path: Path) -> dict[str, Any]:
    """Read ``nvml.json`` and check its shape; returns only the keys it holds, as model values.

    Keys returned: any of hostname, driver_version, cuda_version, memory_mib, gpus (tuple[Gpu]),
    links (matrix), cpus (tuple[Cpu]).
    """
    try:
        raw = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise CaptureError(f"not valid JSON (line {exc.lineno}: {exc.msg})", path) from None
    except OSError as exc:
        raise CaptureError(f"cannot read: {exc.strerror}", path) from None
    if not isinstance(raw, dict) or raw.get("format") != FORMAT:
        raise CaptureError(f"not a gpuslurm NVML dump (expected \"format\": \"{FORMAT}\")", path)
    if raw.get("version") != VERSION:
        raise CaptureError(f"unsupported version {raw.get('version')!r} (this gpuslurm reads {VERSION})",
                           path)
    out: dict[str, Any] = {}
    try:
        for key in ("hostname", "driver_version", "cuda_version", "memory_mib"):
            if raw.get(key) is not None:
                out[key] = raw[key]
        if raw.get("gpus") is not None:
            out["gpus"] = tuple(_gpu(g) for g in raw["gpus"])
        if raw.get("links") is not None:
            out["links"] = tuple(tuple(link_from_text(c) for c in row) for row in raw["links"])
        if raw.get("cpus"):
            out["cpus"] = tuple(Cpu(int(a), int(b), int(c), None if d is None else int(d))
                                for a, b, c, d in raw["cpus"])
    except (KeyError, TypeError, ValueError) as exc:
        raise CaptureError(f"malformed entry: {exc}", path) from None
    return out


def _gpu(g: dict[str, Any]) -> Gpu:
    return Gpu(
        uuid=str(g["uuid"]), index=int(g["index"]), minor=int(g["minor"]), bus_id=str(g["bus_id"]),
        name=str(g["name"]), memory_mib=int(g["memory_mib"]),
        numa_node=None if g.get("numa_node") is None else int(g["numa_node"]),
        cpu_affinity=tuple(int(c) for c in g.get("cpu_affinity") or ()),
        mig_mode=g.get("mig_mode"),
        mig_devices=tuple(
            MigDevice(index=int(m["index"]), gi_id=int(m["gi_id"]), ci_id=int(m["ci_id"]),
                      profile=str(m["profile"]), memory_mib=int(m["memory_mib"]), uuid=m.get("uuid"),
                      sm_count=m.get("sm_count"), gi_minor=m.get("gi_minor"), ci_minor=m.get("ci_minor"))
            for m in g.get("mig_devices") or ()
        ),
    )
