"""The replay scenario: parsing, time steps, lost GPUs, MIG devices, rewrites, unknown GPUs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gpuslurm.errors import CaptureError
from gpuslurm.hw.formats.scenario import parse_scenario
from gpuslurm.hw.replay.scenario import ScenarioSampler, scenario_path
from gpuslurm.hw.source import load_node

NODE = load_node("dgx-h100")
U = [g.uuid for g in NODE.gpus]
MIG_NODE = load_node("a100-mig")


def _write(path: Path, doc: object) -> Path:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(doc))
    tmp.replace(path)  # atomically, as the docs ask of tests rewriting a scenario
    return path


def test_no_scenario_means_idle_gpus_and_no_process() -> None:
    r = ScenarioSampler(NODE, None).read(0.0)
    assert len(r.devices) == 8 and r.processes == () and r.problems == ()
    assert {(d.util_pct, d.mem_used_mib) for d in r.devices} == {(0.0, 0.0)}
    assert r.devices[0].mem_total_mib == NODE.gpus[0].memory_mib


def test_steps_follow_time_and_memory_defaults_to_the_processes(tmp_path: Path) -> None:
    path = _write(tmp_path / "scenario.json", {"start": 1000, "steps": [
        {"at": 0, "gpus": {U[0]: {"util": 90, "power_w": 300, "temp_c": 61}},
         "procs": [{"pid": 11, "gpu": U[0], "mem_mib": 5000, "sm": 80},
                   {"pid": 12, "gpu": U[0].lower(), "mem_mib": 1000}]},
        {"at": 60, "gpus": {U[1]: {"lost": True}}}]})
    s = ScenarioSampler(NODE, path)
    before = s.read(999.0)
    assert before.processes == () and len(before.devices) == 8
    r = s.read(1030.0)
    d0 = r.devices[0]
    assert (d0.util_pct, d0.mem_used_mib, d0.power_w, d0.temp_c) == (90.0, 6000.0, 300.0, 61.0)
    assert [(p.pid, p.gpu_uuid, p.mem_mib, p.sm_util_pct) for p in r.processes] == \
        [(11, U[0], 5000.0, 80.0), (12, U[0], 1000.0, None)]
    later = s.read(1060.0)
    assert [d.gpu_uuid for d in later.devices] == [u for u in U if u != U[1]]
    assert later.problems == (("gpu-lost", U[1], "the scenario says the GPU fell off the bus"),)
    assert later.processes == () and later.devices[0].util_pct == 0.0  # each step is the whole node


def test_a_mig_device_can_carry_a_process() -> None:
    gpu = next(g for g in MIG_NODE.gpus if g.mig_mode and g.mig_devices)
    mig = gpu.mig_devices[0].uuid
    assert mig is not None
    sc = parse_scenario(json.dumps({"procs": [{"pid": 5, "gpu": mig, "mem_mib": 700}]}), "s.json", MIG_NODE)
    from gpuslurm.hw.replay.scenario import readings

    r = readings(MIG_NODE, sc.steps[0])
    assert [(p.gpu_uuid, p.mig_uuid) for p in r.processes] == [(gpu.uuid, mig)]
    mig_dev = next(d for d in r.devices if d.mig_uuid == mig)
    assert (mig_dev.gpu_uuid, mig_dev.mem_used_mib, mig_dev.util_pct) == (gpu.uuid, 700.0, None)
    assert next(d for d in r.devices if d.gpu_uuid == gpu.uuid and d.mig_uuid is None).mem_used_mib == 700.0


@pytest.mark.parametrize(("doc", "message"), [
    ({"procs": [{"pid": 5, "gpu": "GPU-nope"}]}, "procs[0]: unknown GPU 'GPU-nope'"),
    ({"steps": [{"at": 0}, {"at": 5, "gpus": {"GPU-x": {"util": 1}}}]}, "steps[1].gpus: unknown GPU 'GPU-x'"),
    ({"gpus": {U[0]: {"util": 120}}}, "util must be a percentage"),
    ({"gpus": {U[0]: {"utilisation": 1}}}, "unknown key 'utilisation'"),
    ({"procs": [{"pid": -1, "gpu": U[0]}]}, "'pid' must be a process id"),
    ({"procs": [{"pid": 1, "gpu": U[0], "user": "x"}]}, "unknown key 'user'"),
    ({"steps": []}, "'steps' must be a non-empty list"),
    ({"start": "now", "steps": [{}]}, "'start' must be Unix seconds"),
    ([], "must be a JSON object"),
])
def test_bad_scenarios_name_the_entry(doc: object, message: str) -> None:
    with pytest.raises(CaptureError) as err:
        parse_scenario(json.dumps(doc), "/x/scenario.json", NODE)
    assert message in str(err.value) and str(err.value).startswith("/x/scenario.json")


def test_a_broken_rewrite_keeps_the_previous_scenario(tmp_path: Path) -> None:
    path = _write(tmp_path / "scenario.json", {"gpus": {U[2]: {"util": 50}}})
    s = ScenarioSampler(NODE, path)
    assert s.read(1e12).devices[2].util_pct == 50.0
    path.write_text("{ half a file")
    r = s.read(1e12)
    assert r.devices[2].util_pct == 50.0 and r.problems[0][0] == "scenario-error"
    assert s.read(1e12).problems == ()  # reported once
    _write(path, {"gpus": {U[2]: {"util": 70}}})
    assert s.read(1e12).devices[2].util_pct == 70.0


def test_where_the_scenario_comes_from(tmp_path: Path) -> None:
    assert scenario_path(tmp_path, {}) is None
    _write(tmp_path / "scenario.json", {})
    assert scenario_path(tmp_path, {}) == tmp_path / "scenario.json"
    other = tmp_path / "d"
    other.mkdir()
    _write(other / "scenario.json", {})
    assert scenario_path(tmp_path, {"GPUSLURM_SCENARIO": str(other)}) == other / "scenario.json"
    with pytest.raises(CaptureError, match="GPUSLURM_SCENARIO"):
        scenario_path(tmp_path, {"GPUSLURM_SCENARIO": str(tmp_path / "missing.json")})


def test_cli_rejects_an_unknown_gpu_with_exit_2_and_one_line(tmp_path: Path) -> None:
    bad = _write(tmp_path / "bad.json", {"procs": [{"pid": 1, "gpu": "GPU-0000"}]})
    env = {**os.environ, "GPUSLURM_SCENARIO": str(bad), "GPUSLURM_CONFIG": str(tmp_path / "c.toml")}
    (tmp_path / "c.toml").write_text("")
    out = subprocess.run([sys.executable, "-m", "gpuslurm", "monitor", "--once", "--from", "dgx-h100",
                          "--db", str(tmp_path / "m.db")], env=env, capture_output=True, text=True)
    assert out.returncode == 2
    assert out.stderr.strip().splitlines() == [
        f"gpuslurm: {bad}: procs[0]: unknown GPU 'GPU-0000': not a GPU or MIG device of dgx-h100-01"]
    assert not (tmp_path / "m.db").exists()  # nothing started
