"""Driver R545: what changed for gpuslurm's NVML calls, served by the library and read back.

From nvml.h in NVIDIA's nvidia-settings releases (``src/nvml.h`` at tags 535.113.01, 545.23.06,
545.29.06, 550.40.07; ``conftest.driver_lacks`` has the whole history):

* Process lists: R545 declares the same entry points as 535.104 and later: the ``_v3`` queries
  with the 24-byte ``nvmlProcessInfo_t`` (= ``nvmlProcessInfo_v2_t``), the versioned
  ``nvmlDeviceGetRunningProcessDetailList`` (``usedGpuCcProtectedMemory`` lives in its
  ``nvmlProcessDetail_v1_t``) and ``nvmlDeviceGetConfComputeMemSizeInfo``. There is no
  ``nvmlProcessInfo_v3_t`` in any release. gpuslurm must read ``_v3`` with 24-byte entries there,
  where early R535 (535.43 to 535.86) writes 32-byte ones behind the same name.
* Memory: ``nvmlMemory_v2_t`` keeps its layout and version. R545 only dropped the R510-R535 note
  that v2's ``used`` "also includes" ``reserved``; the field was already documented as allocated
  memory and drivers report it without the reservation (nvidia-smi's "Used"), which is what the
  library serves for every version.
* MIG profiles: R545 added version 3 of ``nvmlGpuInstanceProfileInfo`` (``isP2pSupported``
  dropped, ``capabilities`` appended: every field from ``sliceCount`` on moves 4 bytes) and of
  ``nvmlComputeInstanceProfileInfo`` (``capabilities`` appended), both accepted by the ``*V``
  queries. nvidia-ml-py (and so gpuslurm) asks for v2, which every driver from R470 answers the same.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
from tests.helpers.nvml_replay import NODE_DUMP, LiveNode, MakeLiveNode, run_as_bundle_host

from gpuslurm.hw.formats.nvml_json import node_to_dict
from gpuslurm.hw.replay.bundle import read_bundle

BUILTIN = Path(__file__).parents[3] / "src" / "gpuslurm" / "hw" / "builtin"
R545 = "545.29.06"
PROCS = {0: [(4242, 1000), (4343, 2000), (4444, 3000)], 2: [(5151, 512)]}


def bundle_at(tmp_path: Path, name: str, driver: str) -> Path:
    """A copy of built-in bundle ``name`` whose nvidia-smi -q says driver ``driver``."""
    bundle = tmp_path / f"{name}-{driver}"
    shutil.copytree(BUILTIN / name, bundle)
    xml = bundle / "nvidia-smi-q.xml"
    text, n = re.subn(r"<driver_version>[^<]*</driver_version>", f"<driver_version>{driver}</driver_version>",
                      xml.read_text())
    assert n == 1
    xml.write_text(text)
    assert read_bundle(bundle).driver_version == driver
    return bundle


SYMBOLS = """
import json, pynvml as n
n.nvmlInit()
def has(s):
    try:
        n._nvmlGetFunctionPointer(s)
        return True
    except n.NVMLError:
        return False
print(json.dumps({s: has(s) for s in ("nvmlDeviceGetComputeRunningProcesses_v3",
      "nvmlDeviceGetComputeRunningProcesses_v2", "nvmlDeviceGetRunningProcessDetailList",
      "nvmlDeviceGetConfComputeMemSizeInfo", "nvmlDeviceGetMemoryInfo_v2")}))
"""


@pytest.mark.parametrize(("driver", "v3", "details"), [
    ("535.54.03", True, False), ("535.98", False, False), ("535.161.08", True, True), (R545, True, True),
])
def test_entry_points_by_driver(driver: str, v3: bool, details: bool, live_node: MakeLiveNode,
                                tmp_path: Path) -> None:
    node = live_node(bundle_at(tmp_path, "l40s-4x", driver), processes=PROCS)
    assert json.loads(node.python(SYMBOLS)) == {
        "nvmlDeviceGetComputeRunningProcesses_v3": v3, "nvmlDeviceGetComputeRunningProcesses_v2": True,
        "nvmlDeviceGetRunningProcessDetailList": details, "nvmlDeviceGetConfComputeMemSizeInfo": True,
        "nvmlDeviceGetMemoryInfo_v2": True}


GPUSLURM_PROCS = """
import json
from gpuslurm.hw.live import nvml_lib
from gpuslurm.hw.live.nvml_sampler import NvmlSampler
from gpuslurm.hw.live.nvml_health import NvmlHealthReader
from gpuslurm.hw.live.nvml import read_node
lib = nvml_lib.NvmlLibrary()
suffix, entry = lib._processes_abi()
r = NvmlSampler().read()
h = NvmlHealthReader().read(read_node(links=False).gpus)
print(json.dumps({"abi": [suffix, entry.__name__],
                  "sampler": sorted([p.gpu_uuid, p.pid, p.mem_mib] for p in r.processes),
                  "health": sorted([u, p.pid, p.used_mib] for u, g in h.items() for p in g.processes or ())}))
