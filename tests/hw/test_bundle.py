"""read_bundle on bundles assembled in tmp_path from real XML captures, and source selection."""

from __future__ import annotations

import shutil
import sys
import types
from pathlib import Path

import pytest

from gpuslurm.errors import CaptureError, HardwareError
from gpuslurm.hw import source
from gpuslurm.hw.formats.mig_minors import mig_minors_text
from gpuslurm.hw.formats.nvml_json import dump_node
from gpuslurm.hw.model.node import Cpu, Link, LinkKind, Node
from gpuslurm.hw.replay.bundle import read_bundle

# Two sockets, 16 cores each, SMT siblings 32 apart (the usual Linux numbering).
LSCPU_2S = "# CPU,Core,Socket,Node\n" + "".join(
    f"{cpu},{cpu % 32},{(cpu % 32) // 16},{(cpu % 32) // 16}\n" for cpu in range(64))

TOPO_2 = (
    "\t\x1b[4mGPU0\tGPU1\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID\x1b[0m\n"
    "GPU0\t X \tSYS\t0-15,32-47\t0\t\tN/A\n"
    "GPU1\tSYS\t X \t16-31,48-63\t1\t\tN/A\n"
    "\nLegend:\n\n  X    = Self\n"
)

MEMINFO = "MemTotal:       527952188 kB\nMemFree:        500000000 kB\n"

A100_UUID = "GPU-513536b6-7d19-9063-b049-1e69664bb298"
A100_LIST = f"GPU 0: NVIDIA A100-SXM4-80GB (UUID: {A100_UUID})\n" + "".join(
    f"  MIG 1g.20gb     Device  {i}: (UUID: MIG-5b1e3a2c-0000-5000-8000-00000000000{i})\n" for i in range(4))


def make_bundle(root: Path, files: dict[str, str | Path]) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    for name, content in files.items():
        if isinstance(content, Path):
            shutil.copyfile(content, root / name)
        else:
            (root / name).write_text(content)
    return root


def error_of(path: Path) -> str:
    with pytest.raises(CaptureError) as info:
        read_bundle(path)
    msg = str(info.value)
    assert "\n" not in msg
    return msg


@pytest.fixture
def xml_dir(real_fixtures: Path) -> Path:
    return real_fixtures / "nvidia-smi-q-x"


def test_full_bundle_minor_differs_from_index(tmp_path: Path, xml_dir: Path) -> None:
    b = make_bundle(tmp_path / "gpu07", {
        "nvidia-smi-q.xml": xml_dir / "dual_a5000-v13.xml", "nvidia-smi-topo.txt": TOPO_2,
        "lscpu.csv": LSCPU_2S, "meminfo": MEMINFO, "hostname": "gpu07.cluster\n", "NOTES.md": "ignored",
    })
    node = read_bundle(b)
    assert node.hostname == "gpu07.cluster"
    assert node.source == f"replay:{b}"
    assert node.driver_version == "590.44.01" and node.cuda_version == "13.1"
    assert node.memory_mib == 527952188 // 1024
    assert [(g.index, g.minor, g.bus_id) for g in node.gpus] == [
        (0, 1, "00000000:81:00.0"), (1, 0, "00000000:C1:00.0")]
    x, sys_ = Link(LinkKind.SELF), Link(LinkKind.SYS)
    assert node.links == ((x, sys_), (sys_, x))
    assert node.gpus[0].cpu_affinity == (*range(0, 16), *range(32, 48))
    assert node.gpus[1].numa_node == 1
    assert len(node.cpus) == 64 and node.cpus[40] == Cpu(40, 8, 0, 0)
    assert node.warnings == ()


def test_xml_only(tmp_path: Path, xml_dir: Path) -> None:
    node = read_bundle(make_bundle(tmp_path / "t4box", {"nvidia-smi-q.xml": xml_dir / "tesla-t4.xml"}))
    assert node.hostname == "t4box"
    assert node.links is None and node.cpus == () and node.memory_mib is None
    assert node.gpus[0].cpu_affinity == () and node.gpus[0].numa_node is None
    assert node.gpus[0].name == "Tesla T4"


