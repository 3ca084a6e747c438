"""The built-in capture bundles are internally consistent and match the public facts they claim.

These checks parse the files with the standard library only, so they do not depend on the bundle
reader; once ``gpuslurm.hw.replay.bundle.read_bundle`` exists, the last test also loads every bundle.
"""

from __future__ import annotations

import importlib.util
import re
import sys
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import pytest

import gpuslurm.hw

BUILTIN = Path(gpuslurm.hw.__file__).resolve().parent / "builtin"
GENERATOR = Path(__file__).resolve().parents[2] / "tools" / "make_builtin_bundles.py"
BUNDLES = ("dgx-h100", "l40s-4x", "a100-mig")
COMMON_FILES = ("nvidia-smi-q.xml", "nvidia-smi-topo.txt", "nvidia-smi-L.txt", "lscpu.csv",
                "meminfo", "hostname")
LSCPU_HEADER = (
    "# The following is the parsable format, which can be fed to other\n"
    "# programs. Each different item in every column has an unique ID\n"
    "# starting usually from zero.\n"
    "# CPU,Core,Socket,Node\n"
)
UUID_RE = re.compile(r"^(GPU|MIG)-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")
ANSI_RE = re.compile(r"\x1b\[[0-9;]*m")
GPU_LINE_RE = re.compile(r"^GPU (\d+): (.+) \(UUID: (\S+)\)$")
MIG_LINE_RE = re.compile(r"^  MIG (\S+)\s+Device\s+(\d+): \(UUID: (\S+)\)$")
# NVML's view of the A100 80GB profiles used here: (memory MiB, SMs).
A100_PROFILES = {"3g.40gb": (40192, 42), "2g.20gb": (19968, 28), "1g.10gb": (9728, 14)}


@dataclass
class XmlMig:
    index: int
    gi: int
    ci: int
    sms: int
    memory_mib: int


@dataclass
class XmlGpu:
    id_attr: str
    bus_id: str
    name: str
    uuid: str
    minor: int
    memory_mib: int
    mig_current: str
    migs: list[XmlMig]


@dataclass
class Topo:
    columns: list[str]
    gpu_rows: dict[str, list[str]]  # label -> link cells (GPU and NIC columns)
    nic_rows: dict[str, list[str]]
    affinity: dict[str, str]
    numa: dict[str, str]
    nic_legend: dict[str, str]

    @property
    def gpu_columns(self) -> list[str]:
        return [c for c in self.columns if c.startswith("GPU")]

    @property
    def nic_columns(self) -> list[str]:
        return [c for c in self.columns if c.startswith("NIC")]


def _mib(text: str | None) -> int:
    assert text is not None and text.endswith(" MiB"), text
    return int(text[:-4])


def read_xml(bundle: str) -> tuple[ET.Element, list[XmlGpu]]:
    root = ET.parse(BUILTIN / bundle / "nvidia-smi-q.xml").getroot()
    gpus = []
    for g in root.findall("gpu"):
        migs = [
            XmlMig(int(m.findtext("index", "")), int(m.findtext("gpu_instance_id", "")),
                   int(m.findtext("compute_instance_id", "")),
                   int(m.findtext("device_attributes/shared/multiprocessor_count", "")),
                   _mib(m.findtext("fb_memory_usage/total")))
            for m in g.findall("mig_devices/mig_device")
        ]
        gpus.append(XmlGpu(
            id_attr=g.get("id", ""), bus_id=g.findtext("pci/pci_bus_id", ""),
            name=g.findtext("product_name", ""), uuid=g.findtext("uuid", ""),
            minor=int(g.findtext("minor_number", "")), memory_mib=_mib(g.findtext("fb_memory_usage/total")),
            mig_current=g.findtext("mig_mode/current_mig", ""), migs=migs,
        ))
    return root, gpus


