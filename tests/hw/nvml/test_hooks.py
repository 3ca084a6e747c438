"""The hooks on a "live" node: prolog and epilog through the real pynvml and the replay library
give the same answers (exit code, job map, scontrol calls) as replaying the bundle
(``GPUSLURM_CAPTURE``). slurmd would not pass ``LD_LIBRARY_PATH``, so the hooks are run directly
(``python -m gpuslurm.slurm``) with the library's environment.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from tests.helpers.hook_helpers import HookSite, make_site
from tests.helpers.nvml_replay import MakeLiveNode


class Node:
    """One hook site run either replayed (the bundle) or live (``make`` serving it)."""

    def __init__(self, site: HookSite, make: MakeLiveNode | None) -> None:
        self.site = site
        self.make = make
        self.stderr = ""

    def set_health(self, facts: dict[int, dict[str, Any]]) -> None:
        self.site.set_health({self.site.uuids[i]: f for i, f in facts.items()})

    def hook(self, name: str, job: str, gpus: str) -> int:
        env = self.site.environ(job, gpus=gpus)
        if self.make is not None:  # serve the bundle as it is now
            node = self.make(self.site.bundle)
            del env["GPUSLURM_CAPTURE"]
            env = {**node.lib.env(node.nvml_json, node.log), **env}
        done = subprocess.run([sys.executable, "-m", "gpuslurm.slurm", name], env=env, capture_output=True,
                              text=True, timeout=120, check=False, cwd="/")
        self.stderr = done.stderr
        return done.returncode

    def job_map(self, job: str) -> Any:
        path = self.site.jobs_dir / f"{job}.json"
        return [g["uuid"] for g in json.loads(path.read_text())["gpus"]] if path.exists() else None


@pytest.fixture
def sleeper() -> Iterator[subprocess.Popen[bytes]]:
    p = subprocess.Popen(["/bin/sleep", "300"])
    yield p
    p.kill()
    p.wait()


def _pair(tmp_path: Path, live_node: MakeLiveNode, health: dict[int, dict[str, Any]],
          config: str = "") -> tuple[Node, Node]:
    nodes = []
    for mode in ("replayed", "live"):
        site = make_site(tmp_path / mode)
        site.write_config(config)
        node = Node(site, live_node if mode == "live" else None)
        node.set_health(health)
        nodes.append(node)
    return nodes[0], nodes[1]


def test_prolog_healthy(live_node: MakeLiveNode, tmp_path: Path) -> None:
    replayed, live = _pair(tmp_path, live_node, {})
    assert [n.hook("prolog", "77", "1,3,4") for n in (replayed, live)] == [0, 0]
    assert live.job_map("77") == replayed.job_map("77") == [replayed.site.uuids[i] for i in (1, 3, 4)]
    assert live.site.scontrol_calls() == replayed.site.scontrol_calls() == []


def test_prolog_drains_for_the_same_faults(live_node: MakeLiveNode, tmp_path: Path) -> None:
    health: dict[int, dict[str, Any]] = {
        1: {"temperature_c": 95}, 2: {"ecc_uncorrectable": 5, "remap_pending": True, "remap_failed": False}}
    replayed, live = _pair(tmp_path, live_node, health)
    assert [n.hook("prolog", "78", "0-3") for n in (replayed, live)] == [1, 1]
    calls = replayed.site.scontrol_calls()
    assert calls and live.site.scontrol_calls() == calls
    assert live.job_map("78") is None


def test_epilog_reports_the_same_leftover(live_node: MakeLiveNode, tmp_path: Path,
                                          sleeper: subprocess.Popen[bytes]) -> None:
    replayed, live = _pair(tmp_path, live_node, {}, "[epilog]\nkill_leftover = false\n")
    for n in (replayed, live):
        assert n.hook("prolog", "79", "0,1") == 0, n.stderr
        n.set_health({1: {"processes": [{"pid": sleeper.pid, "user": "root", "used_mib": 900}]}})
    assert [n.hook("epilog", "79", "0,1") for n in (replayed, live)] == [0, 0]
    calls = replayed.site.scontrol_calls()
    assert calls and f"pid {sleeper.pid} (root)" in calls[0][3]
    assert live.site.scontrol_calls() == calls
    assert sleeper.poll() is None  # reported, not killed
