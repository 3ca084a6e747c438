"""The job's account in its map: written by the prolog, read back, optional for older maps."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from tests.helpers.hook_helpers import HookSite, make_site

from gpuslurm.errors import InputError
from gpuslurm.hooks.log import HookLog
from gpuslurm.slurm.adapter import SlurmScheduler
from gpuslurm.slurm.hooks import run_prolog
from gpuslurm.state.jobmap import JobMap, MappedDevice, list_maps, read_map, write_map
from gpuslurm.watch.attribute import Attributor

DEVICES = (MappedDevice("GPU-aaaa", 2, 0, None, ("/dev/nvidia2",)),)


def test_round_trip_with_an_account(tmp_path: Path) -> None:
    m = JobMap("41", "alice", 1001, DEVICES, 5.0, account="physics")
    write_map(m, str(tmp_path))
    assert json.loads((tmp_path / "41.json").read_text())["account"] == "physics"
    assert read_map("41", str(tmp_path)) == m


def test_a_map_without_an_account_is_written_and_read_as_before(tmp_path: Path) -> None:
    m = JobMap("42", "alice", 1001, DEVICES, 5.0)
    write_map(m, str(tmp_path))
    doc = json.loads((tmp_path / "42.json").read_text())
    assert "account" not in doc  # byte for byte what older gpuslurm wrote
    assert read_map("42", str(tmp_path)) == m and m.account is None
    doc["account"] = ""  # an empty one means none
    (tmp_path / "42.json").write_text(json.dumps(doc))
    assert read_map("42", str(tmp_path)) == m


def test_a_map_from_an_older_prolog_still_reads(tmp_path: Path) -> None:
    old = {"version": 1, "job_id": "43", "user": "bob", "uid": 1002, "start": 7,
           "gpus": [{"uuid": "GPU-bbbb", "minor": 0, "gres_index": 1, "parent_uuid": None,
                     "device_files": ["/dev/nvidia0"]}]}
    path = tmp_path / "43.json"
    path.write_text(json.dumps(old))
    path.chmod(0o600)
    got = read_map("43", str(tmp_path))
    assert got is not None and got.account is None and got.uuids == ("GPU-bbbb",)


def test_an_account_of_the_wrong_type_is_refused(tmp_path: Path) -> None:
    write_map(JobMap("44", "alice", 1001, DEVICES, 5.0, account="x"), str(tmp_path))
    doc = json.loads((tmp_path / "44.json").read_text())
    doc["account"] = 12
    (tmp_path / "44.json").write_text(json.dumps(doc))
    with pytest.raises(InputError, match="'account' missing or of the wrong type"):
        read_map("44", str(tmp_path))


@pytest.fixture
def site(tmp_path: Path) -> HookSite:
    return make_site(tmp_path)


@pytest.mark.parametrize("account,expected", [("physics", "physics"), ("  ", None), (None, None)])
def test_the_prolog_records_slurm_job_account(site: HookSite, account: str | None,
                                              expected: str | None) -> None:
    env = site.environ(gpus="1")
    if account is not None:
        env["SLURM_JOB_ACCOUNT"] = account
    log = HookLog("prolog", stream=io.StringIO(), use_syslog=False)
    assert run_prolog(env, log) == 0, log.lines
    jmap = read_map("1234", str(site.jobs_dir))
    assert jmap is not None and jmap.account == expected


def test_the_monitor_gives_mapped_allocations_their_account(tmp_path: Path) -> None:
    jobs = tmp_path / "jobs"
    write_map(JobMap("51", "alice", 1001, DEVICES, 5.0, account="physics"), str(jobs))
    write_map(JobMap("52", "bob", 1002, DEVICES, 6.0), str(jobs))
    _, allocs, problems = Attributor(jobs_dir=str(jobs)).attribute(10.0, [])
    assert problems == ()
    assert [(a.job_id, a.account, a.source) for a in allocs] == [
        ("51", "physics", "map"), ("52", None, "map")]
    assert [m.account for m in list_maps(str(jobs))] == ["physics", None]


def test_an_older_map_takes_the_account_from_squeues_last_answer(tmp_path: Path) -> None:
    from gpuslurm.samples import Allocation, ProcessReading

    proc = tmp_path / "proc" / "20"  # a process of job 99, which has no map: squeue is asked
    proc.mkdir(parents=True)
    (proc / "stat").write_text("20 (t) S " + " ".join(["0"] * 30) + "\n")
    (proc / "status").write_text("Uid:\t1000\t1000\t1000\t1000\n")
    (proc / "cgroup").write_text("0::/system.slice/slurmstepd.scope/job_99/step_0\n")
    jobs = tmp_path / "jobs"
    write_map(JobMap("52", "bob", 1002, DEVICES, 6.0), str(jobs))
    write_map(JobMap("53", "bob", 1002, DEVICES, 6.0, account="physics"), str(jobs))
    answer = (Allocation("52", "bob", 1002, ("GPU-aaaa",), 6.0, "chem", source="squeue"),
              Allocation("53", "bob", 1002, ("GPU-aaaa",), 6.0, "other", source="squeue"),
              Allocation("99", "eve", 1000, ("GPU-cccc",), 8.0, "bio", source="squeue"))
    att = Attributor(jobs_dir=str(jobs), proc_root=str(tmp_path / "proc"), squeue=lambda: answer,
                     job_of_cgroup=SlurmScheduler().job_of_cgroup)
    _, allocs, _ = att.attribute(10.0, [ProcessReading(20, "GPU-cccc")])
    # the map's own account wins; squeue only fills in what a map lacks
    assert [(a.job_id, a.account, a.source) for a in allocs] == [
        ("52", "chem", "map"), ("53", "physics", "map"), ("99", "bio", "squeue")]