def read_topo(bundle: str) -> Topo:
    text = ANSI_RE.sub("", (BUILTIN / bundle / "nvidia-smi-topo.txt").read_text())
    lines = text.splitlines()
    header = lines[0].split("\t")
    assert header[0] == "" and header[-3:] == ["CPU Affinity", "NUMA Affinity", "GPU NUMA ID"]
    columns = header[1:-3]
    topo = Topo(columns, {}, {}, {}, {}, {})
    for line in lines[1:]:
        if not line:
            break
        cells = line.split("\t")
        label, links, rest = cells[0], cells[1:1 + len(columns)], cells[1 + len(columns):]
        assert len(rest) == 4, f"{label}: expected affinity, NUMA, blank, GPU NUMA ID cells"
        if label.startswith("GPU"):
            topo.gpu_rows[label] = [c.strip() for c in links]
            topo.affinity[label], topo.numa[label] = rest[0], rest[1]
            assert rest[2:] == ["", "N/A"]
        else:
            topo.nic_rows[label] = [c.strip() for c in links]
            assert rest == ["", "", "", ""]
    for m in re.finditer(r"^  (NIC\d+): (\S+)$", text, re.M):
        topo.nic_legend[m.group(1)] = m.group(2)
    return topo


def read_list(bundle: str) -> list[tuple[int, str, str, list[tuple[str, int, str]]]]:
    gpus: list[tuple[int, str, str, list[tuple[str, int, str]]]] = []
    for line in (BUILTIN / bundle / "nvidia-smi-L.txt").read_text().splitlines():
        if m := GPU_LINE_RE.match(line):
            gpus.append((int(m.group(1)), m.group(2), m.group(3), []))
        elif m := MIG_LINE_RE.match(line):
            gpus[-1][3].append((m.group(1), int(m.group(2)), m.group(3)))
        else:
            pytest.fail(f"{bundle}/nvidia-smi-L.txt: unexpected line {line!r}")
    return gpus


def read_lscpu(bundle: str) -> dict[int, tuple[int, int, int]]:
    text = (BUILTIN / bundle / "lscpu.csv").read_text()
    assert text.startswith(LSCPU_HEADER)
    rows = {}
    for line in text[len(LSCPU_HEADER):].splitlines():
        cpu, core, socket, node = (int(x) for x in line.split(","))
        assert cpu not in rows
        rows[cpu] = (core, socket, node)
    return rows


def expand(cpu_list: str) -> list[int]:
    out: list[int] = []
    for part in cpu_list.split(","):
        lo, _, hi = part.partition("-")
        out += range(int(lo), int(hi or lo) + 1)
    return out


def mig_minor(gpu_minor: int, gi: int, ci: int | None = None) -> int:
    """The driver's fixed layout: 15 GIs per GPU minor, each a GI entry then 8 CI entries."""
    base = 3 + gpu_minor * 15 * 9 + gi * 9
    return base if ci is None else base + 1 + ci


def load_generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location("make_builtin_bundles", GENERATOR)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the class is built
    spec.loader.exec_module(module)
    return module


# ----------------------------------------------------------------------------------------- tests


@pytest.mark.parametrize("bundle", BUNDLES)
def test_bundle_holds_the_capture_files(bundle: str) -> None:
    names = {p.name for p in (BUILTIN / bundle).iterdir()}
    expected = set(COMMON_FILES) | ({"mig-minors"} if bundle == "a100-mig" else set())
    assert names == expected


@pytest.mark.parametrize("bundle", BUNDLES)
def test_gpu_count_agrees_across_files(bundle: str) -> None:
    root, gpus = read_xml(bundle)
    topo = read_topo(bundle)
    listed = read_list(bundle)
    n = int(root.findtext("attached_gpus", ""))
    assert n == len(gpus) == len(topo.gpu_columns) == len(topo.gpu_rows) == len(listed)
    assert list(topo.gpu_rows) == topo.gpu_columns == [f"GPU{i}" for i in range(n)]
    assert root.findtext("driver_version") and root.findtext("cuda_version")