def test_parser_warnings_reach_the_node(tmp_path: Path, xml_dir: Path) -> None:
    node = read_bundle(make_bundle(tmp_path / "b", {"nvidia-smi-q.xml": xml_dir / "dual_2080-v13.xml"}))
    assert len({g.uuid for g in node.gpus}) == 2
    assert any("repeats UUID" in w for w in node.warnings)


def test_mig_with_listing_and_minors(tmp_path: Path, xml_dir: Path) -> None:
    b = make_bundle(tmp_path / "a100", {
        "nvidia-smi-q.xml": xml_dir / "a100-sxm4-mig-v12.xml", "nvidia-smi-L.txt": A100_LIST,
        "mig-minors": mig_minors_text(2),
    })
    node = read_bundle(b)
    gpu = node.gpus[0]
    assert gpu.minor == 1 and gpu.mig_mode is True
    migs = gpu.mig_devices
    assert [m.profile for m in migs] == ["1g.20gb"] * 4
    assert migs[0].uuid == "MIG-5b1e3a2c-0000-5000-8000-000000000000"
    # Keyed by the GPU's minor (1), not its index (0): gpu1 starts at 3 + 135, GI 3 is 3 * 9 further.
    assert (migs[0].gi_id, migs[0].gi_minor, migs[0].ci_minor) == (3, 138 + 27, 138 + 28)
    assert migs[3].device_files(gpu.minor) == (
        "/dev/nvidia1", "/dev/nvidia-caps/nvidia-cap192", "/dev/nvidia-caps/nvidia-cap193")
    assert any("attached_gpus" in w for w in node.warnings)
    assert not any("MIG" in w for w in node.warnings)


def test_mig_without_listing_or_minors_warns(tmp_path: Path, xml_dir: Path) -> None:
    node = read_bundle(make_bundle(tmp_path / "a", {"nvidia-smi-q.xml": xml_dir / "a100-sxm4-mig-v12.xml"}))
    assert all(m.gi_minor is None and m.profile == "" for m in node.gpus[0].mig_devices)
    assert any("nvidia-smi-L.txt" in w for w in node.warnings)
    assert any("mig-minors" in w for w in node.warnings)


def test_mig_minor_missing_names_the_file(tmp_path: Path, xml_dir: Path) -> None:
    # A table for GPU minor 0 only, while the A100 is minor 1.
    b = make_bundle(tmp_path / "a", {"nvidia-smi-q.xml": xml_dir / "a100-sxm4-mig-v12.xml",
                                     "mig-minors": mig_minors_text(1)})
    msg = error_of(b)
    assert msg.startswith(f"{b / 'mig-minors'}: no gpu1/gi3/access entry for MIG device 0 of GPU0")


def test_topo_gpu_count_mismatch(tmp_path: Path, xml_dir: Path) -> None:
    topo4 = "\tGPU0\tGPU1\tGPU2\tGPU3\tCPU Affinity\n" + "".join(
        f"GPU{i}\t" + "\t".join(" X " if j == i else "NV4" for j in range(4)) + "\t0-7\n" for i in range(4))
    b = make_bundle(tmp_path / "b", {"nvidia-smi-q.xml": xml_dir / "dual_a5000-v13.xml",
                                     "nvidia-smi-topo.txt": topo4})
    assert error_of(b) == (f"{b / 'nvidia-smi-topo.txt'}: 4 GPUs in the matrix but nvidia-smi-q.xml "
                           "describes 2")


def test_affinity_outside_lscpu(tmp_path: Path, xml_dir: Path) -> None:
    b = make_bundle(tmp_path / "b", {"nvidia-smi-q.xml": xml_dir / "dual_a5000-v13.xml",
                                     "nvidia-smi-topo.txt": TOPO_2,
                                     "lscpu.csv": "\n".join(LSCPU_2S.splitlines()[:33])})  # CPUs 0-31
    msg = error_of(b)
    assert msg.startswith(f"{b / 'nvidia-smi-topo.txt'}: GPU0 CPU affinity names CPUs 32-47")
    assert "lscpu.csv does not list" in msg


