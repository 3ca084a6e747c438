"""What ``discover`` and ``topo`` show: rows built from the model, tables, JSON (pure)."""

from __future__ import annotations

import json
from typing import IO, Any

from gpuslurm.gres.records import node_core_map
from gpuslurm.hw.model.node import Node
from gpuslurm.jsondoc import document
from gpuslurm.topo.cores import CoreMap, format_ranges


def _cores(cmap: CoreMap | None, cpus: tuple[int, ...]) -> str | None:
    if cmap is None or not cpus:
        return None
    return format_ranges(cmap.slurm_cores(cpus))


def _core_map_or_none(node: Node) -> CoreMap | None:
    return node_core_map(node) if node.cpus else None


def discover_rows(node: Node) -> list[dict[str, Any]]:
    """One row per GPU and per MIG device, in PCI bus order."""
    cmap = _core_map_or_none(node)
    rows: list[dict[str, Any]] = []
    for g in sorted(node.gpus, key=lambda g: g.bus_id):
        cores = _cores(cmap, g.cpu_affinity)
        rows.append({
            "kind": "gpu", "index": g.index, "minor": g.minor, "uuid": g.uuid, "bus_id": g.bus_id,
            "model": g.name, "memory_mib": g.memory_mib, "numa_node": g.numa_node,
            "slurm_cores": cores, "os_cpus": format_ranges(g.cpu_affinity) or None,
            "mig_mode": g.mig_mode, "mig_profile": None,
        })
        for m in g.mig_devices:
            rows.append({
                "kind": "mig", "index": f"{g.index}:{m.index}", "minor": g.minor, "uuid": m.uuid,
                "bus_id": g.bus_id, "model": g.name, "memory_mib": m.memory_mib, "numa_node": g.numa_node,
                "slurm_cores": cores, "os_cpus": format_ranges(g.cpu_affinity) or None,
                "mig_mode": True, "mig_profile": m.profile or None, "gi_id": m.gi_id, "ci_id": m.ci_id,
            })
    return rows


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    return str(value)


def write_table(rows: list[dict[str, Any]], columns: list[tuple[str, str]], fp: IO[str]) -> None:
    """Aligned plain-text table; ``columns`` are (key, heading) pairs."""
    cells = [[_cell(r.get(k)) for k, _ in columns] for r in rows]
    widths = [max([len(h)] + [len(c[i]) for c in cells]) for i, (_, h) in enumerate(columns)]
    fp.write("  ".join(h.ljust(w) for (_, h), w in zip(columns, widths, strict=True)).rstrip() + "\n")
    for c in cells:
        fp.write("  ".join(v.ljust(w) for v, w in zip(c, widths, strict=True)).rstrip() + "\n")


DISCOVER_COLUMNS = [
    ("index", "IDX"), ("minor", "MINOR"), ("uuid", "UUID"), ("bus_id", "BUS ID"), ("model", "MODEL"),
    ("memory_mib", "MEM MiB"), ("numa_node", "NUMA"), ("slurm_cores", "SLURM CORES"),
    ("mig_profile", "MIG"),
]


def write_discover(node: Node, fp: IO[str], as_json: bool = False) -> None:
    rows = discover_rows(node)
    if as_json:
        json.dump(document("discover", {"source": node.source, "driver_version": node.driver_version,
                                        "cuda_version": node.cuda_version, "warnings": list(node.warnings),
                                        "devices": rows}, node.hostname), fp, indent=1)
        fp.write("\n")
        return
    write_table(rows, DISCOVER_COLUMNS, fp)
    _write_warnings(node, fp)


def topo_view(node: Node) -> dict[str, Any]:
    cmap = _core_map_or_none(node)
    labels = [f"GPU{g.index}" for g in node.gpus]
    matrix = None if node.links is None else [[str(c) for c in row] for row in node.links]
    return document("topo", {
        "gpus": [{"label": lab, "uuid": g.uuid, "minor": g.minor, "bus_id": g.bus_id,
                  "numa_node": g.numa_node, "os_cpus": format_ranges(g.cpu_affinity) or None,
                  "slurm_cores": _cores(cmap, g.cpu_affinity)}
                 for lab, g in zip(labels, node.gpus, strict=True)],
        "matrix": matrix,
    }, node.hostname)


def write_topo(node: Node, fp: IO[str], as_json: bool = False) -> None:
    view = topo_view(node)
    if as_json:
        json.dump(view, fp, indent=1)
        fp.write("\n")
        return
    labels = [g["label"] for g in view["gpus"]]
    rows: list[dict[str, Any]] = []
    for i, g in enumerate(view["gpus"]):
        row: dict[str, Any] = {"gpu": g["label"]}
        for j, lab in enumerate(labels):
            row[lab] = view["matrix"][i][j] if view["matrix"] else "?"
        row |= {"os": g["os_cpus"], "cores": g["slurm_cores"], "numa": g["numa_node"]}
        rows.append(row)
    columns = [("gpu", ""), *[(lab, lab) for lab in labels],
               ("os", "CPU Affinity (OS)"), ("cores", "Slurm Cores"), ("numa", "NUMA")]
    write_table(rows, columns, fp)
    if view["matrix"] is None:
        fp.write("\nNo link matrix in this capture (nvidia-smi-topo.txt).\n")
    else:
        fp.write("\nX = self, NV# = # bonded NVLinks, PIX/PXB = PCIe switch(es), PHB = host bridge, "
                 "NODE = same NUMA node, SYS = across sockets.\n")
    _write_warnings(node, fp)


def _write_warnings(node: Node, fp: IO[str]) -> None:
    for w in node.warnings:
        fp.write(f"note: {w}\n")
