"""Writes the nvml.json that the test NVML library (tests/nvml/libnvml_replay.c) serves.

It is :func:`gpuslurm.hw.nvml_json.node_to_dict` plus what the C library needs to answer NVML's
own questions without parsing topology text: per GPU, the NVLinks (remote bus id, or a switch)
and the PCIe common-ancestor level towards every other GPU. The C side validates every field.
"""

from __future__ import annotations

import json
from typing import Any

from gpuslurm.hw.model import LinkKind, Node
from gpuslurm.hw.nvml_json import node_to_dict

__all__ = ["dump_replay", "replay_dict"]

# NVML's nvmlGpuTopologyLevel_t for each PCIe path kind (inverse of nvml.TOPOLOGY_LEVELS)
_LEVELS = {LinkKind.PIX: 10, LinkKind.PXB: 20, LinkKind.PHB: 30, LinkKind.NODE: 40,
           LinkKind.SYS: 50}
MAX_NVLINKS = 18  # NVML_NVLINK_MAX_LINKS


def replay_dict(node: Node, *, driver_version: str | None = None, privileged: bool = True,
                processes: dict[int, list[tuple[int, int]]] | None = None) -> dict[str, Any]:
    """The model as nvml.json with an added ``"replay"`` section for the C library.

    ``driver_version`` replaces the node's (the library's struct layouts follow it);
    ``privileged=False`` makes GPU/compute-instance lookups answer NO_PERMISSION, as NVML does
    for a user who is not root; ``processes`` maps a GPU index to its compute processes as
    (pid, used MiB).
    """
    out = node_to_dict(node)
    if driver_version is not None:
        out["driver_version"] = driver_version
    gpus = node.gpus
    links = node.links
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
        per_gpu.append({"nvlinks": nvlinks, "topology": levels,
                        "processes": [{"pid": pid, "used_mib": mib}
                                      for pid, mib in (processes or {}).get(gpus[a].index, [])]})
    out["replay"] = {"gpus": per_gpu, "privileged": privileged}
    return out


def dump_replay(node: Node, *, driver_version: str | None = None, privileged: bool = True,
                processes: dict[int, list[tuple[int, int]]] | None = None) -> str:
    """:func:`replay_dict` as the text of an nvml.json."""
    return json.dumps(replay_dict(node, driver_version=driver_version, privileged=privileged,
                                  processes=processes), indent=1) + "\n"
