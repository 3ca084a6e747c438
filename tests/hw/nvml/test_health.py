"""Health facts and memory through the real pynvml: the library serves a bundle's ``health.json``.

Live (NVML through the replay library) and ``--from`` (the bundle's health.json) must give the
health gate the same facts, and ``status --json`` the same faults.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from tests.helpers.nvml_replay import MakeLiveNode

from gpuslurm.hw.replay.bundle import read_bundle, read_captured_state
from gpuslurm.hw.replay.health import read_scenario

BUILTIN = Path(__file__).parents[3] / "src" / "gpuslurm" / "hw" / "builtin"
FACTS: list[dict[str, Any]] = [
    {"temperature_c": 95, "ecc_uncorrectable": 3, "remap_pending": True, "remap_failed": False,
     "memory_used_mib": 2048},
    {"temperature_c": 40, "ecc_uncorrectable": 0, "retired_pages_pending": True,
     "clock_events": ["gpu_idle", "hw_thermal"]},
    {"remap_pending": False, "remap_failed": True, "ecc_uncorrectable": 0},
    {"lost": True},
]
READ = """
import json, sys
from gpuslurm.hw.replay.bundle import read_bundle
from gpuslurm.hw.live.nvml_health import NvmlHealthReader
from pathlib import Path
h = NvmlHealthReader().read(read_bundle(Path(sys.argv[1])).gpus)
print(json.dumps({u: g._asdict() for u, g in h.items()}))
"""


def _bundle(tmp_path: Path, name: str, facts: list[dict[str, Any]]) -> Path:
    bundle = tmp_path / name
    shutil.copytree(BUILTIN / name, bundle)
    gpus = read_bundle(bundle).gpus
    (bundle / "health.json").write_text(json.dumps({g.uuid: f for g, f in zip(gpus, facts, strict=False)}))
    return bundle


def _live_health(node: Any) -> dict[str, dict[str, Any]]:
    done = node.python(READ.replace("sys.argv[1]", repr(str(node.bundle))))
    return {u: dict(h) for u, h in json.loads(done).items()}


@pytest.mark.parametrize("name", ["dgx-h100", "l40s-4x"])
def test_health_reader_sees_the_bundles_facts(name: str, live_node: MakeLiveNode, tmp_path: Path) -> None:
    bundle = _bundle(tmp_path, name, FACTS)
    live = _live_health(live_node(bundle))
    gpus = read_bundle(bundle).gpus
    replayed = read_scenario(bundle / "health.json", [g.uuid for g in gpus])
    for gpu, facts in zip(gpus, FACTS, strict=False):
        want = json.loads(json.dumps(replayed[gpu.uuid]._asdict()))  # tuples as JSON lists
        assert {k: live[gpu.uuid][k] for k in facts} == {k: want[k] for k in facts}, gpu.index
    assert live[gpus[3].uuid]["lost"] is True
    # a GPU without facts: nothing unsupported is made up; its temperature is the capture's
    bare = live[gpus[4].uuid] if len(gpus) > 4 else None
    if bare is not None:
        state = read_captured_state(bundle, read_bundle(bundle))
        assert state is not None
        captured = next(d.temp_c for d in state.devices if d.gpu_uuid == gpus[4].uuid)
        assert (bare["temperature_c"], bare["ecc_uncorrectable"], bare["remap_pending"]) == \
            (captured, None, None)


def _faults(status: dict[str, Any]) -> dict[str, tuple[str, list[str]]]:
    return {g["uuid"]: (g["health"], g["faults"]) for g in status["gpus"]}


def test_status_shows_the_same_faults(live_node: MakeLiveNode, tmp_path: Path) -> None:
    bundle = _bundle(tmp_path, "dgx-h100", FACTS[:3])  # a lost GPU is left out of a live model
    node = live_node(bundle)
    live = json.loads(node.run("status", "--json").stdout)
    replayed = json.loads(node.run("status", "--json", "--from", str(bundle)).stdout)
    assert _faults(live) == _faults(replayed)
    gpus = read_bundle(bundle).gpus
    found = _faults(live)[gpus[0].uuid][1]
    assert any("ECC" in f for f in found) and any("remap" in f for f in found), found
    assert _faults(live)[gpus[1].uuid][1][-1] == "clocks slowed: hw_thermal"


MEMORY = """
import json, pynvml as n
from gpuslurm.hw.live.nvml_sampler import NvmlSampler
n.nvmlInit()
h = n.nvmlDeviceGetHandleByIndex(0)
v1 = n.nvmlDeviceGetMemoryInfo(h)
try:
    v2 = n.nvmlDeviceGetMemoryInfo(h, n.nvmlMemory_v2)
    v2 = [v2.used >> 20, v2.reserved >> 20]
except n.NVMLError_FunctionNotFound:
    v2 = None
s = NvmlSampler().read().devices[0]
print(json.dumps({"v1": v1.used >> 20, "v2": v2, "gpuslurm": s.mem_used_mib}))
"""


def test_memory_v1_counts_the_reserved_memory_v2_does_not(live_node: MakeLiveNode) -> None:
    node = live_node(BUILTIN / "l40s-4x", processes={0: [(4242, 1000)]}, reserved_mib={0: 512})
    assert json.loads(node.python(MEMORY)) == {"v1": 1512, "v2": [1000, 512], "gpuslurm": 1000.0}


def test_memory_before_r510_is_v1(live_node: MakeLiveNode) -> None:
    node = live_node(BUILTIN / "l40s-4x", driver_version="470.82.01", processes={0: [(4242, 1000)]},
                     reserved_mib={0: 512})
    assert json.loads(node.python(MEMORY)) == {"v1": 1512, "v2": None, "gpuslurm": 1512.0}


LOST_READ = """
import json
from gpuslurm.hw.live.nvml import NvmlBackend
from gpuslurm.hw.live.nvml_sampler import NvmlSampler
node = NvmlBackend().read_node("n")
r = NvmlSampler().read()
print(json.dumps({"gpus": [g.index for g in node.gpus], "warnings": list(node.warnings),
                  "sampled": [d.gpu_uuid for d in r.devices], "problems": [p[:2] for p in r.problems]}))
"""


def test_a_lost_gpu_is_left_out_and_the_others_are_read(live_node: MakeLiveNode, tmp_path: Path) -> None:
    bundle = _bundle(tmp_path, "dgx-h100", [{}, {}, {"lost": True}])
    gpus = read_bundle(bundle).gpus
    got = json.loads(live_node(bundle).python(LOST_READ))
    assert got["gpus"] == [0, 1, 3, 4, 5, 6, 7]
    lost = [w for w in got["warnings"] if "affinity" not in w]  # affinity: this machine's CPUs
    assert len(lost) == 1 and "GPU 2" in lost[0] and "lost" in lost[0]
    assert got["sampled"] == [g.uuid for g in gpus if g.index != 2]
    assert got["problems"] == [["gpu-lost", "index 2"]]
