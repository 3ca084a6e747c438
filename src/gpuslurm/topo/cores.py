"""Slurm's abstract core numbering, computed from the OS CPU layout (pure).

gres.conf ``Cores=`` is not in OS CPU ids: Slurm numbers *cores*, socket by socket, with every
hyperthread collapsed onto its core. On a 2×56-core machine whose OS numbers CPU 0-55 on socket 0,
56-111 on socket 1 and the siblings 112-223 after them, the CPUs nvidia-smi lists as
``0-55,112-167`` are Slurm cores ``0-55``. On a machine whose BIOS interleaves sockets (even CPUs
on socket 0, odd on socket 1), OS CPU ``0,2,4,…`` are Slurm cores ``0-31``. Copying nvidia-smi's
CPU list into ``Cores=`` is the commonest gres.conf mistake; everything here avoids it.

Ordering follows hwloc's logical order, which Slurm uses: sockets ordered by their lowest OS CPU,
cores within a socket ordered by their lowest OS CPU.
"""

from __future__ import annotations

from collections.abc import Iterable

from gpuslurm.hw.model.node import Cpu
from gpuslurm.ranges import format_ranges
from gpuslurm.tuples import NamedTuple

__all__ = ["CoreMap", "LayoutError", "core_map", "format_ranges"]


class LayoutError(ValueError):
    """The CPU facts cannot be turned into a Slurm layout (caller adds the file name)."""


class CoreMap(NamedTuple):
    """OS CPU id → Slurm abstract core id for one node."""

    core_of_cpu: dict[int, int]
    core_count: int
    sockets: int
    cores_per_socket: int
    threads_per_core: int

    def slurm_cores(self, os_cpus: Iterable[int]) -> tuple[int, ...]:
        """The sorted Slurm core ids that hold any of ``os_cpus``."""
        missing = sorted({c for c in os_cpus if c not in self.core_of_cpu})
        if missing:
            raise LayoutError(f"CPU ids {format_ranges(missing)} are not in the CPU list")
        return tuple(sorted({self.core_of_cpu[c] for c in os_cpus}))

    def socket_cores(self, socket: int) -> range:
        """The Slurm core ids of ``socket`` (Slurm's socket order, from 0)."""
        return range(socket * self.cores_per_socket, (socket + 1) * self.cores_per_socket)

    def whole_sockets(self, cores: Iterable[int]) -> tuple[int, ...]:
        """Every Slurm core of the sockets that hold any of ``cores``."""
        sockets = sorted({c // self.cores_per_socket for c in cores})
        return tuple(c for s in sockets for c in self.socket_cores(s))

    def is_whole_sockets(self, cores: Iterable[int]) -> bool:
        """Whether ``cores`` are whole sockets, as Slurm 24.11 and later require of Cores=."""
        have = sorted(set(cores))
        return list(self.whole_sockets(have)) == have


def core_map(cpus: Iterable[Cpu]) -> CoreMap:
    """Number the cores of ``cpus`` as Slurm does. Raises LayoutError on an unusable layout."""
    cpu_list = list(cpus)
    if not cpu_list:
        raise LayoutError("no CPUs are known")
    first_cpu_of_socket: dict[int, int] = {}
    first_cpu_of_core: dict[tuple[int, int], int] = {}
    for cpu in cpu_list:
        key = (cpu.socket, cpu.core)
        first_cpu_of_socket[cpu.socket] = min(cpu.os_id, first_cpu_of_socket.get(cpu.socket, cpu.os_id))
        first_cpu_of_core[key] = min(cpu.os_id, first_cpu_of_core.get(key, cpu.os_id))
    sockets_sorted = sorted(first_cpu_of_socket, key=lambda s: first_cpu_of_socket[s])
    socket_order = {s: i for i, s in enumerate(sockets_sorted)}
    ordered_cores = sorted(first_cpu_of_core, key=lambda k: (socket_order[k[0]], first_cpu_of_core[k]))
    slurm_id = {key: i for i, key in enumerate(ordered_cores)}

    threads: dict[tuple[int, int], int] = {}
    for cpu in cpu_list:
        threads[(cpu.socket, cpu.core)] = threads.get((cpu.socket, cpu.core), 0) + 1
    cores_per_socket = {s: sum(1 for k in ordered_cores if k[0] == s) for s in socket_order}
    if len(set(cores_per_socket.values())) != 1:
        detail = ", ".join(f"socket {s}: {n}" for s, n in sorted(cores_per_socket.items()))
        raise LayoutError(f"sockets have different core counts ({detail}); Slurm needs a uniform layout")
    if len(set(threads.values())) != 1:
        raise LayoutError("cores have different thread counts (some CPUs offline?); "
                          "Slurm needs a uniform layout")
    return CoreMap(
        core_of_cpu={cpu.os_id: slurm_id[(cpu.socket, cpu.core)] for cpu in cpu_list},
        core_count=len(ordered_cores),
        sockets=len(socket_order),
        cores_per_socket=next(iter(cores_per_socket.values())),
        threads_per_core=next(iter(threads.values())),
    )
