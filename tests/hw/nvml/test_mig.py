"""MIG through the real pynvml: GPU/compute-instance objects and NVIDIA's own profile names.

NVIDIA names MIG profiles after nominal memory (an A100-80GB's 3g.40gb has 40192 MiB), so the
backend reads the name from NVML's GPU-instance profile table: by the instance's profile id as
root, by slice count and memory otherwise.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from tests.helpers.nvml_replay import NODE_DUMP, REAL_BUNDLES, MakeLiveNode

from gpuslurm.hw.replay.bundle import read_bundle

A100 = Path(__file__).parents[3] / "src" / "gpuslurm" / "hw" / "builtin" / "a100-mig"
MIG_BUNDLES = [pytest.param(A100, id="a100-mig")] + [
    pytest.param(p, id=f"real-{p.name}") for p in REAL_BUNDLES if "mig" in p.name]

INSTANCES = """
import json, pynvml as n
n.nvmlInit()
gpu = n.nvmlDeviceGetHandleByIndex(0)
out = []
for slot in range(n.nvmlDeviceGetMaxMigDeviceCount(gpu)):
    try:
        mig = n.nvmlDeviceGetMigDeviceHandleByIndex(gpu, slot)
    except n.NVMLError_NotFound:
        continue
    gi_id, ci_id = n.nvmlDeviceGetGpuInstanceId(mig), n.nvmlDeviceGetComputeInstanceId(mig)
    try:
        gi = n.nvmlDeviceGetGpuInstanceById(gpu, gi_id)
    except n.NVMLError as e:
        out.append(["refused", e.value]); continue
    info = n.nvmlGpuInstanceGetInfo(gi)
    names = {}
    for index in range(n.NVML_GPU_INSTANCE_PROFILE_COUNT):
        try:
            p = n.nvmlDeviceGetGpuInstanceProfileInfo(gpu, index)
        except n.NVMLError:
            continue
        names[p.id] = p.name if isinstance(p.name, str) else p.name.decode()
    ci = n.nvmlGpuInstanceGetComputeInstanceById(gi, ci_id)
    ci_info = n.nvmlComputeInstanceGetInfo(ci)
    ci_name = n.nvmlGpuInstanceGetComputeInstanceProfileInfo(gi, ci_info.profileId, 0).name
    out.append([info.id, names[info.profileId], ci_info.id,
                ci_name if isinstance(ci_name, str) else ci_name.decode(),
                n.nvmlDeviceGetUUID(n.nvmlDeviceGetDeviceHandleFromMigDeviceHandle(mig)) ==
                n.nvmlDeviceGetUUID(gpu)])
print(json.dumps(out))
"""


def _profiles(node_json: str) -> list[list[str]]:
    return [[m["profile"] for m in g["mig_devices"]] for g in json.loads(node_json)["gpus"]]


def _bundle_profiles(bundle: Path) -> list[list[str]]:
    return [[m.profile for m in g.mig_devices] for g in read_bundle(bundle).gpus]


@pytest.mark.parametrize("privileged", [True, False], ids=["root", "user"])
@pytest.mark.parametrize("bundle", MIG_BUNDLES)
def test_profile_names_are_nvidias(bundle: Path, privileged: bool, live_node: MakeLiveNode) -> None:
    node = live_node(bundle, privileged=privileged)
    assert _profiles(node.python(NODE_DUMP)) == _bundle_profiles(bundle)


def test_instances_name_their_profiles(live_node: MakeLiveNode) -> None:
    node = live_node(A100)
    got = json.loads(node.python(INSTANCES))
    want = [[m.gi_id, f"MIG {m.profile}", m.ci_id, f"MIG {m.profile}", True]
            for m in read_bundle(A100).gpus[0].mig_devices]
    assert got == want


def test_a_user_is_refused_the_instances(live_node: MakeLiveNode) -> None:
    node = live_node(A100, privileged=False)
    assert json.loads(node.python(INSTANCES)) == [["refused", 4]] * 4  # NVML_ERROR_NO_PERMISSION


def _with_media_profile(tmp_path: Path) -> Path:
    """a100-mig with one of its two 1g.10gb devices a 1g.10gb+me (same slices, same memory)."""
    bundle = tmp_path / "a100-me"
    shutil.copytree(A100, bundle)
    listing = bundle / "nvidia-smi-L.txt"
    lines = listing.read_text().splitlines(keepends=True)
    lines[4] = lines[4].replace("MIG 1g.10gb    ", "MIG 1g.10gb+me ")
    listing.write_text("".join(lines))
    assert [m.profile for m in read_bundle(bundle).gpus[0].mig_devices][-1] == "1g.10gb+me"
    return bundle


def test_root_tells_profiles_of_equal_size_apart(live_node: MakeLiveNode, tmp_path: Path) -> None:
    bundle = _with_media_profile(tmp_path)
    node = live_node(bundle)
    assert _profiles(node.python(NODE_DUMP)) == _bundle_profiles(bundle)


def test_a_user_gets_the_plain_name_when_two_profiles_fit(live_node: MakeLiveNode, tmp_path: Path) -> None:
    """Without the instance's profile id, 1g.10gb and 1g.10gb+me look alike: the name is built."""
    bundle = _with_media_profile(tmp_path)
    node = live_node(bundle, privileged=False)
    assert _profiles(node.python(NODE_DUMP))[0][2:] == ["1g.10gb", "1g.10gb"]


CC = """
import json
from gpuslurm.hw.live.nvml import compute_capabilities
print(json.dumps(compute_capabilities()))
"""


def test_compute_capabilities_through_nvml(live_node: MakeLiveNode) -> None:
    """nvml.json's compute capabilities, served by nvmlDeviceGetCudaComputeCapability; a GPU
    without one answers NOT_SUPPORTED and is left out (pick falls back to its model table)."""
    node = live_node(A100)
    doc = json.loads(node.nvml_json.read_text())
    doc["gpus"][1]["compute_capability"] = "8.0"
    node.nvml_json.write_text(json.dumps(doc))
    assert json.loads(node.python(CC)) == {doc["gpus"][1]["uuid"]: [8, 0]}
