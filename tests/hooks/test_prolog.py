"""The prolog and epilog on a replayed DGX H100, with a stand-in scontrol that records its calls."""

from __future__ import annotations

import io
import json
import os
import signal
from pathlib import Path

import pytest
from tests.helpers.hook_helpers import HookSite, make_site

from gpuslurm.hooks.log import HookLog
from gpuslurm.slurm.hooks import run_epilog, run_prolog
from gpuslurm.state.jobmap import job_map, read_map, write_map


@pytest.fixture
def site(tmp_path: Path) -> HookSite:
    return make_site(tmp_path)


def quiet(hook: str) -> HookLog:
    return HookLog(hook, stream=io.StringIO(), use_syslog=False)


def test_prolog_writes_the_map_of_the_jobs_gpus(site: HookSite) -> None:
    log = quiet("prolog")
    assert run_prolog(site.environ(gpus="1,3,4"), log) == 0, log.lines
    jmap = read_map("1234", str(site.jobs_dir))
    assert jmap is not None
    assert jmap.uuids == (site.uuids[1], site.uuids[3], site.uuids[4])
    assert jmap.minors == (1, 3, 4)
    assert (jmap.user, jmap.uid) == ("alice", 1000)
    assert os.stat(site.jobs_dir / "1234.json").st_mode & 0o777 == 0o600
    assert site.scontrol_calls() == []


def test_prolog_for_a_job_without_gpus_does_nothing(site: HookSite) -> None:
    assert run_prolog(site.environ(gpus=None), quiet("prolog")) == 0
    assert not site.jobs_dir.exists()


def test_hot_gpu_drains_the_node_naming_it_and_fails(site: HookSite) -> None:
    site.set_health({site.uuids[2]: {"temperature_c": 95}, site.uuids[5]: {"xid": [79]}})
    log = quiet("prolog")
    assert run_prolog(site.environ(gpus="0-3"), log) == 1
    [call] = site.scontrol_calls()
    assert call[:3] == ["update", "NodeName=node07", "State=DRAIN"]
    assert call[3] == (f"Reason=gpuslurm: GPU index 2 (/dev/nvidia2, {site.uuids[2]}): "
                       "temperature 95 C over limit 85 C")
    # GPU 5's Xid is not this job's business, and the job must not start: no map.
    assert not (site.jobs_dir / "1234.json").exists()
    assert any("drained node07" in line for line in log.lines)


def test_every_faulty_gpu_of_the_job_is_in_the_reason(site: HookSite) -> None:
    site.set_health({site.uuids[0]: {"lost": True},
                     site.uuids[1]: {"ecc_uncorrectable": 3, "remap_pending": True}})
    assert run_prolog(site.environ(gpus="0,1"), quiet("prolog")) == 1
    reason = site.scontrol_calls()[0][3]
    assert f"GPU index 0 (/dev/nvidia0, {site.uuids[0]}): GPU is lost" in reason
    assert f"GPU index 1 (/dev/nvidia1, {site.uuids[1]}): 3 uncorrectable ECC errors (limit 0)" in reason
    assert "row remap pending" in reason


def test_ignored_xid_and_log_action_let_the_job_run(site: HookSite) -> None:
    site.write_config('[health.temperature]\naction = "log"\n')
    site.set_health({site.uuids[0]: {"xid": [13, 43], "temperature_c": 99}})
    log = quiet("prolog")
    assert run_prolog(site.environ(gpus="0"), log) == 0
    assert site.scontrol_calls() == []
    assert (site.jobs_dir / "1234.json").exists()
    assert any("temperature 99 C" in line and "action log" in line for line in log.lines)
    assert not any("Xid" in line for line in log.lines)