"""


def _want(bundle: Path) -> list[list[object]]:
    model = read_bundle(bundle)
    return sorted([model.gpus[g].uuid, pid, mib] for g, ps in PROCS.items() for pid, mib in ps)


@pytest.mark.parametrize(("driver", "abi"), [
    ("535.54.03", ["_v3", "_ProcessInfoR535"]),  # 32-byte entries
    (R545, ["_v3", "_ProcessInfo"]),  # 24-byte entries
])
def test_gpuslurm_reads_each_layout(driver: str, abi: list[str], live_node: MakeLiveNode,
                                    tmp_path: Path) -> None:
    bundle = bundle_at(tmp_path, "l40s-4x", driver)
    got = json.loads(live_node(bundle, processes=PROCS).python(GPUSLURM_PROCS))
    assert got == {"abi": abi, "sampler": _want(bundle), "health": _want(bundle)}


WRONG_LAYOUT = """
import json
from gpuslurm.hw.live import nvml_lib
# the deliberate mistake: R545 read as early R535 (32-byte entries behind _v3)
nvml_lib.NvmlLibrary._processes_abi = lambda self: ("_v3", nvml_lib._ProcessInfoR535)
from gpuslurm.hw.live.nvml_sampler import NvmlSampler
print(json.dumps(sorted([p.gpu_uuid, p.pid, p.mem_mib] for p in NvmlSampler().read().processes)))
"""


def test_reading_r545_with_the_r535_layout_is_caught(live_node: MakeLiveNode, tmp_path: Path) -> None:
    bundle = bundle_at(tmp_path, "l40s-4x", R545)
    assert json.loads(live_node(bundle, processes=PROCS).python(WRONG_LAYOUT)) != _want(bundle)


PYNVML = """
import json, pynvml as n
n.nvmlInit()
print(json.dumps([[p.pid, p.usedGpuMemory] for p in
                  n.nvmlDeviceGetComputeRunningProcesses(n.nvmlDeviceGetHandleByIndex(0))]))
"""


def test_pynvml_itself_reads_r545(live_node: MakeLiveNode, tmp_path: Path) -> None:
    """nvidia-ml-py's own _v3 wrapper (24-byte struct) is right on R545, wrong on early R535."""
    want = [[4242, 1000 << 20], [4343, 2000 << 20], [4444, 3000 << 20]]
    node = live_node(bundle_at(tmp_path, "l40s-4x", R545), processes=PROCS)
    assert json.loads(node.python(PYNVML)) == want
    node = live_node(bundle_at(tmp_path, "l40s-4x", "535.54.03"), processes=PROCS)
    assert json.loads(node.python(PYNVML)) != want


MEMORY = """
import json, pynvml as n
n.nvmlInit()
h = n.nvmlDeviceGetHandleByIndex(0)
v1, v2 = n.nvmlDeviceGetMemoryInfo(h), n.nvmlDeviceGetMemoryInfo(h, n.nvmlMemory_v2)
print(json.dumps({"v1": [v1.total, v1.used], "v2": [v2.version, v2.total, v2.used, v2.reserved]}))
"""


@pytest.mark.parametrize("driver", ["535.161.08", R545])
def test_memory_v2_is_the_same_struct(driver: str, live_node: MakeLiveNode, tmp_path: Path) -> None:
    bundle = bundle_at(tmp_path, "l40s-4x", driver)
    got = json.loads(live_node(bundle, processes=PROCS, reserved_mib={0: 512}).python(MEMORY))
    total = read_bundle(bundle).gpus[0].memory_mib << 20
    used = 6000 << 20  # the processes' 1000 + 2000 + 3000 MiB
    assert got == {"v1": [total, used + (512 << 20)], "v2": [0x02000028, total, used, 512 << 20]}


# nvml.h's layouts, written out here so a mistake in the library's own (it uses the header's
# types) shows as a difference: GI v2 has isP2pSupported after id, v3 has not and appends
# capabilities.
PROFILES = """
import ctypes, json, pynvml as n

class GiV2(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint), ("id", ctypes.c_uint), ("isP2pSupported", ctypes.c_uint),
                ("sliceCount", ctypes.c_uint), ("instanceCount", ctypes.c_uint),
                ("multiprocessorCount", ctypes.c_uint), ("engines", ctypes.c_uint * 5),
                ("memorySizeMB", ctypes.c_ulonglong), ("name", ctypes.c_char * 96)]

class GiV3(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint), ("id", ctypes.c_uint), ("sliceCount", ctypes.c_uint),
                ("instanceCount", ctypes.c_uint), ("multiprocessorCount", ctypes.c_uint),
                ("engines", ctypes.c_uint * 5), ("memorySizeMB", ctypes.c_ulonglong),
                ("name", ctypes.c_char * 96), ("capabilities", ctypes.c_uint)]

def version(struct, v):
    return ctypes.sizeof(struct) | v << 24

n.nvmlInit()
h = n.nvmlDeviceGetHandleByIndex(0)
gi_fn = n._nvmlGetFunctionPointer("nvmlDeviceGetGpuInstanceProfileInfoV")
out = {"v2": [], "v3": [], "v3_as_v2": [], "codes": []}
for profile in range(n.NVML_GPU_INSTANCE_PROFILE_COUNT):
    a = GiV2(version=version(GiV2, 2))
    if gi_fn(h, profile, ctypes.byref(a)) != 0:
        continue
    out["v2"].append([a.id, a.sliceCount, a.memorySizeMB, a.name.decode()])
    b = GiV3(version=version(GiV3, 3))
    code = gi_fn(h, profile, ctypes.byref(b))
    out["codes"].append(code)
    if code == 0:
        out["v3"].append([b.id, b.sliceCount, b.memorySizeMB, b.name.decode()])
        wrong = GiV2.from_buffer_copy(bytes(b)[:ctypes.sizeof(GiV2)])  # v3's bytes read as v2
        out["v3_as_v2"].append([wrong.id, wrong.sliceCount, wrong.memorySizeMB])
print(json.dumps(out))
"""


