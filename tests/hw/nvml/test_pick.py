"""``gpuslurm pick`` on a live node (the replay library serving a busy scenario) chooses what it
chooses ``--from`` the same bundle. CPUs and NUMA come from this machine live, so only the chosen
devices, their links and profiles are compared."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from tests.helpers.nvml_replay import MakeLiveNode, scenario_bundle

BUILTIN = Path(__file__).parents[3] / "src" / "gpuslurm" / "hw" / "builtin"


def _chosen(text: str) -> dict[str, Any]:
    out = json.loads(text)
    keys = ("uuid", "index", "name", "gpu_uuid", "profile")
    return {"gpus": [{k: g.get(k) for k in keys} for g in out["gpus"]], "weakest_link": out["weakest_link"]}


@pytest.mark.parametrize(("name", "args"), [
    ("dgx-h100", ["2"]),
    ("dgx-h100", ["3", "--max-util", "50", "--exclusive"]),
    ("l40s-4x", ["2", "--mem", "40GiB"]),
    ("a100-mig", ["2", "--mig", "1g.10gb"]),
    ("a100-mig", ["1", "--mig", "3g.40gb"]),
])
def test_pick_live_chooses_as_replayed(name: str, args: list[str], live_node: MakeLiveNode,
                                       tmp_path: Path) -> None:
    bundle = scenario_bundle(tmp_path, BUILTIN / name)
    node = live_node(bundle)
    live = node.run("pick", *args, "--format", "json")
    replayed = node.run("pick", *args, "--format", "json", "--from", str(bundle))
    assert _chosen(live.stdout) == _chosen(replayed.stdout)


CAPABILITIES = """
import json
from gpuslurm.hw.live.nvml import compute_capabilities
print(json.dumps(compute_capabilities()))
"""


def test_compute_capabilities_through_nvml(live_node: MakeLiveNode) -> None:
    """NVML's compute capability per GPU; a GPU whose driver does not say is left out."""
    node = live_node(BUILTIN / "dgx-h100")
    doc = json.loads(node.nvml_json.read_text())
    for i, gpu in enumerate(doc["gpus"]):
        if i != 1:  # GPU 1: NOT_SUPPORTED
            gpu["compute_capability"] = "9.0"
    node.nvml_json.write_text(json.dumps(doc))
    found = json.loads(node.python(CAPABILITIES))
    assert len(found) == 7 and doc["gpus"][1]["uuid"] not in found
    assert set(map(tuple, found.values())) == {(9, 0)}


def test_exclusive_pick_skips_a_gpu_with_a_process_of_others(live_node: MakeLiveNode) -> None:
    node = live_node(BUILTIN / "dgx-h100", processes={0: [(999999, 70000)]})
    out = node.run("pick", "2", "--exclusive", "--format", "explain").stdout
    assert "excluded GPU 0" in out and "--exclusive: 1 process of others" in out
    assert out.startswith("picked {GPU 1, GPU 2}: weakest link NV18")  # GPU 0 busy; NVSwitch
