"""Slurm's abstract core numbering from OS CPU layouts, including the ones that trip people up."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpuslurm.hw.model.node import Cpu
from gpuslurm.ranges import MAX_CPUS, parse_ranges
from gpuslurm.topo.cores import LayoutError, core_map, format_ranges


def dgx_h100_cpus() -> list[Cpu]:
    """2×56 cores, HT siblings in the upper half: CPU n and n+112 share a core."""
    return [Cpu(n, n % 112, (n % 112) // 56, (n % 112) // 56) for n in range(224)]


def interleaved_cpus(cores_per_socket: int = 32) -> list[Cpu]:
    """Sockets interleaved by the BIOS: even OS CPUs on socket 0, odd on socket 1; siblings +64."""
    half = 2 * cores_per_socket
    return [Cpu(n, n % half, (n % half) % 2, (n % half) % 2) for n in range(2 * half)]


def test_dgx_layout_folds_hyperthreads_onto_cores() -> None:
    cmap = core_map(dgx_h100_cpus())
    assert (cmap.sockets, cmap.cores_per_socket, cmap.threads_per_core) == (2, 56, 2)
    socket0 = list(range(0, 56)) + list(range(112, 168))
    assert format_ranges(cmap.slurm_cores(socket0)) == "0-55"
    socket1 = list(range(56, 112)) + list(range(168, 224))
    assert format_ranges(cmap.slurm_cores(socket1)) == "56-111"


def test_interleaved_sockets_are_renumbered_socket_by_socket() -> None:
    cmap = core_map(interleaved_cpus())
    even = [n for n in range(128) if n % 2 == 0]
    odd = [n for n in range(128) if n % 2 == 1]
    assert format_ranges(cmap.slurm_cores(even)) == "0-31"
    assert format_ranges(cmap.slurm_cores(odd)) == "32-63"
    # OS CPU 1 is the first core of socket 1, so Slurm core 32, not 1.
    assert cmap.core_of_cpu[1] == 32
    assert cmap.core_of_cpu[64] == 0  # sibling of CPU 0


def test_socket_ids_are_ordered_by_their_first_cpu_not_their_number() -> None:
    # A board whose firmware calls the socket holding CPU 0 "socket 1".
    cpus = [Cpu(n, n, 1 if n < 4 else 0) for n in range(8)]
    cmap = core_map(cpus)
    assert cmap.slurm_cores([0, 1, 2, 3]) == (0, 1, 2, 3)
    assert cmap.slurm_cores([4]) == (4,)


def test_one_thread_of_a_core_names_the_whole_core() -> None:
    cmap = core_map(dgx_h100_cpus())
    assert cmap.slurm_cores([112]) == (0,)


def test_unknown_cpu_and_non_uniform_layouts_are_errors() -> None:
    cmap = core_map(dgx_h100_cpus())
    with pytest.raises(LayoutError, match="224-225"):
        cmap.slurm_cores([0, 224, 225])
    lopsided = [Cpu(0, 0, 0), Cpu(1, 1, 0), Cpu(2, 2, 1)]
    with pytest.raises(LayoutError, match="different core counts"):
        core_map(lopsided)
    with pytest.raises(LayoutError, match="no CPUs"):
        core_map([])


@pytest.mark.parametrize(("ids", "text"), [
    ([0, 1, 2, 5, 7, 8], "0-2,5,7-8"), ([3], "3"), ([], ""), ([2, 1, 1, 0], "0-2"),
])
def test_format_ranges(ids: list[int], text: str) -> None:
    assert format_ranges(ids) == text
    if text:
        assert parse_ranges(text, MAX_CPUS) == tuple(sorted(set(ids)))


@pytest.mark.parametrize("bad", ["", "1,,2", "a-3", "5-2", "1-"])
def test_parse_ranges_rejects(bad: str) -> None:
    with pytest.raises(ValueError):
        parse_ranges(bad, MAX_CPUS)


def test_whole_sockets_widens_a_numa_range_to_its_socket() -> None:
    cmap = core_map(dgx_h100_cpus())
    assert cmap.is_whole_sockets(range(0, 56)) and cmap.is_whole_sockets(range(0, 112))
    assert not cmap.is_whole_sockets(range(48, 56))
    assert format_ranges(cmap.whole_sockets([48, 49])) == "0-55"
    assert format_ranges(cmap.whole_sockets([50, 60])) == "0-111"


@given(sockets=st.integers(1, 8), per_socket=st.integers(1, 64), data=st.data())
def test_whole_sockets_properties(sockets: int, per_socket: int, data: st.DataObject) -> None:
    cpus = [Cpu(n, n, n // per_socket, n // per_socket) for n in range(sockets * per_socket)]
    cmap = core_map(cpus)
    cores = data.draw(st.sets(st.integers(0, sockets * per_socket - 1), min_size=1))
    whole = cmap.whole_sockets(cores)
    assert set(cores) <= set(whole)  # never narrower than the GPU's cores
    assert cmap.is_whole_sockets(whole) and cmap.whole_sockets(whole) == whole  # idempotent
    assert len(whole) % per_socket == 0  # whole sockets only
    assert cmap.is_whole_sockets(cores) == (tuple(sorted(cores)) == whole)
