"""Pure parsers of bundle text files: topo -m, lscpu -p, mig-minors."""

from __future__ import annotations

import re

import pytest

from gpuslurm.errors import CaptureError
from gpuslurm.hw.formats.lscpu import parse_lscpu
from gpuslurm.hw.formats.mig_minors import mig_minors_text, parse_mig_minors
from gpuslurm.hw.formats.topo_text import parse_cpu_list, parse_topo
from gpuslurm.hw.model.node import Cpu, Link, LinkKind

LEGEND = """
Legend:

  X    = Self
  SYS  = Connection traversing PCIe as well as the SMP interconnect between NUMA nodes (e.g., QPI/UPI)
  NV#  = Connection traversing a bonded set of # NVLinks
"""

NIC_LEGEND = """
NIC Legend:

  NIC0: mlx5_0
  NIC1: mlx5_1
"""


def tabbed(*rows: list[str]) -> str:
    return "\n".join("\t".join(r) for r in rows) + "\n"


def dgx_like() -> str:
    """Eight NVSwitch-connected GPUs, two NICs, two sockets; ANSI header and the empty-cell quirk."""
    header = ["", "\x1b[4mGPU0", *[f"GPU{i}" for i in range(1, 8)], "NIC0", "NIC1",
              "CPU Affinity", "NUMA Affinity", "GPU NUMA ID\x1b[0m"]
    rows = [header]
    for i in range(8):
        cells = [" X " if j == i else "NV18" for j in range(8)]
        nics = ["PXB", "SYS"] if i < 4 else ["SYS", "PXB"]
        cpus, node = ("0-55,112-167", "0") if i < 4 else ("56-111,168-223", "1")
        rows.append([f"GPU{i}", *cells, *nics, cpus, node, "", "N/A"])
    rows.append(["NIC0", *(["PXB"] * 4 + ["SYS"] * 4), " X ", "SYS"])
    rows.append(["NIC1", *(["SYS"] * 4 + ["PXB"] * 4), "SYS", " X "])
    return tabbed(*rows) + LEGEND + NIC_LEGEND


def test_dgx_like_with_nics_ansi_and_gpu_numa_id() -> None:
    topo = parse_topo(dgx_like(), "nvidia-smi-topo.txt")
    assert topo.gpu_labels == tuple(f"GPU{i}" for i in range(8))
    assert len(topo.links) == 8 and all(len(r) == 8 for r in topo.links)
    assert topo.links[0][0] == Link(LinkKind.SELF)
    assert topo.links[3][5] == Link(LinkKind.NVLINK, 18)
    assert topo.cpu_affinity[0] == (*range(0, 56), *range(112, 168))
    assert topo.cpu_affinity[7][0] == 56 and len(topo.cpu_affinity[7]) == 112
    assert topo.numa_node == (0, 0, 0, 0, 1, 1, 1, 1)


def test_old_mlx_columns_and_space_separated() -> None:
    text = (
        "        GPU0    GPU1    GPU2    GPU3    mlx5_0  mlx5_1  CPU Affinity    NUMA Affinity\n"
        "GPU0     X      PIX     SYS     SYS     NODE    SYS     0,2,4-6         0\n"
        "GPU1    PIX      X      SYS     SYS     NODE    SYS     0,2,4-6         0\n"
        "GPU2    SYS     SYS      X      PHB     SYS     NODE    1,3,7-9         1\n"
        "GPU3    SYS     SYS     PHB      X      SYS     NODE    1,3,7-9         1\n"
        "mlx5_0  NODE    NODE    SYS     SYS      X      SYS\n"
        "mlx5_1  SYS     SYS     NODE    NODE    SYS      X\n" + LEGEND
    )
    topo = parse_topo(text, "t")
    assert [str(c) for c in topo.links[0]] == ["X", "PIX", "SYS", "SYS"]
    assert topo.links[2][3].kind is LinkKind.PHB
    assert topo.cpu_affinity[0] == (0, 2, 4, 5, 6)
    assert topo.cpu_affinity[3] == (1, 3, 7, 8, 9)
    assert topo.numa_node == (0, 0, 1, 1)


