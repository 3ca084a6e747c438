"""Small synthetic nodes for the placement tests, and the bundles made from them (tests/place/data).

``python tests/helpers/place_nodes.py`` rewrites the bundles; test_bundles_match_generator keeps
the committed files and this code in step.
"""

from __future__ import annotations

import sys
from pathlib import Path

from gpuslurm.hw.model.node import Cpu, Gpu, Link, Node, link_from_text

DATA = Path(__file__).resolve().parents[1] / "place" / "data"


def make_node(name: str, matrix: list[str], numa: list[int], *, gpu_name: str = "NVIDIA A100-SXM4-40GB",
              memory_mib: int = 40960, cpus_per_numa: int = 8) -> Node:
    """A node from a topo-style matrix (rows of space-separated cells) and each GPU's NUMA node."""
    links: tuple[tuple[Link, ...], ...] = tuple(tuple(link_from_text(c) for c in row.split())
                                                for row in matrix)
    nodes = sorted(set(numa))
    cpus = tuple(Cpu(n * cpus_per_numa + i, n * cpus_per_numa + i, n, n)
                 for n in nodes for i in range(cpus_per_numa))
    gpus = tuple(Gpu(uuid=f"GPU-{name}-{i:04d}-0000-0000-000000000000", index=i, minor=i,
                     bus_id=f"00000000:{0x10 + i:02X}:00.0", name=gpu_name, memory_mib=memory_mib,
                     numa_node=numa[i], mig_mode=False,
                     cpu_affinity=tuple(range(numa[i] * cpus_per_numa, (numa[i] + 1) * cpus_per_numa)))
                 for i in range(len(numa)))
    return Node(hostname=name, gpus=gpus, cpus=cpus, links=links, source=f"synthetic:{name}")


# Two NVLink-bonded pairs (0-1, 2-3) on one socket; between the pairs only PCIe.
NVL_PAIRS = make_node("nvl-pairs-4x", [
    "X   NV4 PXB PHB",
    "NV4 X   PHB PXB",
    "PXB PHB X   NV4",
    "PHB PXB NV4 X",
], [0, 0, 0, 0])

# A PCIe switch tree, no NVLink: pairs under one switch (PIX), two switches per socket (PXB),
# two host bridges per socket (NODE), two sockets (SYS).
PCIE_TREE = make_node("pcie-tree-8x", [
    "X   PIX PXB PXB SYS SYS SYS SYS",
    "PIX X   PXB PXB SYS SYS SYS SYS",
    "PXB PXB X   PIX SYS SYS SYS SYS",
    "PXB PXB PIX X   SYS SYS SYS SYS",
    "SYS SYS SYS SYS X   PIX NODE NODE",
    "SYS SYS SYS SYS PIX X   NODE NODE",
    "SYS SYS SYS SYS NODE NODE X   PIX",
    "SYS SYS SYS SYS NODE NODE PIX X",
], [0, 0, 0, 0, 1, 1, 1, 1], gpu_name="NVIDIA L40S", memory_mib=46068)

BUNDLES = {"nvl-pairs-4x": NVL_PAIRS, "pcie-tree-8x": PCIE_TREE}


def bundle_text(node: Node) -> str:
    from gpuslurm.hw.formats.nvml_json import dump_node

    return dump_node(node)


if __name__ == "__main__":
    for name, node in BUNDLES.items():
        (DATA / name).mkdir(parents=True, exist_ok=True)
        (DATA / name / "nvml.json").write_text(bundle_text(node))
        print(f"wrote {DATA / name / 'nvml.json'}", file=sys.stderr)
