"""Attribution: cgroup paths → jobs (pure), and real processes in real Slurm-shaped cgroups."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from tests.helpers.watch_helpers import V1_ROOT, V2_ROOT, cgroup_unavailable, in_cgroup, sleeper, stop

from gpuslurm.errors import CommandError
from gpuslurm.samples import Allocation, ProcessReading
from gpuslurm.slurm.cgroup_paths import parse_cgroup, parse_cgroup_path
from gpuslurm.state.cgroup import CgroupJob
from gpuslurm.state.jobmap import JobMap, MappedDevice, write_map
from gpuslurm.watch.attribute import Attributor

GPU_A = "GPU-aaaaaaaa-1111-2222-3333-444455556666"
GPU_B = "GPU-bbbbbbbb-1111-2222-3333-444455556666"


@pytest.mark.parametrize(("path", "job"), [
    ("/slurm/uid_1000/job_42/step_0/task_0", CgroupJob("42", "0", 1000, None)),
    ("/slurm/uid_1000/job_42/step_batch", CgroupJob("42", "batch", 1000, None)),
    ("/slurm_node07/uid_0/job_7/step_extern", CgroupJob("7", "extern", 0, "node07")),
    ("/slurm/uid_5/job_9", CgroupJob("9", None, 5, None)),
    ("/system.slice/slurmstepd.scope/job_123/step_0/user/task_0", CgroupJob("123", "0", None, None)),
    ("/system.slice/node07_slurmstepd.scope/job_123/step_interactive/user/task_special",
     CgroupJob("123", "interactive", None, "node07")),
    ("/system.slice/slurmstepd.scope/system", None),  # slurmstepd itself
    ("/system.slice/sshd.service", None),
    ("/user.slice/user-1000.slice/session-3.scope", None),
    ("/slurm/uid_x/job_4/step_0", None),
    ("/slurm/uid_1/job_4a/step_0", None),
    ("/slurm/uid_1/job_/step_0", None),
    ("/myslurm/uid_1/job_4/step_0", None),
    ("/system.slice/notslurmstepd.scope/job_4", None),
    # Slurm 26.05: the job named by its SLUID (what node1 of the real 26.05 showed)
    ("/system.slice/node1_slurmstepd.scope/s6Z5M8CB6N7P00/step_0/user/task_0",
     CgroupJob(None, "0", None, "node1", sluid="s6Z5M8CB6N7P00")),
    ("/system.slice/slurmstepd.scope/sEKNKTV3WPV500/step_extern/slurm",
     CgroupJob(None, "extern", None, None, sluid="sEKNKTV3WPV500")),
    ("/gpu.slice/slurmstepd.scope/sEKNKTV3WPV500", CgroupJob(None, None, None, None, sluid="sEKNKTV3WPV500")),
    ("/system.slice/slurmstepd.scope/seknktv3wpv500/step_0", None),  # Slurm prints upper case only
    ("/system.slice/slurmstepd.scope/sEKNKTV3WPV5OO/step_0", None),  # O is not a digit it prints
    ("/system.slice/slurmstepd.scope/sGKNKTV3WPV500/step_0", None),  # first digit: 4 bits, 0-F
    ("/system.slice/slurmstepd.scope/s0000000000000/step_0", None),  # 0: Slurm's "no SLUID"
    ("/system.slice/slurmstepd.scope/sEKNKTV3WPV5000/step_0", None),
    ("/system.slice/slurmstepd.scope/sEKNKTV3WPV50/step_0", None),
    ("/slurm/uid_1/sEKNKTV3WPV500/step_0", None),  # v1 never names jobs by SLUID
    ("/user.slice/user-1000.slice/user@1000.service/x.slice/slurmstepd.scope/sEKNKTV3WPV500", None),
    ("/", None),
    ("", None),
])
def test_cgroup_paths(path: str, job: CgroupJob | None) -> None:
    assert parse_cgroup_path(path) == job


@pytest.mark.parametrize("adapter", ["slurm", "pbs"])
@pytest.mark.parametrize("job_id", ["5", "4294967294", "41.pbshost", "123[4].server"])
def test_every_cgroup_gpuslurm_makes_for_a_job_names_that_job(job_id: str, adapter: str) -> None:
    """The class, not the example: each cgroup gpuslurm.isolate.cgroup_v1/cgroup_v2 make for a job
    (its tasks', and its MPS daemon's, v1 and v2) is that job's, in every adapter's layout, so PBS's
    execjob_attach refuses to move a process out of it into another job and the monitor and the end
    count it as the job's."""
    import importlib

    from gpuslurm.isolate.cgroup_v1 import v1_job_dir
    from gpuslurm.isolate.cgroup_v2 import v2_mps_dir, v2_pbs_dir

    layout = importlib.import_module(f"gpuslurm.{adapter}.cgroup_paths")
    parse_cgroup_path, parse_cgroup = layout.parse_cgroup_path, layout.parse_cgroup

    root = "/sys/fs/cgroup"
    made = [v1_job_dir(root, job_id), v1_job_dir(root, job_id, "mps"), v2_mps_dir(root, job_id)]
    if "." in job_id:  # PBS ids only: Slurm's v2 job cgroups are slurmstepd's
        made.append(v2_pbs_dir(root, job_id))
    for path in made:
        relative = path[len(root):].removeprefix("/devices")
        assert parse_cgroup_path(relative) == CgroupJob(job_id), relative
        assert parse_cgroup(f"0::{relative}\n") == CgroupJob(job_id), relative
    # only at a hierarchy's top, and only the kinds gpuslurm makes there
    for path in (f"/user.slice/user-1.slice/user@1.service/gpuslurm.mps/mps_{job_id}",
                 f"/system.slice/gpuslurm.mps/mps_{job_id}", f"/gpuslurm.mps/job_{job_id}",
                 f"/gpuslurm.pbs/mps_{job_id}", f"/gpuslurm/other_{job_id}", "/gpuslurm.mps/mps_"):
        assert parse_cgroup_path(path) is None, path