def test_bad_member_file_is_named(tmp_path: Path, xml_dir: Path) -> None:
    b = make_bundle(tmp_path / "b", {"nvidia-smi-q.xml": xml_dir / "tesla-t4.xml",
                                     "lscpu.csv": "# CPU,Socket,Node\n0,0,0\n"})
    assert error_of(b).startswith(f"{b / 'lscpu.csv'}: lacks the Core column")
    (b / "lscpu.csv").unlink()
    (b / "meminfo").write_text("MemFree: 1 kB\n")
    assert error_of(b) == f"{b / 'meminfo'}: no MemTotal line"
    (b / "meminfo").write_text("MemTotal: lots\n")
    assert "MemTotal is 'lots'" in error_of(b)


def test_no_gpu_facts_and_missing_dir(tmp_path: Path) -> None:
    b = make_bundle(tmp_path / "empty", {"lscpu.csv": LSCPU_2S})
    assert error_of(b) == f"{b}: no GPU facts: the bundle needs nvml.json or nvidia-smi-q.xml"
    assert error_of(tmp_path / "nope") == f"{tmp_path / 'nope'}: no such capture bundle directory"


def _nvml_node(xml_dir: Path, tmp_path: Path) -> Node:
    base = read_bundle(make_bundle(tmp_path / "src", {
        "nvidia-smi-q.xml": xml_dir / "dual_a5000-v13.xml", "nvidia-smi-topo.txt": TOPO_2,
        "lscpu.csv": LSCPU_2S}))
    return base._replace(hostname="dgx9", memory_mib=1024)


def test_nvml_json_is_authoritative(tmp_path: Path, xml_dir: Path) -> None:
    node = _nvml_node(xml_dir, tmp_path)
    # nvml.json says GPU0 is near CPUs 0-3 only; a stale topo file must not override it.
    gpus = (node.gpus[0]._replace(cpu_affinity=(0, 1, 2, 3), numa_node=0), node.gpus[1])
    node = node._replace(gpus=gpus, links=((Link(LinkKind.SELF), Link(LinkKind.NVLINK, 4)),
                                           (Link(LinkKind.NVLINK, 4), Link(LinkKind.SELF))))
    b = make_bundle(tmp_path / "dir", {"nvml.json": dump_node(node), "nvidia-smi-topo.txt": TOPO_2,
                                       "meminfo": MEMINFO, "hostname": "other"})
    got = read_bundle(b)
    assert got.hostname == "dgx9" and got.memory_mib == 1024
    assert got.gpus[0].cpu_affinity == (0, 1, 2, 3)
    assert got.links is not None and got.links[0][1] == Link(LinkKind.NVLINK, 4)
    assert got.cpus == node.cpus
    assert got._replace(source="") == node._replace(source="")


def test_nvml_json_partial_fills_from_other_files(tmp_path: Path, xml_dir: Path) -> None:
    b = make_bundle(tmp_path / "dir", {
        "nvml.json": '{"format": "gpuslurm-nvml", "version": 1, "hostname": "n1", "memory_mib": 5}',
        "nvidia-smi-q.xml": xml_dir / "dual_a5000-v13.xml", "nvidia-smi-topo.txt": TOPO_2})
    node = read_bundle(b)
    assert node.hostname == "n1" and node.memory_mib == 5 and node.driver_version == "590.44.01"
    assert len(node.gpus) == 2 and node.gpus[1].numa_node == 1


def test_nvml_json_affinity_outside_its_cpus(tmp_path: Path, xml_dir: Path) -> None:
    node = _nvml_node(xml_dir, tmp_path)
    node = node._replace(cpus=node.cpus[:16])
    b = make_bundle(tmp_path / "dir", {"nvml.json": dump_node(node)})
    assert error_of(b).startswith(f"{b / 'nvml.json'}: GPU0 CPU affinity names CPUs 32-47 that nvml.json")


def test_nvml_json_links_wrong_size(tmp_path: Path, xml_dir: Path) -> None:
    node = _nvml_node(xml_dir, tmp_path)._replace(links=((Link(LinkKind.SELF),),))
    b = make_bundle(tmp_path / "dir", {"nvml.json": dump_node(node)})
    assert error_of(b).startswith(f"{b / 'nvml.json'}: \"links\" is not a 2x2 matrix")


# --- source selection -------------------------------------------------------------------------