def test_without_nics_or_numa_column() -> None:
    text = tabbed(["", "GPU0", "GPU1", "CPU Affinity"],
                  ["GPU0", " X ", "NV4", "0-15"],
                  ["GPU1", "NV4", " X ", "N/A"]) + LEGEND
    topo = parse_topo(text, "t")
    assert topo.links[0][1] == Link(LinkKind.NVLINK, 4)
    assert topo.cpu_affinity == (tuple(range(16)), ())
    assert topo.numa_node == (None, None)


def test_na_link_cell_is_unknown() -> None:
    text = tabbed(["", "GPU0", "GPU1", "CPU Affinity", "NUMA Affinity"],
                  ["GPU0", " X ", "N/A", "0-3", "N/A"],
                  ["GPU1", "N/A", " X ", "0-3", "N/A"])
    topo = parse_topo(text, "t")
    assert topo.links[0][1].kind is LinkKind.UNKNOWN
    assert topo.numa_node == (None, None)


def test_real_single_gpu_topo(real_fixtures) -> None:
    text = (real_fixtures / "multi" / "h200-mig__590.48.01.txt").read_text()
    section = text.split("# $ nvidia-smi topo -m\n", 1)[1].split("\n", 1)[1]  # skip the #### line
    section = section.split("\n\n\n#####", 1)[0]
    assert "\x1b[" in section  # the fixture really carries escapes
    topo = parse_topo(section, "h200")
    assert topo.gpu_labels == ("GPU0",)
    assert topo.links == ((Link(LinkKind.SELF),),)
    assert topo.cpu_affinity == (tuple(range(24)),)
    assert topo.numa_node == (0,)


@pytest.mark.parametrize(("text", "needle"), [
    (tabbed(["", "GPU0", "GPU1", "CPU Affinity"], ["GPU0", " X ", "NV4", "0-3"]), "not square"),
    (tabbed(["", "GPU0", "GPU1", "CPU Affinity"], ["GPU0", " X ", "NV4", "0-3"],
            ["GPU1", "XYZ", " X ", "0-3"]), "unknown link 'XYZ' in column GPU0"),
    (tabbed(["", "GPU0", "CPU Affinity"], ["GPU0", " X ", "0-3a"]), "'0-3a' is not a CPU list"),
    (tabbed(["", "GPU0", "GPU1", "CPU Affinity"], ["GPU0", " X "]), "not square"),
    (tabbed(["", "GPU0", "CPU Affinity"], ["GPU0", "NV4", "0-3"]), "not X on the diagonal"),
    (tabbed(["", "GPU0", "CPU Affinity"], ["GPU0", " X ", "0-3", "7"]), "after the links"),
    (tabbed(["", "GPU0", "CPU Affinity", "NUMA Affinity"], ["GPU0", " X ", "0-3", "zero"]),
     "not a node number"),
    ("Legend:\n", "no GPU columns"),
    ("\n\n", "empty"),
])
def test_bad_topo(text: str, needle: str) -> None:
    with pytest.raises(CaptureError) as info:
        parse_topo(text, "/b/nvidia-smi-topo.txt")
    msg = str(info.value)
    assert msg.startswith("/b/nvidia-smi-topo.txt: ") and needle in msg and "\n" not in msg


def test_cpu_list() -> None:
    assert parse_cpu_list("0-2,8,5") == (0, 1, 2, 5, 8)
    for bad in ("", "3-1", "0-", "a", "0,,1", "56-18446744073709551616", "0-65535,0-65535", "9" * 5000):
        with pytest.raises(ValueError):
            parse_cpu_list(bad)


LSCPU = """\
# The following is the parsable format, which can be fed to other
# programs. Each different item in every column has an unique ID
# starting usually from zero.
# CPU,Core,Socket,Node
0,0,0,0
2,1,0,0
1,0,0,0
3,1,0,0
4,2,1,
"""