def test_a_sluid_path_is_a_job_not_no_job() -> None:
    """Issue 19: on 26.05 every job process's cgroup was parsed as "no job" (rogue to the
    monitor, nothing to the epilog). A SLUID path is a job, known by its SLUID."""
    text = "0::/system.slice/node1_slurmstepd.scope/s6Z5M8CB6N7P00/step_0/user/task_0\n"
    job = parse_cgroup(text)
    assert job is not None and job.sluid == "s6Z5M8CB6N7P00" and job.job_id is None
    assert job.label == "s6Z5M8CB6N7P00" and job.step == "0" and job.node == "node1"
    # both layouts on one node (an upgrade with jobs running): each names its own job
    old = parse_cgroup("0::/system.slice/node1_slurmstepd.scope/job_41/step_0/user/task_0\n")
    assert old is not None and old.job_id == "41" and old.sluid is None and old.label == "41"


def test_cgroup_file_prefers_the_freezer_and_unified_lines() -> None:
    text = ("12:memory:/slurm/uid_1/job_5/step_0/task_0\n"
            "9:freezer:/slurm/uid_1/job_6/step_0\n"
            "1:name=systemd:/system.slice/slurmd.service\n")
    assert parse_cgroup(text) == CgroupJob("6", "0", 1, None)
    assert parse_cgroup("4:memory:/slurm/uid_1/job_5/step_0\n0::/user.slice\n") == CgroupJob("5", "0", 1)
    assert parse_cgroup("0::/system.slice/slurmstepd.scope/job_8/step_batch/user/task_0\n") == \
        CgroupJob("8", "batch")
    assert parse_cgroup("0::/init.scope\n") is None
    assert parse_cgroup("garbage without colons\n\n") is None


def _map(jobs_dir: Path, job_id: str, uuids: list[str], uid: int = 0, user: str = "root") -> None:
    devices = tuple(MappedDevice(u, i) for i, u in enumerate(uuids))
    write_map(JobMap(job_id, user, uid, devices, 1000.0), str(jobs_dir))