@pytest.fixture
def builtins(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, xml_dir: Path) -> Path:
    root = tmp_path / "builtin"
    make_bundle(root / "dgx-h100", {"nvidia-smi-q.xml": xml_dir / "dual_a5000-v13.xml"})
    make_bundle(root / "l40s-4x", {"nvidia-smi-q.xml": xml_dir / "tesla-t4.xml"})
    (root / "__pycache__").mkdir()
    (root / "README").write_text("not a capture")
    monkeypatch.setattr(source, "BUILTIN_DIR", root)
    monkeypatch.delenv("GPUSLURM_CAPTURE", raising=False)
    return root


def test_builtin_names(builtins: Path) -> None:
    assert source.builtin_names() == ["dgx-h100", "l40s-4x"]


def test_hardware_source(builtins: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GPUSLURM_CAPTURE", raising=False)
    assert source.hardware_source(None) == source.LIVE and not source.LIVE.replay
    assert source.LIVE.describe() == "NVML"
    dgx = source.hardware_source("builtin:dgx-h100")
    assert dgx.bundle == str(builtins / "dgx-h100") and dgx.replay
    assert dgx.describe() == "replay of builtin:dgx-h100"
    assert source.hardware_source("l40s-4x").bundle == str(builtins / "l40s-4x")
    mine = make_bundle(tmp_path / "cwd" / "l40s-4x", {})
    monkeypatch.chdir(tmp_path / "cwd")
    assert source.hardware_source("l40s-4x").bundle == "l40s-4x"  # an existing path wins
    assert source.hardware_source(str(mine)).describe() == f"replay of {mine}"
    assert source.hardware_source(None, environ={"GPUSLURM_CAPTURE": "l40s-4x"}).bundle == "l40s-4x"
    monkeypatch.setenv("GPUSLURM_CAPTURE", "dgx-h100")
    assert source.hardware_source(None).bundle == str(builtins / "dgx-h100")
    assert source.hardware_source(None, environ={}) == source.LIVE  # the hook's own environment
    assert source.hardware_source("builtin:l40s-4x").bundle == str(builtins / "l40s-4x")
    from gpuslurm.hw.live import nvml_lib

    monkeypatch.setattr(nvml_lib, "_library_path", "")  # restored after the test
    assert source.hardware_source("dgx-h100", nvml_library="/opt/nvml.so").nvml_library == ""
    assert nvml_lib._library_path == ""  # a replay never chooses the process's NVML
    assert source.hardware_source(None, nvml_library="/opt/nvml.so", environ={}) == \
        source.HardwareSource(None, "/opt/nvml.so")
    assert nvml_lib._library_path == "/opt/nvml.so"  # chosen once, before any reader initialises it


@pytest.mark.parametrize("spec", ["nonesuch", "builtin:nonesuch", "builtin:l40s-4x/../dgx-h100"])
def test_resolve_unknown_lists_builtins(builtins: Path, spec: str) -> None:
    with pytest.raises(CaptureError) as info:
        source.hardware_source(spec)
    assert str(info.value).startswith(f"--from {spec}: ")
    assert "builtin captures: dgx-h100, l40s-4x" in str(info.value)


def test_resolve_env_and_file_errors(builtins: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUSLURM_CAPTURE", "nonesuch")
    with pytest.raises(CaptureError, match=r"^GPUSLURM_CAPTURE nonesuch: neither"):
        source.hardware_source(None)
    (tmp_path / "f.xml").write_text("x")
    with pytest.raises(CaptureError, match="is a file"):
        source.hardware_source(str(tmp_path / "f.xml"))


def test_load_node_replays(builtins: Path) -> None:
    node = source.load_node("dgx-h100")
    assert node.source == "builtin:dgx-h100" and len(node.gpus) == 2


def test_load_node_without_nvml_gives_hint(builtins: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake = types.ModuleType("gpuslurm.hw.live.nvml")

    def read_node() -> Node:
        raise HardwareError("NVML library libnvidia-ml.so.1 not found")

    fake.read_node = read_node  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "gpuslurm.hw.live.nvml", fake)
    with pytest.raises(HardwareError) as info:
        source.load_node(None)
    assert str(info.value) == ("NVML library libnvidia-ml.so.1 not found; no NVML here; use --from DIR "
                               "or --from dgx-h100 to replay a capture")
