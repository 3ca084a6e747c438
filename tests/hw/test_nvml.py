"""The live NVML backend against a stand-in pynvml, and the sysfs readers it relies on.

The real pynvml against the replay library (tests/hw/nvml) covers reading whole nodes: identities,
minors apart from indexes, NVSwitch and PCIe links, MIG devices with NVIDIA's profile names, per
driver version, and which calls the backend makes or skips (tests/hw/nvml/test_calls.py counts them
at pynvml's door to the library: lazy init and shutdown, no PCIe ancestor on NVSwitch nodes, no
NVLink query in MIG mode, no MIG count on a MIG-disabled GPU). What stays here is what only a
stand-in can express: sysfs and /proc trees of our making (NUMA nodes, offline CPUs, MIG minors)
together with GPUs whose affinity names them, NVLink bridges with a link down, MIG slots with
holes, a profile name rebuilt when nvidia-ml-py lacks the profile table, and injected failures
(errors, a GPU lost at its handle, functions absent from nvidia-ml-py, no driver).
"""

from __future__ import annotations

import ctypes.util
import os
import pathlib
import re
import shutil
import subprocess
import sys
from typing import Any

import pytest
from tests.helpers.fakes import fake_pynvml as fp

from gpuslurm.errors import HardwareError, NotSupported
from gpuslurm.hw.formats.mig_minors import mig_minors_text
from gpuslurm.hw.live import nvml as nvml_module
from gpuslurm.hw.live import sysfs
from gpuslurm.hw.live.nvml import NvmlBackend, mig_profile_name
from gpuslurm.hw.model.node import Cpu, Link, LinkKind


def make_sys(root: pathlib.Path, cpus: list[dict[str, Any]], pci_numa: dict[str, int] | None = None,
             siblings: bool = True) -> pathlib.Path:
    """A /sys tree: cpus are dicts with id, core_id, package, node, and optionally online=False."""
    cpu_dir = root / "devices/system/cpu"
    cpu_dir.mkdir(parents=True)
    nodes: dict[int, list[int]] = {}
    for c in cpus:
        d = cpu_dir / f"cpu{c['id']}"
        d.mkdir(parents=True)
        if c["id"] != 0:
            (d / "online").write_text("1\n" if c.get("online", True) else "0\n")
        if not c.get("online", True):
            continue  # the kernel removes topology/ of an offline CPU
        (d / "topology").mkdir()
        (d / "topology/core_id").write_text(f"{c['core_id']}\n")
        (d / "topology/physical_package_id").write_text(f"{c['package']}\n")
        if siblings:
            sib = sorted(o["id"] for o in cpus if o.get("online", True)
                         and (o["package"], o["core_id"]) == (c["package"], c["core_id"]))
            (d / "topology/thread_siblings_list").write_text(",".join(map(str, sib)) + "\n")
        nodes.setdefault(c["node"], []).append(c["id"])
    (cpu_dir / "online").write_text("0-99\n")  # not a cpuN directory: must be ignored
    for node, ids in nodes.items():
        d = root / f"devices/system/node/node{node}"
        d.mkdir(parents=True)
        (d / "cpulist").write_text(",".join(map(str, sorted(ids))) + "\n")
    (root / "devices/system/node/node9").mkdir(parents=True)  # a memory-only node
    (root / "devices/system/node/node9/cpulist").write_text("\n")
    for bus, node in (pci_numa or {}).items():
        d = root / "bus/pci/devices" / bus
        d.mkdir(parents=True)
        (d / "numa_node").write_text(f"{node}\n")
    return root