@pytest.mark.parametrize(("root", "relative", "job"), [
    (V1_ROOT, "slurm_gpuslurmtest/uid_0/job_4242/step_0", "4242"),
    (V1_ROOT, "slurm/uid_0/job_4343/step_batch", "4343"),
    (V2_ROOT, "system.slice/gpuslurmtest_slurmstepd.scope/job_4444/step_0/user/task_0", "4444"),
])
def test_real_process_in_a_slurm_cgroup_is_attributed(tmp_path: Path, root: Path, relative: str,
                                                       job: str) -> None:
    reason = cgroup_unavailable(root)
    if reason:
        pytest.skip(reason)
    jobs_dir = tmp_path / "jobs"
    _map(jobs_dir, job, [GPU_A])
    proc = sleeper()
    outsider = sleeper()
    try:
        with in_cgroup(root, relative, proc.pid):
            att = Attributor(job_of_cgroup=parse_cgroup, jobs_dir=str(jobs_dir))
            now = time.time()
            readings = [ProcessReading(proc.pid, GPU_A, None, 500.0, 40.0),
                        ProcessReading(outsider.pid, GPU_B, None, 100.0, None)]
            samples, allocs, problems = att.attribute(now, readings)
    finally:
        stop(proc)
        stop(outsider)
    assert problems == ()
    by_pid = {s.pid: s for s in samples}
    mine = by_pid[proc.pid]
    assert (mine.job_id, mine.name, mine.uid, mine.user, mine.gpu_uuid) == (job, "sleep", 0, "root", GPU_A)
    assert (mine.mem_mib, mine.sm_util_pct) == (500.0, 40.0)
    assert mine.started is not None and abs(mine.started - now) < 30
    assert by_pid[outsider.pid].job_id is None  # the test's own cgroup is no Slurm job
    assert allocs == (Allocation(job, "root", 0, (GPU_A,), 1000.0, source="map"),)


def test_cached_facts_are_reused_and_a_reused_pid_is_read_again(tmp_path: Path) -> None:
    """The cache key is (PID, start time): a changed start time means another process."""
    fake = tmp_path / "proc"
    pid_dir = fake / "77"
    pid_dir.mkdir(parents=True)
    (fake / "stat").write_text("cpu 1 2 3\nbtime 1000\n")

    def write(start: int, job: str) -> None:
        fields = ["S"] + ["0"] * 18 + [str(start)] + ["0"] * 20
        (pid_dir / "stat").write_text(f"77 (py) {' '.join(fields)}\n")
        (pid_dir / "status").write_text("Name:\tpy\nUid:\t1000\t1000\t1000\t1000\n")
        (pid_dir / "cgroup").write_text(f"3:freezer:/slurm/uid_1000/job_{job}/step_0\n")

    write(500, "1")
    att = Attributor(job_of_cgroup=parse_cgroup,
                     jobs_dir=str(tmp_path / "none"), proc_root=str(fake), refresh_s=3600)
    reading = [ProcessReading(77, GPU_A)]
    assert att.attribute(1.0, reading)[0][0].job_id == "1"
    (pid_dir / "cgroup").write_text("3:freezer:/slurm/uid_1000/job_2/step_0\n")
    assert att.attribute(2.0, reading)[0][0].job_id == "1"  # same process: cached
    write(900, "3")
    assert att.attribute(3.0, reading)[0][0].job_id == "3"  # PID reused: read again


def test_unreadable_and_vanished_processes_are_problems_not_crashes(tmp_path: Path) -> None:
    fake = tmp_path / "proc"
    (fake / "10").mkdir(parents=True)
    (fake / "10" / "stat").write_text("10 (x) S " + " ".join(["0"] * 30) + "\n")
    (fake / "10" / "cgroup").mkdir()  # reading it fails with EISDIR: unreadable, not gone
    (fake / "10" / "status").write_text("Uid:\t0\t0\t0\t0\n")
    (fake / "11").mkdir()  # stat missing: the process exited
    att = Attributor(job_of_cgroup=parse_cgroup, jobs_dir=str(tmp_path / "none"), proc_root=str(fake))
    samples, _, problems = att.attribute(5.0, [ProcessReading(10, GPU_A, None, 300.0),
                                               ProcessReading(11, GPU_A), ProcessReading(12, GPU_B)])
    kinds = {(p.kind, p.subject) for p in problems}
    assert kinds == {("proc-unreadable", "10"), ("pid-gone", "11"), ("pid-gone", "12")}
    # the unreadable one still uses the GPU: kept, owner and job unknown; the gone ones are stale
    assert [(s.pid, s.job_id, s.uid, s.mem_mib) for s in samples] == [(10, None, None, 300.0)]