def _profiles(node: LiveNode) -> dict[str, list[object]]:
    return json.loads(node.python(PROFILES))  # type: ignore[no-any-return]


def test_mig_profile_info_v3_from_r545(live_node: MakeLiveNode, tmp_path: Path) -> None:
    r545 = _profiles(live_node(bundle_at(tmp_path, "a100-mig", R545)))
    r535 = _profiles(live_node(bundle_at(tmp_path, "a100-mig", "535.161.08")))
    assert r545["v2"] and r545["v2"] == r535["v2"]  # v2 is answered alike
    assert set(r545["codes"]) == {0} and r545["v3"] == r545["v2"]  # v3: the same profiles, its layout
    assert set(r535["codes"]) == {2} and r535["v3"] == []  # INVALID_ARGUMENT: R535 knows no v3
    # the layouts differ: v3's answer read with v2's layout is wrong (a library writing v2's
    # layout for a v3 request, or the reverse, fails the equality above)
    assert [row[:3] for row in r545["v2"]] != r545["v3_as_v2"]


CI_PROFILE = """
import ctypes, json, pynvml as n
class CiV3(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint), ("id", ctypes.c_uint), ("sliceCount", ctypes.c_uint),
                ("instanceCount", ctypes.c_uint), ("multiprocessorCount", ctypes.c_uint),
                ("engines", ctypes.c_uint * 5), ("name", ctypes.c_char * 96),
                ("capabilities", ctypes.c_uint)]
n.nvmlInit()
h = n.nvmlDeviceGetHandleByIndex(0)
m = n.nvmlDeviceGetMigDeviceHandleByIndex(h, 0)
gi = n.nvmlDeviceGetGpuInstanceById(h, n.nvmlDeviceGetGpuInstanceId(m))
fn = n._nvmlGetFunctionPointer("nvmlGpuInstanceGetComputeInstanceProfileInfoV")
v2 = n.nvmlGpuInstanceGetComputeInstanceProfileInfo(gi, 0, 0)
v3 = CiV3(version=ctypes.sizeof(CiV3) | 3 << 24, capabilities=0xdead)
code = fn(gi, 0, 0, ctypes.byref(v3))
print(json.dumps({"v2": [v2.id, v2.sliceCount, str(v2.name)], "code": code,
                  "v3": [v3.id, v3.sliceCount, v3.name.decode(), v3.capabilities] if code == 0 else None}))
"""


def test_compute_instance_profile_info_v3_from_r545(live_node: MakeLiveNode, tmp_path: Path) -> None:
    r545 = json.loads(live_node(bundle_at(tmp_path, "a100-mig", R545)).python(CI_PROFILE))
    r535 = json.loads(live_node(bundle_at(tmp_path, "a100-mig", "535.161.08")).python(CI_PROFILE))
    assert r545["code"] == 0 and r545["v3"] == [*r545["v2"], 0]  # capabilities written (none)
    assert r535 == {**r545, "code": 2, "v3": None}


@pytest.mark.parametrize("name", ["dgx-h100", "a100-mig", "l40s-4x"])
def test_backend_and_status_on_r545_agree_with_the_bundle(name: str, live_node: MakeLiveNode,
                                                          tmp_path: Path) -> None:
    bundle = bundle_at(tmp_path, name, R545)
    node = live_node(bundle)
    done = run_as_bundle_host(node, tmp_path / "host", code=NODE_DUMP)
    assert done.returncode == 0, done.stderr
    live, ref = json.loads(done.stdout), node_to_dict(read_bundle(bundle))
    assert live["driver_version"] == R545
    assert (live["gpus"], live["links"]) == (ref["gpus"], ref["links"])
    done = run_as_bundle_host(node, tmp_path / "host2", "status", "--json")
    assert done.returncode == 0, done.stderr
    replayed = json.loads(node.run("status", "--json", "--from", str(bundle)).stdout)
    assert json.loads(done.stdout)["gpus"] == replayed["gpus"]