@pytest.mark.parametrize("bundle", BUNDLES)
def test_gpus_are_in_pci_order_with_unique_minors(bundle: str) -> None:
    _, gpus = read_xml(bundle)
    assert [g.id_attr for g in gpus] == [g.bus_id for g in gpus]
    assert [g.bus_id for g in gpus] == sorted(g.bus_id for g in gpus)
    assert all(re.fullmatch(r"00000000:[0-9A-F]{2}:00\.0", g.bus_id) for g in gpus)
    assert len({g.minor for g in gpus}) == len(gpus)


@pytest.mark.parametrize("bundle", BUNDLES)
def test_listing_matches_the_xml(bundle: str) -> None:
    _, gpus = read_xml(bundle)
    listed = read_list(bundle)
    for i, (g, (index, name, uuid, migs)) in enumerate(zip(gpus, listed, strict=True)):
        assert (index, name, uuid) == (i, g.name, g.uuid)
        assert [m.index for m in g.migs] == [idx for _, idx, _ in migs]
        for (profile, _, _), m in zip(migs, g.migs, strict=True):
            assert A100_PROFILES[profile] == (m.memory_mib, m.sms)


@pytest.mark.parametrize("bundle", BUNDLES)
def test_topology_matrix_is_square_and_symmetric(bundle: str) -> None:
    topo = read_topo(bundle)
    labels = topo.gpu_columns + topo.nic_columns
    rows = {**topo.gpu_rows, **topo.nic_rows}
    assert list(rows) == labels
    for a in labels:
        for b in labels:
            cell = rows[a][labels.index(b)]
            assert (cell == "X") == (a == b), (a, b, cell)
            assert cell == rows[b][labels.index(a)], (a, b)
            assert re.fullmatch(r"X|NV\d+|PIX|PXB|PHB|NODE|SYS", cell)
    assert list(topo.nic_legend) == topo.nic_columns
    assert all(name.startswith("mlx5_") for name in topo.nic_legend.values())


@pytest.mark.parametrize("bundle", BUNDLES)
def test_cpu_affinity_names_cpus_of_the_gpu_numa_node(bundle: str) -> None:
    cpus = read_lscpu(bundle)
    topo = read_topo(bundle)
    for label, text in topo.affinity.items():
        ids = expand(text)
        assert ids and set(ids) <= set(cpus), label
        node = int(topo.numa[label])
        # the affinity is exactly the NUMA node's CPUs
        assert sorted(ids) == sorted(c for c, (_, _, n) in cpus.items() if n == node), label


@pytest.mark.parametrize(("bundle", "n_cpus", "n_cores", "n_nodes"),
                         [("dgx-h100", 224, 112, 2), ("l40s-4x", 128, 64, 2), ("a100-mig", 256, 128, 8)])
