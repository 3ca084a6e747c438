"""Attribution of PBS jobs: PBS's cgroup paths (pure), real processes in PBS-shaped cgroups, and,
without PBS's cgroups hook, a job's session (qstat's session_id) or its owner's one job."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest
from tests.helpers.watch_helpers import V1_ROOT, V2_ROOT, cgroup_unavailable, in_cgroup, sleeper, stop

from gpuslurm.pbs.cgroup_paths import parse_cgroup, parse_cgroup_path
from gpuslurm.samples import Allocation, ProcessReading
from gpuslurm.state.cgroup import CgroupJob
from gpuslurm.watch.attribute import Attributor

GPU_A = "GPU-aaaaaaaa-1111-2222-3333-444455556666"


@pytest.mark.parametrize(("path", "job"), [
    ("/pbs_jobs.service/jobid/123.pbshost", CgroupJob("123.pbshost")),
    ("/pbs_jobs.service/jobid/123.pbshost/tasks", CgroupJob("123.pbshost")),
    ("/pbs_jobs.service/jobid/7[3].server.example.org", CgroupJob("7[3].server.example.org")),
    ("/site_gpus.service/jobid/9.srv", CgroupJob("9.srv")),  # a site's own cgroup_prefix
    ("/pbspro/55.srv", CgroupJob("55.srv")),  # PBS Professional before 19
    ("/pbs_jobs.service/jobid/123", None),  # no server part: not a PBS id
    ("/pbs_jobs.service/jobid/../etc", None),
    ("/pbs_jobs.service/jobid/", None),
    ("/pbs_jobs.service/123.pbshost", None),
    ("/pbs_jobs.service", None),
    ("/.service/jobid/1.a", None),
    # systemd lets a user make cgroups below their own slice: never a job there
    ("/user.slice/user-1000.slice/user@1000.service/app.slice/pbs_jobs.service/jobid/1.srv", None),
    ("/user.slice/pbspro/1.srv", None),
])
def test_pbs_cgroup_paths(path: str, job: CgroupJob | None) -> None:
    assert parse_cgroup_path(path) == job


def test_a_pbs_cgroup_file_in_v1_hierarchies() -> None:
    text = ("12:memory:/pbs_jobs.service/jobid/5.pbshost\n"
            "5:devices:/pbs_jobs.service/jobid/5.pbshost\n"
            "1:name=systemd:/pbs_jobs.service/jobid/5.pbshost\n"
            "0::/\n")
    assert parse_cgroup(text) == CgroupJob("5.pbshost")


@pytest.mark.parametrize(("root", "relative"), [
    (V1_ROOT, "pbs_jobs.service/jobid/4242.pbshost"),
    (V2_ROOT, "pbs_jobs.service/jobid/4343.pbshost"),
])
def test_real_process_in_a_pbs_cgroup_is_attributed(tmp_path: Path, root: Path, relative: str) -> None:
    reason = cgroup_unavailable(root)
    if reason:
        pytest.skip(reason)
    proc = sleeper()
    try:
        with in_cgroup(root, relative, proc.pid):
            att = Attributor(job_of_cgroup=parse_cgroup, jobs_dir=str(tmp_path / "none"))
            samples, _, problems = att.attribute(time.time(), [ProcessReading(proc.pid, GPU_A)])
    finally:
        stop(proc)
    assert problems == ()
    assert samples[0].job_id == relative.rsplit("/", 1)[1]


def _own_session(seconds: int = 120) -> subprocess.Popen[bytes]:
    """A process leading a session of its own, as pbs_mom starts a job's shell."""
    return subprocess.Popen(["/bin/sleep", str(seconds)], start_new_session=True)


def test_without_cgroups_the_job_shells_session_names_the_job(tmp_path: Path) -> None:
    job_proc = _own_session()
    outsider = sleeper()
    calls: list[float] = []
    sessions = {job_proc.pid: "12.pbshost"}

    def qstat() -> tuple[Allocation, ...]:
        calls.append(1.0)
        return (Allocation("12.pbshost", "someone", 4321, (GPU_A,), 1.0, source="qstat"),)

    try:
        att = Attributor(job_of_cgroup=parse_cgroup,
                         jobs_dir=str(tmp_path / "none"), squeue=qstat, sessions=lambda: sessions)
        samples, allocs, problems = att.attribute(time.time(), [ProcessReading(job_proc.pid, GPU_A),
                                                                ProcessReading(outsider.pid, GPU_A)])
    finally:
        stop(job_proc)
        stop(outsider)
    by_pid = {s.pid: s.job_id for s in samples}
    assert by_pid == {job_proc.pid: "12.pbshost", outsider.pid: None}
    assert [a.job_id for a in allocs] == ["12.pbshost"] and problems == ()
    assert calls == [1.0]  # asked once, before the lookups, although no cgroup named the job


ROOT_ONLY = pytest.mark.skipif(os.geteuid() != 0, reason="starts a process as another user / as root")


@ROOT_ONLY
def test_a_process_that_left_the_session_goes_to_its_owners_one_job(tmp_path: Path) -> None:
    proc = subprocess.Popen(["/bin/sleep", "120"], start_new_session=True, user=65534, group=65534)
    try:
        mine = Allocation("13.pbshost", "nobody", 65534, (GPU_A,), 1.0, source="qstat")
        att = Attributor(job_of_cgroup=parse_cgroup,
                         jobs_dir=str(tmp_path / "none"), squeue=lambda: (mine,), sessions=dict)
        samples, _, _ = att.attribute(time.time(), [ProcessReading(proc.pid, GPU_A)])
        assert samples[0].job_id == "13.pbshost"  # its owner's one job on this node
        two = (mine, mine._replace(job_id="14.pbshost"))
        att = Attributor(job_of_cgroup=parse_cgroup,
                         jobs_dir=str(tmp_path / "none"), squeue=lambda: two, sessions=dict)
        samples, _, _ = att.attribute(time.time(), [ProcessReading(proc.pid, GPU_A)])
        assert samples[0].job_id is None  # two jobs: no guess
    finally:
        stop(proc)


@ROOT_ONLY
def test_roots_processes_are_never_guessed_into_a_job(tmp_path: Path) -> None:
    proc = _own_session()  # the test runs as root
    try:
        roots = Allocation("16.pbshost", "root", 0, (GPU_A,), 1.0, source="qstat")
        att = Attributor(job_of_cgroup=parse_cgroup,
                         jobs_dir=str(tmp_path / "none"), squeue=lambda: (roots,), sessions=dict)
        samples, _, _ = att.attribute(time.time(), [ProcessReading(proc.pid, GPU_A)])
    finally:
        stop(proc)
    assert samples[0].uid == 0 and samples[0].job_id is None


def test_slurm_attribution_makes_no_owner_guess(tmp_path: Path) -> None:
    proc = sleeper()
    try:
        mine = Allocation("15", "root", 0, (GPU_A,), 1.0, source="squeue")
        att = Attributor(job_of_cgroup=parse_cgroup, jobs_dir=str(tmp_path / "none"), squeue=lambda: (mine,))
        samples, _, _ = att.attribute(time.time(), [ProcessReading(proc.pid, GPU_A)])
    finally:
        stop(proc)
    assert samples[0].job_id is None
