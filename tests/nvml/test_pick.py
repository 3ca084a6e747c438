"""``gpuslurm pick`` on a live node (the replay library serving a busy scenario) chooses what it
chooses ``--from`` the same bundle. CPUs and NUMA come from this machine live, so only the chosen
devices, their links and profiles are compared."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from tests.nvml.conftest import MakeLiveNode, scenario_bundle

BUILTIN = Path(__file__).parents[2] / "src" / "gpuslurm" / "hw" / "builtin"


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