def test_lscpu_shape(bundle: str, n_cpus: int, n_cores: int, n_nodes: int) -> None:
    cpus = read_lscpu(bundle)
    assert sorted(cpus) == list(range(n_cpus))
    assert {s for _, s, _ in cpus.values()} == {0, 1}
    assert {n for _, _, n in cpus.values()} == set(range(n_nodes))
    threads: dict[int, list[tuple[int, int]]] = {}
    for core, socket, node in cpus.values():
        threads.setdefault(core, []).append((socket, node))
    assert sorted(threads) == list(range(n_cores))
    for core, places in threads.items():  # two hyperthreads per core, on one socket and node
        assert len(places) == 2 and places[0] == places[1], core
    per_socket = [sum(1 for _, s, _ in cpus.values() if s == k) for k in (0, 1)]
    assert per_socket == [n_cpus // 2, n_cpus // 2]


def test_uuids_are_well_formed_and_distinct_across_bundles() -> None:
    seen: list[str] = []
    for bundle in BUNDLES:
        for _, _, uuid, migs in read_list(bundle):
            seen += [uuid, *(m[2] for m in migs)]
    assert all(UUID_RE.match(u) for u in seen)
    assert len(seen) == len(set(seen))
    assert sum(u.startswith("MIG-") for u in seen) == 4


def test_mig_minors_has_every_mig_device_under_its_gpu_minor() -> None:
    text = (BUILTIN / "a100-mig" / "mig-minors").read_text()
    lines = text.splitlines()
    assert lines[:2] == ["config 1", "monitor 2"]
    entries = dict(line.rsplit(" ", 1) for line in lines[2:])
    assert [int(v) for v in entries.values()] == list(range(3, 3 + 32 * 15 * 9))
    _, gpus = read_xml("a100-mig")
    mig_gpus = [g for g in gpus if g.migs]
    assert mig_gpus and all(gpus.index(g) != g.minor for g in mig_gpus)  # keyed by minor, not index
    for g in mig_gpus:
        for m in g.migs:
            assert int(entries[f"gpu{g.minor}/gi{m.gi}/access"]) == mig_minor(g.minor, m.gi)
            assert int(entries[f"gpu{g.minor}/gi{m.gi}/ci{m.ci}/access"]) == mig_minor(g.minor, m.gi, m.ci)


def test_dgx_h100_facts() -> None:
    _, gpus = read_xml("dgx-h100")
    topo = read_topo("dgx-h100")
    assert [g.bus_id[9:11] for g in gpus] == ["1B", "43", "52", "61", "9D", "C3", "D1", "DF"]
    assert [g.minor for g in gpus] == list(range(8))
    assert {g.name for g in gpus} == {"NVIDIA H100 80GB HBM3"} and {g.memory_mib for g in gpus} == {81559}
    assert all(c in ("X", "NV18") for row in topo.gpu_rows.values() for c in row[:8])
    assert [topo.affinity[f"GPU{i}"] for i in range(8)] == ["0-55,112-167"] * 4 + ["56-111,168-223"] * 4
    assert len(topo.nic_columns) == 12
    for i, nic in enumerate(["NIC0", "NIC3", "NIC4", "NIC5", "NIC6", "NIC9", "NIC10", "NIC11"]):
        assert topo.gpu_rows[f"GPU{i}"][topo.columns.index(nic)] == "PXB"
    cpus = read_lscpu("dgx-h100")
    assert cpus[0] == cpus[112] == (0, 0, 0) and cpus[56] == cpus[168] == (56, 1, 1)


def test_l40s_facts() -> None:
    _, gpus = read_xml("l40s-4x")
    topo = read_topo("l40s-4x")
    assert sum(i != g.minor for i, g in enumerate(gpus)) >= 2
    assert {g.memory_mib for g in gpus} == {46068} and {g.mig_current for g in gpus} == {"N/A"}
    row = topo.gpu_rows
    assert row["GPU0"][1] == "PIX" and row["GPU2"][3] == "NODE"
    assert {row[f"GPU{a}"][b] for a in (0, 1) for b in (2, 3)} == {"SYS"}
    assert not any(c.startswith("NV") for r in row.values() for c in r)
    cpus = read_lscpu("l40s-4x")
    for n, (core, socket, _) in cpus.items():
        assert socket == n % 2 and core == n % 64  # OS numbering interleaves the sockets
    assert expand(topo.affinity["GPU0"]) == list(range(0, 128, 2))
    assert "-" not in topo.affinity["GPU0"]  # no consecutive ids, so no ranges


def test_a100_mig_facts() -> None:
    root, gpus = read_xml("a100-mig")
    topo = read_topo("a100-mig")
    assert ANSI_RE.search((BUILTIN / "a100-mig" / "nvidia-smi-topo.txt").read_text())
    assert topo.gpu_rows["GPU0"][1] == "NV12"
    mig, plain = gpus
    assert mig.mig_current == "Enabled" and plain.mig_current == "Disabled"
    assert [(m.gi, m.ci) for m in mig.migs] == [(2, 0), (3, 0), (9, 0), (10, 0)]
    assert [m.index for m in mig.migs] == [0, 1, 2, 3]
    gi_slices = sum(int(p.split("g.")[0]) for p, _, _ in read_list("a100-mig")[0][3])
    assert gi_slices <= 7
    # a MIG-capable GPU with MIG off lists "None", as nvidia-smi writes it
    assert root.findall("gpu")[1].findtext("mig_devices", "").strip() == "None"


@pytest.mark.parametrize("bundle", BUNDLES)
def test_meminfo_and_hostname(bundle: str) -> None:
    meminfo = (BUILTIN / bundle / "meminfo").read_text()
    m = re.match(r"MemTotal:\s+(\d+) kB\n", meminfo)
    assert m and int(m.group(1)) > 256 * 1024 * 1024
    free = re.search(r"^MemAvailable:\s+(\d+) kB$", meminfo, re.M)
    assert free and int(free.group(1)) < int(m.group(1))
    hostname = (BUILTIN / bundle / "hostname").read_text()
    assert re.fullmatch(r"[a-z0-9-]+\n", hostname)


def _element_paths(elem: ET.Element, prefix: str = "") -> set[str]:
    path = f"{prefix}/{elem.tag}"
    out = {path}
    for child in elem:
        out |= _element_paths(child, path)
    return out


@pytest.mark.parametrize("bundle", BUNDLES)
def test_xml_uses_only_element_names_of_a_real_v12_capture(bundle: str, real_fixtures: Path) -> None:
    real = ET.parse(real_fixtures / "nvidia-smi-q-x" / "a100-sxm4-mig-v12.xml").getroot()
    ours, _ = read_xml(bundle)
    assert _element_paths(ours) - _element_paths(real) == set()
    first_line = (BUILTIN / bundle / "nvidia-smi-q.xml").read_text().splitlines()[1]
    assert first_line == '<!DOCTYPE nvidia_smi_log SYSTEM "nvsmi_device_v12.dtd">'


def test_generator_reproduces_the_files_on_disk() -> None:
    generated = load_generator().build_all()
    assert sorted(generated) == sorted(BUNDLES)
    for bundle, files in generated.items():
        assert set(files) == {p.name for p in (BUILTIN / bundle).iterdir()}
        for name, text in files.items():
            assert (BUILTIN / bundle / name).read_text() == text, f"{bundle}/{name} is stale"


@pytest.mark.parametrize("bundle", BUNDLES)
def test_read_bundle_loads_each_builtin(bundle: str) -> None:
    module = pytest.importorskip("gpuslurm.hw.replay.bundle")
    read_bundle = getattr(module, "read_bundle", None)
    if read_bundle is None:
        pytest.skip("gpuslurm.hw.replay.bundle has no read_bundle yet")
    node = read_bundle(BUILTIN / bundle)
    _, gpus = read_xml(bundle)
    listed = read_list(bundle)
    assert [g.uuid for g in node.gpus] == [g.uuid for g in gpus]
    assert [g.minor for g in node.gpus] == [g.minor for g in gpus]
    assert [g.bus_id for g in node.gpus] == [g.bus_id for g in gpus]
    assert len(node.cpus) == len(read_lscpu(bundle))
    topo = read_topo(bundle)
    for g in node.gpus:
        assert list(g.cpu_affinity) == sorted(expand(topo.affinity[f"GPU{g.index}"]))
        assert [m.uuid for m in g.mig_devices] == [u for _, _, u in listed[g.index][3]]
        for m in g.mig_devices:  # the bundle holds mig-minors, so the reader must use it
            assert m.gi_minor == mig_minor(g.minor, m.gi_id)
            assert m.ci_minor == mig_minor(g.minor, m.gi_id, m.ci_id)