def test_leftover_processes_of_an_ignored_user_are_not_a_fault(site: HookSite) -> None:
    site.write_config('[health.leftover_processes]\nignore_users = ["dcgm"]\n')
    site.set_health({site.uuids[0]: {"processes": [{"pid": 7, "user": "dcgm"}]},
                     site.uuids[1]: {"processes": [{"pid": 8, "user": "bob"}]}})
    assert run_prolog(site.environ(gpus="0"), quiet("prolog")) == 0
    assert run_prolog(site.environ(job_id="1235", gpus="1"), quiet("prolog")) == 1
    assert "pid 8 (bob)" in site.scontrol_calls()[0][3]


def test_failing_drain_still_fails_the_prolog(tmp_path: Path) -> None:
    site = make_site(tmp_path, scontrol_exit=1)
    site.set_health({site.uuids[0]: {"lost": True}})
    log = quiet("prolog")
    assert run_prolog(site.environ(gpus="0"), log) == 1
    assert any("could not drain" in line for line in log.lines)


def test_unreadable_scenario_fails_closed(site: HookSite) -> None:
    (site.bundle / "health.json").write_text('{"GPU-x": {"temprature_c": 90}}')
    log = quiet("prolog")
    assert run_prolog(site.environ(), log) == 2
    assert "unknown key 'temprature_c'" in log.lines[-1]
    assert not (site.jobs_dir / "1234.json").exists()


def test_fifo_health_json_fails_closed_without_hanging(site: HookSite) -> None:
    os.mkfifo(site.bundle / "health.json")  # open() waited for a writer: the prolog hung
    log = quiet("prolog")

    def hung(signum: int, frame: object) -> None:
        raise TimeoutError("the prolog waited on the FIFO")

    old = signal.signal(signal.SIGALRM, hung)
    signal.alarm(10)
    try:
        assert run_prolog(site.environ(), log) == 2
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
    assert "is a FIFO, not a regular file" in log.lines[-1]


@pytest.mark.parametrize("gpus", ["0-99999999999", "0-4095,0-4095", "0,1\u2028x"])
def test_hostile_job_gpus_are_one_line_and_bounded(site: HookSite, gpus: str) -> None:
    log = quiet("prolog")
    assert run_prolog(site.environ(gpus=gpus), log) == 2
    assert "SLURM_JOB_GPUS" in log.lines[-1] and len(log.lines[-1].splitlines()) == 1


def test_bad_environment_and_config_are_errors(site: HookSite) -> None:
    env = site.environ()
    del env["SLURM_JOB_ID"]
    assert run_prolog(env, quiet("prolog")) == 2
    assert run_prolog(site.environ(gpus="8"), quiet("prolog")) == 2  # the node has 8 GPUs: 0-7
    site.config.write_text("[health.temperature]\nlimit = 3\n")
    assert run_prolog(site.environ(), quiet("prolog")) == 2


def test_epilog_removes_the_map_and_writes_a_summary(site: HookSite) -> None:
    assert run_prolog(site.environ(gpus="4,5"), quiet("prolog")) == 0
    start = json.loads((site.jobs_dir / "1234.json").read_text())["start"]
    assert run_epilog(site.environ(gpus="4,5"), quiet("epilog"), now=start + 60) == 0
    assert not (site.jobs_dir / "1234.json").exists()
    summary = json.loads((site.summaries / "1234-summary.json").read_text())
    assert [g["uuid"] for g in summary["gpus"]] == site.uuids[4:6]
    assert (summary["start"], summary["end"], summary["user"]) == (start, start + 60, "alice")
    assert summary["faults"] == []


def test_epilog_without_a_map_summarises_slurms_gpus(site: HookSite) -> None:
    assert run_epilog(site.environ(gpus="7"), quiet("epilog")) == 0
    summary = json.loads((site.summaries / "1234-summary.json").read_text())
    assert [g["uuid"] for g in summary["gpus"]] == [site.uuids[7]]
    assert summary["start"] is None