def test_a_process_on_two_gpus_is_read_once(tmp_path: Path) -> None:
    att = Attributor(job_of_cgroup=parse_cgroup, jobs_dir=str(tmp_path / "none"))
    pid = os.getpid()
    samples, _, problems = att.attribute(1.0, [ProcessReading(pid, GPU_A), ProcessReading(pid, GPU_B)])
    assert [s.gpu_uuid for s in samples] == [GPU_A, GPU_B] and problems == ()


def test_a_corrupt_job_map_is_reported_and_the_others_still_count(tmp_path: Path) -> None:
    jobs = tmp_path / "jobs"
    _map(jobs, "5", [GPU_A])
    (jobs / "6.json").write_text("{not json")
    os.chmod(jobs / "6.json", 0o600)
    att = Attributor(job_of_cgroup=parse_cgroup, jobs_dir=str(jobs))
    _, allocs, problems = att.attribute(1.0, [])
    assert [a.job_id for a in allocs] == ["5"]
    assert [(p.kind, p.subject) for p in problems] == [("jobmap-unreadable", "6")]
    (jobs / "6.json").unlink()
    _map(jobs, "7", [GPU_B])  # the directory changed: re-read
    _, allocs, problems = att.attribute(2.0, [])
    assert [a.job_id for a in allocs] == ["5", "7"] and problems == ()


def test_squeue_fills_in_for_jobs_without_a_map_rate_limited(tmp_path: Path) -> None:
    fake = tmp_path / "proc"
    (fake / "20").mkdir(parents=True)
    (fake / "20" / "stat").write_text("20 (t) S " + " ".join(["0"] * 30) + "\n")
    (fake / "20" / "status").write_text("Uid:\t1000\t1000\t1000\t1000\n")
    (fake / "20" / "cgroup").write_text("0::/system.slice/slurmstepd.scope/job_99/step_0\n")
    jobs = tmp_path / "jobs"
    _map(jobs, "5", [GPU_A])
    calls: list[float] = []
    answers: list[object] = [CommandError("squeue: timed out"),
                             (Allocation("99", "bob", 1000, (GPU_B,), 10.0, source="squeue"),)]

    def squeue() -> tuple[Allocation, ...]:
        calls.append(1)
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer  # type: ignore[return-value]

    att = Attributor(job_of_cgroup=parse_cgroup,
                     jobs_dir=str(jobs), proc_root=str(fake), squeue=squeue, squeue_interval_s=60)
    reading = [ProcessReading(20, GPU_B)]
    _, allocs, problems = att.attribute(100.0, reading)
    assert [p.kind for p in problems] == ["squeue-error"] and [a.job_id for a in allocs] == ["5"]
    _, allocs, problems = att.attribute(130.0, reading)  # too soon to ask again
    assert len(calls) == 1 and problems == ()
    _, allocs, problems = att.attribute(161.0, reading)
    assert len(calls) == 2 and [(a.job_id, a.source) for a in allocs] == [("5", "map"), ("99", "squeue")]
    att.attribute(300.0, reading)  # known now: no more calls
    assert len(calls) == 2


def test_a_slurm_shaped_cgroup_under_a_users_own_slice_is_no_job() -> None:
    fake = "/user.slice/user-1000.slice/user@1000.service/app.slice/slurm/uid_1000/job_5/step_0"
    assert parse_cgroup_path(fake) is None
    assert parse_cgroup_path("/slurm/uid_1000/job_5/step_0") is not None
