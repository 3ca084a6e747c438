"""PBS vnode definition file (``pbs_mom -s insert``): one vnode per NUMA node with its CPUs, memory and GPUs.

PBS counts ``ngpus`` but does not know where GPUs sit; a vnode per NUMA node lets PBS's own scheduler
place a chunk's CPUs and GPUs together, the PBS analogue of gres.conf ``Cores=``.

``ngpus`` counts whole GPUs (:func:`is_whole`); a GPU in MIG mode with instances contributes them
to ``nmigs`` instead (one per MIG device, as gres.conf lists them for Slurm), and a job asks for
``select=1:ncpus=N:nmigs=M``. ``nmigs`` appears only on a node with MIG instances, so a server
that never made the resource reads the files and answers of a node without them unchanged.
"""

from __future__ import annotations

from collections import defaultdict

from gpuslurm.errors import InputError
from gpuslurm.hw.model.node import Gpu, Node
from gpuslurm.tuples import NamedTuple  # not dataclasses (inspect): PBS's execjob_begin imports this


class NumaVnode(NamedTuple):
    """One vnode: its NUMA node, the OS CPU ids, memory in MiB and the GPUs (by minor) on it."""

    numa_node: int
    cpus: tuple[int, ...]
    memory_mib: int | None  # None: the capture has no meminfo, and the vnodes say no mem
    gpu_minors: tuple[int, ...]  # whole GPUs (not MIG instances)
    nmigs: int = 0  # MIG devices of the node's GPUs in MIG mode


def is_whole(gpu: Gpu) -> bool:
    """Whether a job gets ``gpu`` as a whole GPU (``ngpus``): not in MIG mode with instances."""
    return not (gpu.mig_mode and gpu.mig_devices)


def has_migs(node: Node) -> bool:
    """Whether any GPU of ``node`` offers MIG instances (then the vnodes say ``nmigs``)."""
    return not all(is_whole(g) for g in node.gpus)


def gpu_numa(gpu: Gpu, cpu_numa: dict[int, int | None]) -> int | None:
    """The NUMA node a GPU's vnode is: its own, else the one node its CPU affinity lies in."""
    if gpu.numa_node is not None:
        return gpu.numa_node
    nodes = {cpu_numa.get(cpu) for cpu in gpu.cpu_affinity} - {None}
    return nodes.pop() if len(nodes) == 1 else None


def plan_vnodes(node: Node) -> tuple[NumaVnode, ...]:
    """The NUMA vnodes of ``node``; host memory is split evenly (captures carry no per-NUMA size)."""
    if not node.cpus:
        raise InputError("the capture has no CPU list (lscpu.csv): cannot make NUMA vnodes")
    cpu_numa = {cpu.os_id: cpu.numa_node for cpu in node.cpus}
    by_numa: dict[int, list[int]] = defaultdict(list)
    for cpu in node.cpus:
        by_numa[cpu.numa_node if cpu.numa_node is not None else 0].append(cpu.os_id)
    gpus: dict[int, list[int]] = defaultdict(list)
    migs: dict[int, int] = defaultdict(int)
    for gpu in node.gpus:
        numa = gpu_numa(gpu, cpu_numa)
        if numa is None or numa not in by_numa:
            raise InputError(f"GPU {gpu.uuid} ({gpu.device_file}): its NUMA node is unknown in the capture")
        if is_whole(gpu):
            gpus[numa].append(gpu.minor)
        else:
            migs[numa] += len(gpu.mig_devices)
    # no meminfo: no mem at all rather than 0mb, which no job asking for memory could ever get
    share = node.memory_mib // len(by_numa) if node.memory_mib else None
    return tuple(NumaVnode(numa, tuple(sorted(by_numa[numa])), share, tuple(sorted(gpus[numa])), migs[numa])
                 for numa in sorted(by_numa))


MEMORY_LEFT_OUT = ("mem left out: the capture has no meminfo (pbs_mom's own figure stays on the "
                   "natural vnode)")


def memory_known(node: Node) -> bool:
    """Whether the vnodes carry ``mem`` (else :data:`MEMORY_LEFT_OUT`)."""
    return bool(node.memory_mib)


def render_pbs_vnodes(node: Node, node_name: str | None = None) -> str:
    """The vnode definition file text: the natural vnode holds nothing, ``NAME[n]`` holds NUMA node n.

    Without meminfo no vnode has a ``mem`` line, the natural one included, so pbs_mom's own
    figure stays (``mem = 0mb`` on every vnode would refuse every job that asks for memory).
    """
    from gpuslurm.names import check_node_name  # here: execjob_begin imports this module, not this

    host = check_node_name(node_name or node.hostname,
                           source="--node-name" if node_name else "captured hostname")
    # No comment lines: pbs_mom's vnode file parser has no comment syntax.
    lines = ["$configversion 2", f"{host}: resources_available.ncpus = 0"]
    if memory_known(node):
        lines.append(f"{host}: resources_available.mem = 0kb")
    lines.append(f"{host}: resources_available.ngpus = 0")
    migs = has_migs(node)
    if migs:
        lines.append(f"{host}: resources_available.nmigs = 0")
    for vnode in plan_vnodes(node):
        name = f"{host}[{vnode.numa_node}]"
        lines.append(f"{name}: resources_available.ncpus = {len(vnode.cpus)}")
        if vnode.memory_mib is not None:
            lines.append(f"{name}: resources_available.mem = {vnode.memory_mib}mb")
        lines.append(f"{name}: resources_available.ngpus = {len(vnode.gpu_minors)}")
        if migs:
            lines.append(f"{name}: resources_available.nmigs = {vnode.nmigs}")
        lines.append(f"{name}: sharing = default_shared")
    return "\n".join(lines) + "\n"