def two_socket_interleaved() -> list[dict[str, Any]]:
    """16 CPUs: 2 sockets (package ids 0 and 3) × 4 cores (sparse core_id 0,1,4,5) × 2 threads.

    Even CPUs are on socket 0, odd on socket 1; CPU c and c+8 are hyperthread siblings; CPU 15 is
    offline.
    """
    out = []
    for c in range(16):
        out.append({"id": c, "package": (0, 3)[c % 2], "core_id": (0, 1, 4, 5)[(c // 2) % 4],
                    "node": c % 2, "online": c != 15})
    return out


def dgx_sys(root: pathlib.Path) -> pathlib.Path:
    cpus = [{"id": c, "package": (c % 112) // 56, "core_id": c % 56, "node": (c % 112) // 56}
            for c in range(224)]
    numa = {f"0000:{g['bus_id'][9:11].lower()}:00.0": g["numa"] for g in fp.dgx_h100()}
    return make_sys(root, cpus, numa)


def backend(gpus: list[dict[str, Any]], tmp_path: pathlib.Path, sys_root: pathlib.Path | None = None,
            **options: Any) -> tuple[Any, NvmlBackend]:
    fake = fp.build(gpus, **options)
    proc = tmp_path / "proc"
    proc.mkdir(exist_ok=True)
    (proc / "meminfo").write_text("MemTotal:       2113407424 kB\nMemFree:        1 kB\n")
    return fake, NvmlBackend(fake, sys_root=sys_root or tmp_path / "nosys", proc_root=proc)


# -- lifecycle ------------------------------------------------------------------------------------

def test_importing_the_module_neither_imports_pynvml_nor_initialises() -> None:
    code = "import sys, gpuslurm.hw.live.nvml, gpuslurm.hw.live.capture; print('pynvml' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


@pytest.mark.parametrize(("code", "message"), [
    (fp.NVML_ERROR_LIBRARY_NOT_FOUND, "NVML is not available: NVML Shared Library Not Found"),
    (fp.NVML_ERROR_DRIVER_NOT_LOADED, "NVML is not available: Driver Not Loaded"),
    (fp.NVML_ERROR_NO_PERMISSION, "NVML nvmlInit failed: Insufficient Permissions"),
])
def test_init_failure(tmp_path: pathlib.Path, code: int, message: str) -> None:
    fake, nvml = backend(fp.pcie_pair_minor_swapped(), tmp_path, init_error=code)
    with pytest.raises(HardwareError) as info:
        nvml.read_node("n1")
    assert str(info.value) == message
    assert fake.calls == []  # nothing was asked of a library that did not start


def test_without_the_pynvml_package(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # makes "import pynvml" raise ImportError
    with pytest.raises(HardwareError, match="NVML is not available: the nvidia-ml-py package"):
        NvmlBackend().read_node("n1")


@pytest.mark.skipif(ctypes.util.find_library("nvidia-ml") is not None, reason="this machine has NVML")
def test_real_pynvml_without_a_driver_says_nvml_is_not_available(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(nvml_module, "_default", None)
    with pytest.raises(HardwareError, match=r"^NVML is not available: "):
        nvml_module.read_node()


# -- reading GPUs ---------------------------------------------------------------------------------

def test_dgx_nvswitch_node(tmp_path: pathlib.Path) -> None:
    _, nvml = backend(fp.dgx_h100(), tmp_path, dgx_sys(tmp_path / "sys"))
    node = nvml.read_node("dgx01")
    assert node.hostname == "dgx01" and node.source == "nvml" and node.warnings == ()
    assert [g.uuid for g in node.gpus] == [fp.uuid(i) for i in range(8)]
    assert [g.bus_id for g in node.gpus][:2] == ["00000000:18:00.0", "00000000:2A:00.0"]
    assert [g.numa_node for g in node.gpus] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert node.gpus[0].cpu_affinity == (*range(56), *range(112, 168))
    assert node.gpus[7].cpu_affinity == (*range(56, 112), *range(168, 224))
    assert {g.mig_mode for g in node.gpus} == {False}
    assert node.gpus[3].name == "NVIDIA H100 80GB HBM3" and node.gpus[3].memory_mib == 81559
    assert node.links is not None
    for a in range(8):
        for b in range(8):
            assert node.links[a][b] == (Link(LinkKind.SELF) if a == b else Link(LinkKind.NVLINK, 18))
    assert (node.driver_version, node.cuda_version) == ("550.54.15", "12.4")
    assert node.memory_mib == 2113407424 // 1024
    assert len(node.cpus) == 224 and node.cpus[112] == Cpu(112, 0, 0, 0)


@pytest.mark.parametrize(("level", "kind"), [
    (0, LinkKind.PIX), (10, LinkKind.PIX), (20, LinkKind.PXB), (30, LinkKind.PHB),
    (40, LinkKind.NODE), (50, LinkKind.SYS), (60, LinkKind.UNKNOWN),
])
def test_pcie_levels(tmp_path: pathlib.Path, level: int, kind: LinkKind) -> None:
    _, nvml = backend(fp.pcie_pair_minor_swapped(), tmp_path, topology=lambda a, b: level)
    links = nvml.read_node("n").links
    assert links is not None and links[0][1] == links[1][0] == Link(kind)


def test_unsupported_topology_is_unknown_not_an_error(tmp_path: pathlib.Path) -> None:
    _, nvml = backend(fp.pcie_pair_minor_swapped(), tmp_path,
                      errors={"nvmlDeviceGetTopologyCommonAncestor": fp.NVML_ERROR_NOT_SUPPORTED})
    links = nvml.read_node("n").links
    assert links is not None and links[0][1] == Link(LinkKind.UNKNOWN)


def direct_nvlink_quad() -> list[dict[str, Any]]:
    """GPUs 0-1 and 2-3 bridged by 4 NVLinks (one of 0's links is down); PCIe between the pairs."""
    gpus = fp.pcie_pair_minor_swapped() + fp.pcie_pair_minor_swapped()
    buses = ["00000000:1A:00.0", "00000000:1B:00.0", "00000000:88:00.0", "00000000:89:00.0"]
    out = []
    for i, (g, bus) in enumerate(zip(gpus, buses, strict=True)):
        peer = buses[i ^ 1]
        links: list[Any] = [peer] * 4
        if i == 0:
            links.append((peer, False))
        out.append({**g, "uuid": fp.uuid(i), "minor": i, "bus_id": bus, "nvlinks": links})
    return out


def test_direct_nvlink_bridges(tmp_path: pathlib.Path) -> None:
    _, nvml = backend(direct_nvlink_quad(), tmp_path,
                      topology=lambda a, b: fp.NVML_TOPOLOGY_HOSTBRIDGE)
    links = nvml.read_node("n").links
    assert links is not None
    assert [[str(c) for c in row] for row in links] == [
        ["X", "NV4", "PHB", "PHB"],
        ["NV4", "X", "PHB", "PHB"],
        ["PHB", "PHB", "X", "NV4"],
        ["PHB", "PHB", "NV4", "X"],
    ]


def test_mig_gpu(tmp_path: pathlib.Path) -> None:
    _, nvml = backend(fp.h200_mig(), tmp_path)
    (tmp_path / "proc/driver/nvidia-caps").mkdir(parents=True)
    (tmp_path / "proc/driver/nvidia-caps/mig-minors").write_text(mig_minors_text(1))
    node = nvml.read_node("n")
    (gpu,) = node.gpus
    assert gpu.mig_mode is True
    assert [(m.index, m.gi_id, m.ci_id, m.profile, m.memory_mib, m.sm_count)
            for m in gpu.mig_devices] == [
        (0, 2, 0, "1c.3g.70gb", 71424, 16),
        (1, 2, 1, "2c.3g.70gb", 71424, 32),
        (3, 3, 0, "2g.33gb", 33280, 32),  # slot 2 is empty (NOT_FOUND): a hole, not an error
        (4, 9, 0, "1g.16gb", 16384, 16),
    ]
    assert [m.uuid for m in gpu.mig_devices] == [fp.uuid(i, "MIG") for i in (0, 1, 3, 4)]
    first = gpu.mig_devices[0]
    assert first.device_files(gpu.minor) == (
        "/dev/nvidia0", "/dev/nvidia-caps/nvidia-cap21", "/dev/nvidia-caps/nvidia-cap22")
    assert (gpu.mig_devices[2].gi_minor, gpu.mig_devices[2].ci_minor) == (30, 31)
    assert node.warnings == ()


def test_mig_without_minors_file_warns(tmp_path: pathlib.Path) -> None:
    _, nvml = backend(fp.h200_mig(), tmp_path)
    node = nvml.read_node("n")
    assert node.gpus[0].mig_devices[0].gi_minor is None
    assert len(node.warnings) == 1 and "mig-minors" in node.warnings[0]


def test_mig_capable_but_disabled(tmp_path: pathlib.Path) -> None:
    gpus = fp.h200_mig()
    gpus[0]["mig"] = False
    _, nvml = backend(gpus, tmp_path)
    gpu = nvml.read_node("n").gpus[0]
    assert (gpu.mig_mode, gpu.mig_devices) == (False, ())


@pytest.mark.parametrize(("gi", "ci", "mib", "name"), [
    (3, 3, 40448, "3g.40gb"), (1, 1, 9984, "1g.10gb"), (7, 7, 81536, "7g.80gb"),
    (3, 1, 71424, "1c.3g.70gb"), (1, 1, 4864, "1g.5gb"), (2, 2, 19968, "2g.20gb"),
])
def test_mig_profile_name(gi: int, ci: int, mib: int, name: str) -> None:
    assert mig_profile_name(gi, ci, mib) == name


def test_mig_profile_name_rejects_nonsense() -> None:
    with pytest.raises(HardwareError, match="impossible MIG device"):
        mig_profile_name(0, 0, 100)


@pytest.mark.parametrize("lost", [True, "handle"])
def test_lost_gpu_is_a_warning_and_the_others_are_read(tmp_path: pathlib.Path, lost: Any) -> None:
    gpus = fp.dgx_h100()[:3]
    gpus[1]["lost"] = lost
    _, nvml = backend(gpus, tmp_path)
    node = nvml.read_node("n")
    assert [g.index for g in node.gpus] == [0, 2]
    assert len(node.warnings) == 1
    assert "GPU 1" in node.warnings[0] and "lost" in node.warnings[0]
    assert node.links is not None and [[str(c) for c in r] for r in node.links] == [
        ["X", "NV18"], ["NV18", "X"]]


def test_other_nvml_errors_name_the_call_and_the_gpu(tmp_path: pathlib.Path) -> None:
    _, nvml = backend(fp.pcie_pair_minor_swapped(), tmp_path,
                      errors={"nvmlDeviceGetMinorNumber": fp.NVML_ERROR_NO_PERMISSION})
    with pytest.raises(HardwareError) as info:
        nvml.read_node("n")
    assert not isinstance(info.value, NotSupported)
    assert str(info.value) == "NVML nvmlDeviceGetMinorNumber failed for GPU 0: Insufficient Permissions"


def test_a_required_call_that_is_not_supported_raises_not_supported(tmp_path: pathlib.Path) -> None:
    _, nvml = backend(fp.pcie_pair_minor_swapped(), tmp_path,
                      errors={"nvmlDeviceGetUUID": fp.NVML_ERROR_NOT_SUPPORTED})
    with pytest.raises(NotSupported, match="nvmlDeviceGetUUID is not supported for GPU 0"):
        nvml.read_node("n")


OLD = ("nvmlSystemGetCudaDriverVersion_v2", "nvmlDeviceGetNvLinkRemoteDeviceType",
       "nvmlDeviceGetAttributes_v2")


@pytest.mark.parametrize("how", ["absent", "unavailable"])
def test_old_driver(tmp_path: pathlib.Path, how: str) -> None:
    """Old nvidia-ml-py (functions absent) or old driver (FUNCTION_NOT_FOUND): same node."""
    fake, nvml = backend(fp.dgx_h100()[:4], tmp_path, cuda_version=11040, **{how: OLD})
    node = nvml.read_node("n")
    assert node.cuda_version == "11.4"
    assert "nvmlDeviceGetNvLinkRemotePciInfo" in fake.calls
    # Without remote device types the switch is recognised as a remote shared by many GPUs.
    assert node.links is not None and str(node.links[0][3]) == "NV18"
    mig_fake, mig_nvml = backend(fp.h200_mig(), tmp_path, **{how: OLD})
    assert mig_nvml.read_node("n").gpus[0].mig_devices[0].profile == "1c.3g.70gb"
    assert "nvmlDeviceGetAttributes" in mig_fake.calls


def test_cpu_affinity_covers_all_cpus_of_a_large_node(tmp_path: pathlib.Path) -> None:
    gpus = fp.pcie_pair_minor_swapped()
    gpus[1]["affinity"] = [0, 64, 65, 200, 223]
    _, nvml = backend(gpus, tmp_path, dgx_sys(tmp_path / "sys"))
    node = nvml.read_node("n")
    assert node.gpus[1].cpu_affinity == (0, 64, 65, 200, 223)
    assert node.gpus[1].numa_node is None  # CPUs of two nodes, and no sysfs entry for its bus


def test_numa_node_from_affinity_when_sysfs_has_none(tmp_path: pathlib.Path) -> None:
    gpus = fp.pcie_pair_minor_swapped()
    gpus[1]["affinity"] = [1, 3, 5]
    _, nvml = backend(gpus, tmp_path, make_sys(tmp_path / "sys", two_socket_interleaved()))
    assert nvml.read_node("n").gpus[1].numa_node == 1


# -- sysfs ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("siblings", [True, False])
def test_read_cpus_numbers_cores_like_lscpu(tmp_path: pathlib.Path, siblings: bool) -> None:
    root = make_sys(tmp_path, two_socket_interleaved(), siblings=siblings)
    cpus = sysfs.read_cpus(root)
    assert [c.os_id for c in cpus] == list(range(15))  # CPU 15 is offline
    # lscpu numbers a core when its first CPU appears: CPU c and its sibling c+8 share core c % 8.
    assert [c.core for c in cpus] == [c % 8 for c in range(15)]
    assert [c.socket for c in cpus] == [c % 2 for c in range(15)]  # package ids 0, 3 → 0, 1
    assert [c.numa_node for c in cpus] == [c % 2 for c in range(15)]
    assert len({c.core for c in cpus}) == 8


def test_read_cpus_without_numa(tmp_path: pathlib.Path) -> None:
    root = make_sys(tmp_path, [{"id": 0, "package": 0, "core_id": 0, "node": 0}])
    shutil.rmtree(root / "devices/system/node")
    assert sysfs.read_cpus(root) == (Cpu(0, 0, 0, None),)


def test_read_cpus_rejects_garbage(tmp_path: pathlib.Path) -> None:
    root = make_sys(tmp_path, [{"id": 0, "package": 0, "core_id": 0, "node": 0}])
    (root / "devices/system/cpu/cpu0/topology/core_id").write_text("zero\n")
    with pytest.raises(HardwareError, match="core_id: expected a number"):
        sysfs.read_cpus(root)


@pytest.mark.skipif(shutil.which("lscpu") is None, reason="lscpu is not installed")
def test_read_cpus_matches_lscpu_on_this_machine() -> None:
    out = subprocess.run(["lscpu", "-p=CPU,CORE,SOCKET,NODE"], capture_output=True, text=True,
                         check=True).stdout
    expected = []
    for line in out.splitlines():
        if line.startswith("#"):
            continue
        cpu, core, sock, node = line.split(",")
        expected.append(Cpu(int(cpu), int(core), int(sock), int(node) if node else None))
    assert list(sysfs.read_cpus()) == expected


def test_meminfo_on_this_machine() -> None:
    # sysinfo(2)'s total RAM, the figure MemTotal reports, by another road than /proc/meminfo
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    assert sysfs.read_meminfo_mib() == total // (1024 * 1024)


def test_meminfo_missing_and_odd(tmp_path: pathlib.Path) -> None:
    assert sysfs.read_meminfo_mib(tmp_path / "absent") is None
    (tmp_path / "m").write_text("MemFree: 1 kB\n")
    assert sysfs.read_meminfo_mib(tmp_path / "m") is None
    (tmp_path / "m").write_text("MemTotal: 12 MB\n")
    with pytest.raises(HardwareError, match="unexpected MemTotal"):
        sysfs.read_meminfo_mib(tmp_path / "m")


def test_pci_numa_node(tmp_path: pathlib.Path) -> None:
    root = make_sys(tmp_path, [], {"0000:c1:00.0": 1, "0000:81:00.0": -1, "10000:01:00.0": 0})
    assert sysfs.pci_numa_node("00000000:C1:00.0", root) == 1
    assert sysfs.pci_numa_node("00000000:81:00.0", root) is None  # -1: the kernel does not know
    assert sysfs.pci_numa_node("00010000:01:00.0", root) == 0  # VMD domains have five digits
    assert sysfs.pci_numa_node("00000000:02:00.0", root) is None


def test_pci_numa_node_on_this_machine() -> None:
    devices = sorted(pathlib.Path("/sys/bus/pci/devices").glob("*/numa_node"))
    if not devices:
        pytest.skip("no PCI devices in /sys")
    for path in devices[:5]:
        raw = int(path.read_text())
        assert sysfs.pci_numa_node(path.parent.name) == (None if raw < 0 else raw)


def test_cpu_count_is_a_floor_for_the_affinity_buffer(tmp_path: pathlib.Path) -> None:
    gpus = fp.pcie_pair_minor_swapped()
    highest = (os.cpu_count() or 1) - 1
    gpus[0]["affinity"] = [highest]
    _, nvml = backend(gpus, tmp_path)  # no /sys: only os.cpu_count() sizes the buffer
    assert nvml.read_node("n").gpus[0].cpu_affinity == (highest,)


# -- the stand-in is faithful ---------------------------------------------------------------------

def test_fake_mirrors_the_installed_nvidia_ml_py() -> None:
    real = pytest.importorskip("pynvml")
    for name in dir(fp.SamplingNvml):  # the node reader's calls and the monitor's
        if name.startswith("nvml"):
            assert hasattr(real, name), name
        elif name.startswith("NVML_") and name != "NVML_NVLINK_MAX_LINKS":
            assert getattr(real, name) == getattr(fp, name), name
    # Every NVML function the backend names exists in nvidia-ml-py (the _v2 spelling is the
    # name nvidia-ml-py 11 used), so a typo cannot hide behind "absent, so not supported".
    source = pathlib.Path(nvml_module.__file__).read_text()
    called = set(re.findall(r'"(nvml[A-Z]\w+)"', source))
    assert called - {"nvmlDeviceGetNvLinkRemotePciInfo_v2"} <= set(dir(real))
    # The MIG profile table and instance lookups are served by the replay library through the
    # real pynvml (tests/hw/nvml); here they are absent, so the fake exercises the fallback naming.
    replay_only = {"nvmlDeviceGetGpuInstanceProfileInfo", "nvmlDeviceGetGpuInstanceById",
                   "nvmlGpuInstanceGetInfo"}
    assert called - {"nvmlDeviceGetNvLinkRemotePciInfo_v2"} - replay_only <= set(dir(fp.SamplingNvml))
    assert issubclass(real.NVMLError(real.NVML_ERROR_GPU_IS_LOST).__class__, real.NVMLError)
    assert fp.NVMLError(fp.NVML_ERROR_GPU_IS_LOST).value == real.NVMLError(real.NVML_ERROR_GPU_IS_LOST).value


def test_affinity_keeps_only_online_cpus(tmp_path: pathlib.Path) -> None:
    gpus = fp.pcie_pair_minor_swapped()
    gpus[0]["affinity"] = [0, 2, 15]  # CPU 15 is offline in this tree
    gpus[1]["affinity"] = [1, 3, 31]  # and CPU 31 does not exist
    _, nvml = backend(gpus, tmp_path, make_sys(tmp_path / "sys", two_socket_interleaved()))
    node = nvml.read_node("n")
    assert node.gpus[0].cpu_affinity == (0, 2)
    assert node.gpus[1].cpu_affinity == (1, 3)
    assert [w.split(":")[0] for w in node.warnings] == ["GPU 0", "GPU 1"]
    assert "[15]" in node.warnings[0]


def test_a_bridge_to_a_gpu_in_mig_mode_counts_from_its_peer(tmp_path: pathlib.Path) -> None:
    """NVML answers no NVLink query in MIG mode: the peer's count stands for both directions."""
    gpus = direct_nvlink_quad()[:2]
    gpus[0]["mig"] = True  # and no MIG devices yet
    _, nvml = backend(gpus, tmp_path, topology=lambda a, b: fp.NVML_TOPOLOGY_HOSTBRIDGE)
    links = nvml.read_node("n").links
    assert links is not None and [[str(c) for c in row] for row in links] == [["X", "NV4"], ["NV4", "X"]]
