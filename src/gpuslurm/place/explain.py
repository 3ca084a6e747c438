"""Words and figures for a placement: CPUs of a set, the ranking explained, why nothing fits (pure)."""

from __future__ import annotations

from collections.abc import Sequence

from gpuslurm.hw.model.node import Node
from gpuslurm.place.engine import Device, Exclusion, Placement, Ranked
from gpuslurm.ranges import format_ranges
from gpuslurm.tuples import NamedTuple


class CpuSet(NamedTuple):
    os_cpus: tuple[int, ...]  # OS CPU ids local to the set; () when the source does not say
    numa_nodes: tuple[int, ...]
    slurm_cores: tuple[int, ...] | None  # None: no CPU layout (lscpu) to number cores with


def local_cpus(node: Node, devices: Sequence[Device], with_cores: bool = True) -> CpuSet:
    """The OS CPUs, NUMA nodes and (``with_cores``) Slurm cores close to ``devices``."""
    cpus = sorted({c for d in devices for c in d.gpu.cpu_affinity})
    numa = sorted({d.gpu.numa_node for d in devices if d.gpu.numa_node is not None})
    cores: tuple[int, ...] | None = None
    if with_cores and node.cpus and cpus:
        from gpuslurm.topo.cores import LayoutError, core_map

        try:
            cores = core_map(node.cpus).slurm_cores(cpus)
        except LayoutError:
            cores = None
    return CpuSet(tuple(cpus), tuple(numa), cores)


def lost_on(winner: Ranked, other: Ranked) -> str:
    """The first ranking step on which ``other`` lost to ``winner``."""
    a, b = winner.key, other.key
    if a.weakest != b.weakest:
        return f"weaker weakest link ({other.weakest_link} vs {winner.weakest_link})"
    if a.numa_nodes != b.numa_nodes:
        return f"more NUMA nodes ({b.numa_nodes} vs {a.numa_nodes})"
    if a.nvlinks != b.nvlinks:
        return f"fewer NVLinks in total ({-b.nvlinks} vs {-a.nvlinks})"
    if a.availability != b.availability:
        return f"lower availability ({other.availability:.2f} vs {winner.availability:.2f})"
    return "tie-break: higher indices"


def set_label(devices: Sequence[Device]) -> str:
    return "{" + ", ".join(d.label for d in devices) + "}"


def explain_lines(node: Node, placement: Placement) -> list[str]:
    """The ranking in words: the pick, each runner-up and what it lost on, the exclusions."""
    lines: list[str] = []
    win = placement.chosen
    if win is None:
        lines.append(unsatisfied_line(placement, 0))
    else:
        cpus = local_cpus(node, win.devices)
        lines.append(f"picked {set_label(win.devices)}: weakest link {win.weakest_link or '-'}, "
                     f"{win.key.numa_nodes} NUMA node(s), {-win.key.nvlinks} NVLinks, "
                     f"availability {win.availability:.2f}")
        lines.append(f"  CPUs {format_ranges(cpus.os_cpus) or 'unknown'}, NUMA nodes "
                     f"{','.join(map(str, cpus.numa_nodes)) or 'unknown'}")
        for r in placement.runners_up:
            lines.append(f"runner-up {set_label(r.devices)} lost on {lost_on(win, r)}")
    for ex in placement.excluded:
        lines.append(f"excluded {ex.device.label} ({ex.device.uuid}): {ex.constraint}: {ex.detail}")
    return lines


def unsatisfied_line(placement: Placement, count: int) -> str:
    """One line: how many were wanted and which constraint excluded which devices."""
    by: dict[str, list[Exclusion]] = {}
    for ex in placement.excluded:
        by.setdefault(ex.constraint, []).append(ex)
    left = placement.candidates - len(placement.excluded)
    parts = [f"{c} excludes " + ", ".join(f"{e.device.label} ({e.detail})" for e in exs)
             for c, exs in by.items()]
    want = f"{count} wanted, " if count else ""
    return (f"nothing satisfies the request: {want}{left} of {placement.candidates} candidates left"
            + ("; " + "; ".join(parts) if parts else ""))
