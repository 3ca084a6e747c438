"""Placement quality of a set of GPUs and CPUs: NUMA affinity and the weakest link (pure)."""

from __future__ import annotations

from collections.abc import Sequence

from gpuslurm.hw.model.node import Gpu, Node
from gpuslurm.place.engine import Device, weakest_link
from gpuslurm.topo.cores import LayoutError, core_map
from gpuslurm.tuples import NamedTuple


class Quality(NamedTuple):
    os_cpus: tuple[int, ...]
    cpu_numa: tuple[int, ...]
    gpu_numa: tuple[int, ...]
    affine: str  # "yes": every CPU on a GPU's NUMA node; "partly"; "no"; "unknown"
    weakest_link: str | None  # None for one GPU


def os_cpus_of_abstract(node: Node, cpu_ids: Sequence[int]) -> tuple[int, ...]:
    """Slurm's abstract CPU ids → OS CPU ids: id = core × threads + thread (threads by OS id).

    Raises LayoutError when the node has no usable CPU layout or an id is out of range.
    """
    cmap = core_map(node.cpus)
    threads: dict[int, list[int]] = {}
    for os_id, core in sorted(cmap.core_of_cpu.items()):
        threads.setdefault(core, []).append(os_id)
    t = cmap.threads_per_core
    out = []
    for a in cpu_ids:
        core, thread = divmod(a, t)
        if core not in threads:
            raise LayoutError(f"CPU id {a} is beyond the node's {cmap.core_count * t} CPUs")
        out.append(threads[core][thread])
    return tuple(sorted(out))


def assess(node: Node, gpus: Sequence[Gpu], os_cpus: Sequence[int]) -> Quality:
    """How well ``os_cpus`` sit on ``gpus``' NUMA nodes, and the weakest link among ``gpus``."""
    numa_of = {c.os_id: c.numa_node for c in node.cpus}
    cpu_numa = sorted({n for c in os_cpus if (n := numa_of.get(c)) is not None})
    gpu_numa = sorted({g.numa_node for g in gpus if g.numa_node is not None})
    if not cpu_numa or not gpu_numa:
        affine = "unknown"
    elif set(cpu_numa) <= set(gpu_numa):
        affine = "yes"
    elif set(cpu_numa) & set(gpu_numa):
        affine = "partly"
    else:
        affine = "no"
    devices = [Device(g, node.gpus.index(g)) for g in gpus]
    return Quality(tuple(sorted(os_cpus)), tuple(cpu_numa), tuple(gpu_numa), affine,
                   weakest_link(node, devices))
