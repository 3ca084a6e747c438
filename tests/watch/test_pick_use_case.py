"""watch/pick: pick's use case called directly, as ``gpuslurm pick`` calls it: the job's GPUs from
the adapter it is handed, the load of a replayed scenario, the wait's progress and its giving up."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

import pytest

from gpuslurm.errors import InputError
from gpuslurm.hw.model.node import Node
from gpuslurm.hw.source import hardware_source, load_node
from gpuslurm.place.request import Request
from gpuslurm.watch.pick import Wait, pick_for_job

L40S = hardware_source("l40s-4x")

U = [g.uuid for g in load_node("l40s-4x").gpus]


def outside_any_job(environ: Mapping[str, str], node: Node) -> tuple[str, ...] | None:
    return None


def env(tmp_path: Path, scenario: dict[str, object] | None = None) -> dict[str, str]:
    environ = {"HOME": str(tmp_path), "GPUSLURM_CONFIG": str(tmp_path / "none.toml")}
    if scenario is not None:
        (tmp_path / "scenario.json").write_text(json.dumps(scenario))
        environ["GPUSLURM_SCENARIO"] = str(tmp_path / "scenario.json")
    return environ


def test_only_the_gpus_the_adapter_names_are_candidates(tmp_path: Path) -> None:
    asked: list[Mapping[str, str]] = []

    def job_gpus(environ: Mapping[str, str], node: Node) -> tuple[str, ...]:
        asked.append(environ)
        return (U[3],)

    picked = pick_for_job(Request(1), L40S, env(tmp_path), job_gpus)
    assert picked.placement.chosen is not None
    assert [d.uuid for d in picked.placement.chosen.devices] == [U[3]] and len(asked) == 1
    with pytest.raises(InputError, match="2 GPUs wanted but the job holds 1"):
        pick_for_job(Request(2), L40S, env(tmp_path), job_gpus)


def test_another_users_process_makes_a_gpu_taken_for_an_exclusive_pick(tmp_path: Path) -> None:
    busy = {"procs": [{"pid": 999999, "gpu": u} for u in U[:3]]}  # not a pid of ours
    picked = pick_for_job(Request(1, exclusive=True), L40S, env(tmp_path, busy), outside_any_job)
    assert picked.placement.chosen is not None
    assert [d.uuid for d in picked.placement.chosen.devices] == [U[3]]


def test_a_wait_that_gives_up_says_its_progress_and_chooses_nothing(tmp_path: Path) -> None:
    progress: list[str] = []
    busy = {"gpus": {u: {"util": 90} for u in U}}
    picked = pick_for_job(Request(1, exclusive=True, max_util=10.0), L40S, env(tmp_path, busy),
                          outside_any_job, Wait(0.05, 0.1), progress=progress.append)
    assert picked.placement.chosen is None
    assert progress and all(line.startswith("waiting ") for line in progress)