def test_epilog_drains_when_the_job_left_processes_and_memory(site: HookSite) -> None:
    # Killing is off here (tests/hooks/test_epilog.py kills real processes): PID 99 is a record.
    site.write_config("[epilog]\nkill_leftover = false\n")
    assert run_prolog(site.environ(gpus="0,1"), quiet("prolog")) == 0
    site.set_health({site.uuids[1]: {"processes": [{"pid": 99, "user": "alice", "used_mib": 4000}],
                                     "memory_used_mib": 4100}})
    assert run_epilog(site.environ(gpus="0,1"), quiet("epilog")) == 0  # drained: Slurm keeps our reason
    [call] = site.scontrol_calls()
    assert call[3].startswith(f"Reason=gpuslurm: GPU index 1 (/dev/nvidia1, {site.uuids[1]}): "
                              "1 process(es) left after the job")
    assert "4100 MiB still in use" in call[3]
    assert not (site.jobs_dir / "1234.json").exists()
    faults = json.loads((site.summaries / "1234-summary.json").read_text())["faults"]
    assert {f["check"] for f in faults} == {"leftover_processes", "memory_released"}


def test_epilog_summary_failure_is_logged_not_fatal(site: HookSite) -> None:
    assert run_prolog(site.environ(), quiet("prolog")) == 0  # it reads the out-of-service record there
    (site.root / "state").write_text("a file where the state directory should be")
    log = quiet("epilog")
    assert run_epilog(site.environ(), log) == 0
    assert not (site.jobs_dir / "1234.json").exists()
    assert any("cannot write the job summary" in line for line in log.lines)


def test_epilog_survives_a_corrupt_map(site: HookSite) -> None:
    site.jobs_dir.mkdir(parents=True, mode=0o700)
    (site.jobs_dir / "1234.json").write_text("{not json")
    (site.jobs_dir / "1234.json").chmod(0o600)
    log = quiet("epilog")
    assert run_epilog(site.environ(gpus="2"), log) == 0
    assert any("cannot read the job map" in line for line in log.lines)
    assert not (site.jobs_dir / "1234.json").exists()


def test_map_written_by_jobmap_is_what_the_epilog_reads(site: HookSite) -> None:
    from gpuslurm.hw.source import load_node
    from gpuslurm.state.job import JobDevice

    gpu = load_node(str(site.bundle)).gpus[6]
    write_map(job_map("1234", "alice", 1000, [JobDevice(gpu, None, 6)], start=5.0), str(site.jobs_dir))
    assert run_epilog(site.environ(gpus=None), quiet("epilog"), now=9.0) == 0
    summary = json.loads((site.summaries / "1234-summary.json").read_text())
    assert summary["gpus"][0]["uuid"] == gpu.uuid
    assert (summary["start"], summary["end"]) == (5.0, 9.0)


def test_the_drain_reason_names_the_device_file_where_minors_differ_from_indices(tmp_path: Path) -> None:
    site = make_site(tmp_path, builtin="l40s-4x")  # minors in index order: 2, 3, 0, 1
    site.set_health({site.uuids[2]: {"xid": [79]}})
    assert run_prolog(site.environ(gpus="0-3"), quiet("prolog")) == 1
    [call] = site.scontrol_calls()
    assert call[3] == (f"Reason=gpuslurm: GPU index 2 (/dev/nvidia0, {site.uuids[2]}): "
                       "Xid 79 (GPU has fallen off the bus; needs reboot)")


def test_a_job_refused_for_xid_79_gets_a_summary_with_the_faults(site: HookSite) -> None:
    site.set_health({site.uuids[1]: {"xid": [79]}})
    assert run_prolog(site.environ(gpus="0,1"), quiet("prolog")) == 1
    assert run_epilog(site.environ(gpus="0,1"), quiet("epilog")) == 0  # Slurm runs it after a refusal
    summary = json.loads((site.summaries / "1234-summary.json").read_text())
    assert summary["refused_by"] == "prolog"
    assert [g["uuid"] for g in summary["gpus"]] == site.uuids[:2]
    faults = [(f["uuid"], f["check"], f["action"]) for f in summary["faults"]]
    assert faults == [(site.uuids[1], "xid", "drain")]
    assert "79" in summary["faults"][0]["message"]