def test_lscpu_with_header_sorted_and_empty_node() -> None:
    cpus = parse_lscpu(LSCPU, "lscpu.csv")
    assert [c.os_id for c in cpus] == [0, 1, 2, 3, 4]
    assert cpus[1] == Cpu(1, 0, 0, 0)
    assert cpus[4] == Cpu(4, 2, 1, None)


def test_lscpu_reordered_and_extra_columns() -> None:
    text = ("# Node,Socket,Book,CPU,Core,,L1d:L1i:L2:L3\n"
            "1,1,0,7,3,,3:3:3:1\n"
            "0,0,0,6,2,,2:2:2:0\n")
    assert parse_lscpu(text, "x") == (Cpu(6, 2, 0, 0), Cpu(7, 3, 1, 1))


def test_lscpu_without_header_uses_capture_order_and_no_node() -> None:
    assert parse_lscpu("0,0,0,0\n1,0,0,1\n", "x") == (Cpu(0, 0, 0, 0), Cpu(1, 0, 0, 1))
    assert parse_lscpu("# CPU,Core,Socket\n5,1,0\n", "x") == (Cpu(5, 1, 0, None),)


def test_lscpu_skips_offline_cpus() -> None:
    text = "# CPU,Core,Socket,Node\n0,0,0,0\n1,,,\n"
    assert parse_lscpu(text, "x") == (Cpu(0, 0, 0, 0),)


@pytest.mark.parametrize(("text", "needle"), [
    ("# CPU,Socket,Node\n0,0,0\n", "lacks the Core column; capture with lscpu -p=CPU,CORE,SOCKET,NODE"),
    ("# CPU,Core,Node\n0,0,0\n", "lacks the Socket column"),
    ("# Core,Socket\n0,0\n", "lacks the CPU column"),
    ("# CPU,Core,Socket,Node\n0,0,0\n", "line 2 has 3 fields"),
    ("# CPU,Core,Socket,Node\n0,x,0,0\n", "line 2 is not numeric"),
    ("# CPU,Core,Socket,Node\n0,0,0,0\n0,1,0,0\n", "repeats CPU 0"),
    ("# CPU,Core,Socket,Node\n", "no CPUs listed"),
])
def test_bad_lscpu(text: str, needle: str) -> None:
    with pytest.raises(CaptureError) as info:
        parse_lscpu(text, "/b/lscpu.csv")
    msg = str(info.value)
    assert msg.startswith("/b/lscpu.csv: ") and needle in msg and "\n" not in msg


def test_mig_minors_parse() -> None:
    text = "config 1\nmonitor 2\ngpu0/gi2/access 21\ngpu0/gi2/ci0/access 22\n\ngpu1/gi0/ci7/access 146\n"
    assert parse_mig_minors(text, "m") == {(0, 2, None): 21, (0, 2, 0): 22, (1, 0, 7): 146}


def test_mig_minors_generator_roundtrip() -> None:
    text = mig_minors_text(2)
    table = parse_mig_minors(text, "m")
    assert len(table) == 2 * 15 * 9
    assert text.startswith("config 1\nmonitor 2\ngpu0/gi0/access 3\ngpu0/gi0/ci0/access 4\n")
    assert table[(0, 1, None)] == 12 and table[(0, 1, 0)] == 13
    assert table[(0, 2, None)] == 21 and table[(0, 2, 0)] == 22
    assert table[(1, 0, None)] == 3 + 135
    assert sorted(table.values()) == list(range(3, 3 + 270))


@pytest.mark.parametrize(("text", "needle"), [
    ("config 1\ngpu0/gi2/acess 21\n", "line 2 is not a MIG capability entry"),
    ("gpu0/gi2/access\n", "line 1"),
    ("gpu0/gi2/access 3\ngpu0/gi2/access 4\n", "line 2 repeats gpu0/gi2/access"),
])
def test_bad_mig_minors(text: str, needle: str) -> None:
    with pytest.raises(CaptureError) as info:
        parse_mig_minors(text, "/b/mig-minors")
    msg = str(info.value)
    assert msg.startswith("/b/mig-minors: ") and needle in msg and "\n" not in msg
    assert re.search(r"line \d+", msg)
