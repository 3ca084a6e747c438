"""What a real ``nvidia-smi -q -x`` capture recorded the GPUs doing, and how replay serves it.

dual_a5000 (22437 MiB used, 13 C, 6.41 W, a llama-server on each GPU, placeholder UUIDs) and
tesla-t4 (1032 MiB, 40 C, 26.78 W, Xorg and python) were replayed as idle GPUs with no process:
the capture's state was lost between the XML and the sampler.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpuslurm.errors import CaptureError
from gpuslurm.hw.formats.scenario import parse_scenario
from gpuslurm.hw.formats.smi_state import parse_smi_state
from gpuslurm.hw.replay.bundle import read_bundle, read_captured_state
from gpuslurm.hw.replay.nvml_replay import replay_dict
from gpuslurm.hw.replay.scenario import ScenarioSampler
from gpuslurm.watch.attribute import Attributor

XML = "nvidia-smi-q-x"


def bundle_of(tmp_path: Path, real: Path, name: str) -> Path:
    bundle = tmp_path / name.removesuffix(".xml")
    bundle.mkdir()
    shutil.copy(real / XML / name, bundle / "nvidia-smi-q.xml")
    return bundle


def test_dual_a5000_state_is_read_per_gpu_by_bus_id(tmp_path: Path, real_fixtures: Path) -> None:
    bundle = bundle_of(tmp_path, real_fixtures, "dual_a5000-v13.xml")
    node = read_bundle(bundle)
    state = read_captured_state(bundle, node)
    assert state is not None
    by_gpu = {node.gpu(d.gpu_uuid).bus_id: d for d in state.devices}
    first, second = by_gpu["00000000:81:00.0"], by_gpu["00000000:C1:00.0"]
    assert (first.util_pct, first.mem_used_mib, first.temp_c, first.power_w) == (0.0, 22437.0, 13.0, 6.41)
    assert (second.mem_used_mib, second.temp_c, second.power_w) == (17253.0, 15.0, 13.60)
    procs = {(node.gpu(p.gpu_uuid).bus_id, p.pid, p.name, p.mem_mib) for p in state.processes}
    assert procs == {("00000000:81:00.0", 100477, "llama-server", 22430.0),
                     ("00000000:C1:00.0", 100477, "llama-server", 17246.0)}


def test_tesla_t4_old_dtd_power_and_both_processes(tmp_path: Path, real_fixtures: Path) -> None:
    bundle = bundle_of(tmp_path, real_fixtures, "tesla-t4.xml")
    node = read_bundle(bundle)
    state = read_captured_state(bundle, node)
    assert state is not None
    (gpu,) = state.devices
    assert (gpu.mem_used_mib, gpu.temp_c, gpu.power_w) == (1032.0, 40.0, 26.78)
    assert sorted((p.pid, p.name, p.mem_mib) for p in state.processes) == [(675, "Xorg", 22.0),
                                                                           (5762, "python", 1005.0)]


@pytest.mark.parametrize("name", ["a100-sxm4-mig-v12.xml", "a10g.xml", "dual_2080-v13.xml",
                                  "dual_a5000-v13.xml", "pro-6000-maxq-blackwell-v13.xml", "tesla-t4.xml"])
def test_every_real_capture_gives_every_gpu_a_state(tmp_path: Path, real_fixtures: Path, name: str) -> None:
    bundle = bundle_of(tmp_path, real_fixtures, name)
    node = read_bundle(bundle)
    state = read_captured_state(bundle, node)
    assert state is not None
    # dual_2080 repeats one UUID: its second GPU (a synthetic UUID) still gets its own state
    assert {d.gpu_uuid for d in state.devices if d.mig_uuid is None} == {g.uuid for g in node.gpus}
    assert all(d.mem_used_mib is not None for d in state.devices if d.mig_uuid is None)


def test_the_replay_sampler_serves_the_capture_and_a_scenario_moves_it_on(tmp_path: Path,
                                                                         real_fixtures: Path) -> None:
    bundle = bundle_of(tmp_path, real_fixtures, "dual_a5000-v13.xml")
    node = read_bundle(bundle)
    captured = read_captured_state(bundle, node)
    first, second = sorted(node.gpus, key=lambda g: g.index)
    now = ScenarioSampler(node, None, captured).read(1000.0)
    assert {d.gpu_uuid: (d.mem_used_mib, d.temp_c, d.power_w) for d in now.devices} == \
        {first.uuid: (22437.0, 13.0, 6.41), second.uuid: (17253.0, 15.0, 13.60)}
    assert sorted(p.gpu_uuid for p in now.processes) == sorted([first.uuid, second.uuid])
    # a step sets what it names; the rest stays as captured, the processes until a step lists its own
    scenario = tmp_path / "scenario.json"
    scenario.write_text(json.dumps({"start": 1000, "steps": [
        {"at": 0, "gpus": {first.uuid: {"util": 90, "temp_c": 70}}},
        {"at": 60, "procs": []}]}))
    sampler = ScenarioSampler(node, scenario, captured)
    busy = {d.gpu_uuid: d for d in sampler.read(1030.0).devices}
    one = busy[first.uuid]
    assert (one.util_pct, one.temp_c, one.power_w) == (90.0, 70.0, 6.41)
    assert (busy[second.uuid].temp_c, busy[second.uuid].mem_used_mib) == (15.0, 17253.0)
    assert len(sampler.read(1030.0).processes) == 2
    done = sampler.read(1100.0)
    assert done.processes == () and {d.mem_used_mib for d in done.devices} == {0.0}


def test_the_replay_library_is_served_the_capture(tmp_path: Path, real_fixtures: Path) -> None:
    """The nvml.json the replay NVML library serves carries the captured state before any step."""
    bundle = bundle_of(tmp_path, real_fixtures, "tesla-t4.xml")
    node = read_bundle(bundle)
    served = replay_dict(node, captured=read_captured_state(bundle, node))["replay"]
    (step,) = served["steps"]
    assert step["at"] == 0.0
    (dev,) = step["devices"]
    assert (dev["mem_used_mib"], dev["util"], dev["power_w"]) == (1032.0, 0.0, 26.78)
    assert sorted(p["pid"] for p in step["processes"]) == [675, 5762]
    sc = parse_scenario(json.dumps({"gpus": {node.gpus[0].uuid: {"util": 50}}}), "s", node)
    later = replay_dict(node, scenario=sc, start=100.0,
                        captured=read_captured_state(bundle, node))["replay"]["steps"]
    assert [s["at"] for s in later] == [0.0, 100.0]
    assert later[1]["devices"][0]["power_w"] == 26.78 and len(later[1]["processes"]) == 2


def test_a_captured_pid_is_never_looked_up_in_this_machines_proc(tmp_path: Path) -> None:
    """The attacker's capture names a PID that here is someone else's process (this test's own):
    the view shows the capture's name with no owner and no job, never the local process's."""
    from gpuslurm.samples import ProcessReading

    attributor = Attributor(jobs_dir=str(tmp_path / "jobs"))
    mine = ProcessReading(os.getpid(), "GPU-x", None, 100.0, None, "llama-server")
    (sample,), _, problems = attributor.attribute(0.0, [mine])
    assert (sample.pid, sample.name, sample.uid, sample.user, sample.job_id) == \
        (os.getpid(), "llama-server", None, None, None)
    assert problems == ()


GPU_XML = """<?xml version="1.0"?><nvidia_smi_log><gpu id="00000000:81:00.0">
<fb_memory_usage><total>24564 MiB</total><used>{used}</used></fb_memory_usage>
<utilization><gpu_util>{util}</gpu_util></utilization><temperature><gpu_temp>{temp}</gpu_temp></temperature>
<gpu_power_readings><average_power_draw>{power}</average_power_draw></gpu_power_readings>
<processes><process_info><pid>{pid}</pid><process_name>{name}</process_name>
<used_memory>{used}</used_memory></process_info></processes></gpu></nvidia_smi_log>"""

_field = st.one_of(st.text(max_size=30),
                   st.sampled_from(["N/A", "0 %", "13 C", "6.41 W", "22437 MiB", "101 %", "1e9 W",
                                    "99999999999 MiB", "-1 C"]))


@given(used=_field, util=_field, temp=_field, power=_field, pid=_field, name=st.text(max_size=300))
def test_any_field_text_is_a_bounded_value_or_a_capture_error(tmp_path_factory: pytest.TempPathFactory,
                                                              used: str, util: str, temp: str, power: str,
                                                              pid: str, name: str) -> None:
    from xml.sax.saxutils import escape

    from gpuslurm.hw.model.node import Gpu, Node

    node = Node("n", (Gpu("GPU-a", 0, 0, "00000000:81:00.0", "X", 24564),))
    text = GPU_XML.format(**{k: escape("".join(c for c in v if c.isprintable()))
                             for k, v in dict(used=used, util=util, temp=temp, power=power, pid=pid,
                                              name=name).items()})
    try:
        state = parse_smi_state(text, "t.xml", node)
    except CaptureError:
        return
    for d in state.devices:
        assert d.util_pct is None or 0 <= d.util_pct <= 100
        assert d.temp_c is None or 0 <= d.temp_c <= 1000
        assert d.power_w is None or 0 <= d.power_w <= 1e5
        assert d.mem_used_mib is None or 0 <= d.mem_used_mib <= 1 << 24
    for p in state.processes:
        assert 0 < p.pid <= 1 << 30
        assert p.name is None or (len(p.name) <= 64 and p.name.isprintable() and "/" not in p.name)
