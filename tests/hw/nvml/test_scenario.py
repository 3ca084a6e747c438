"""A scenario played over time through the replay library: utilisation, memory and processes change.

The library picks the step in force by its clock shifted by ``GPUSLURM_NVML_REPLAY_CLOCK``
seconds, so two ``monitor --once`` runs of one node see different cycles, and at the same moment
the live node and ``--from`` the bundle agree (``status --json``).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from tests.helpers.nvml_replay import LATER, LiveNode, MakeLiveNode, scenario_bundle

from gpuslurm.hw.replay.bundle import read_bundle

L40S = Path(__file__).parents[3] / "src" / "gpuslurm" / "hw" / "builtin" / "l40s-4x"
A100 = L40S.parent / "a100-mig"


def _cycle(node: LiveNode, tmp_path: Path, shift: float, name: str) -> dict[str, Any]:
    env = {"GPUSLURM_NVML_REPLAY_CLOCK": str(shift)}
    done = node.run("monitor", "--once", "--json", "--db", str(tmp_path / f"{name}.db"), extra_env=env)
    cycle: dict[str, Any] = json.loads(done.stdout.splitlines()[0])
    return cycle


def _devices(cycle: dict[str, Any]) -> list[tuple[Any, ...]]:
    return sorted(((g["gpu_uuid"], g["mig_uuid"] or "", g["util_pct"], g["mem_used_mib"], g["power_w"],
                    g["temp_c"]) for g in cycle["gpus"]), key=repr)


def _procs(cycle: dict[str, Any]) -> list[tuple[Any, ...]]:
    return sorted(((p["pid"], p["gpu_uuid"], p["mig_uuid"], p["mem_mib"], p["sm_util_pct"])
                   for p in cycle["procs"]), key=repr)


def test_two_cycles_see_two_steps(live_node: MakeLiveNode, tmp_path: Path) -> None:
    bundle = scenario_bundle(tmp_path, L40S)
    node = live_node(bundle)
    now = _cycle(node, tmp_path, 0, "now")
    later = _cycle(node, tmp_path, LATER, "later")
    gpus = read_bundle(bundle).gpus
    assert (gpus[0].uuid, "", 90.0, 30000.0, 300.0, 61.0) in _devices(now)
    assert (gpus[1].uuid, "", 50.0, 2500.0, None, 45.0) in _devices(later)
    assert {p[0] for p in _procs(now)} == {1, os.getpid()}
    assert _procs(later) == [(1, gpus[1].uuid, None, 2500.0, 55.0)]
    assert [p["kind"] for p in later["problems"]] == ["gpu-lost"] and not now["problems"]
    assert gpus[2].uuid not in {g["gpu_uuid"] for g in later["gpus"]}


def test_live_and_replayed_cycles_agree(live_node: MakeLiveNode, tmp_path: Path) -> None:
    for source in (L40S, A100):
        bundle = scenario_bundle(tmp_path, source)
        node = live_node(bundle)
        live = _cycle(node, tmp_path, 0, f"live-{source.name}")
        done = node.run("monitor", "--once", "--json", "--db", str(tmp_path / f"ref-{source.name}.db"),
                        "--from", str(bundle))
        replayed = json.loads(done.stdout.splitlines()[0])
        assert _devices(live) == _devices(replayed), source.name
        assert _procs(live) == _procs(replayed), source.name
    # in MIG mode NVML has no utilisation, whole or per process: unknown, not 0 %
    mig_gpu = next(g.uuid for g in read_bundle(A100).gpus if g.mig_mode)
    assert [d[2] for d in _devices(live) if d[0] == mig_gpu] == [None] * 5
    assert [p[4] for p in _procs(live) if p[1] == mig_gpu] == [None]


def test_status_live_and_replayed_agree(live_node: MakeLiveNode, tmp_path: Path) -> None:
    bundle = scenario_bundle(tmp_path, L40S)
    node = live_node(bundle)
    keys = ("uuid", "util_pct", "mem_used_mib", "mem_total_mib", "temp_c", "power_w")
    live = json.loads(node.run("status", "--json").stdout)
    replayed = json.loads(node.run("status", "--json", "--from", str(bundle)).stdout)
    assert [[g[k] for k in keys] for g in live["gpus"]] == [[g[k] for k in keys] for g in replayed["gpus"]]
    procs = [sorted((p["pid"], p["gpu"], p["mem_mib"], p["sm_util_pct"]) for p in s["processes"])
             for s in (live, replayed)]
    assert procs[0] == procs[1] and len(procs[0]) == 2
