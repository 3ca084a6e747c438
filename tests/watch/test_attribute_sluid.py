"""Attribution on Slurm 26.05's SLUID layout: real processes in real cgroup2 directories named
``s<SLUID>``, their job found through the prolog's maps, else the scheduler (scontrol), never
through the process's environment; a SLUID nobody knows is reported, not judged rogue."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest
from tests.helpers.watch_helpers import V2_ROOT, cgroup_unavailable, in_cgroup, stop

from gpuslurm.errors import CommandError
from gpuslurm.policy.rogue import why_rogue
from gpuslurm.policy.usage import view as cycle_view
from gpuslurm.samples import Cycle, ProcessReading
from gpuslurm.slurm.cgroup_paths import parse_cgroup
from gpuslurm.state.jobmap import JobMap, MappedDevice, write_map
from gpuslurm.watch.attribute import Attributor

GPU_A = "GPU-aaaaaaaa-1111-2222-3333-444455556666"
SLUID = "s6Z5M8CB6N7P00"
OTHER = "sB3XM8CSC8S200"
SCOPE = "system.slice/gpuslurmtest_slurmstepd.scope"
NOBODY = 65534

_WHY = cgroup_unavailable(V2_ROOT)
pytestmark = pytest.mark.skipif(_WHY is not None, reason=str(_WHY))


def _sleeper(env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    return subprocess.Popen(["/bin/sleep", "120"], user=NOBODY, group=NOBODY, extra_groups=[],
                            env=env or {}, cwd="/")


def _map(jobs: Path, job_id: str, sluid: str | None) -> None:
    write_map(JobMap(job_id, "nobody", NOBODY, (MappedDevice(GPU_A, 0),), 1000.0, sluid=sluid), str(jobs))


def test_a_sluid_process_is_its_jobs_through_the_map(tmp_path: Path) -> None:
    """One node with both layouts (an upgrade with jobs running): job 41 in ``job_41``, job 42 in
    ``s<SLUID>``; the scheduler is never asked, since the maps know both."""
    jobs = tmp_path / "jobs"
    _map(jobs, "41", None)
    _map(jobs, "42", SLUID)
    old, new = _sleeper(), _sleeper()

    def ask(sluid: str) -> str | None:
        raise AssertionError(f"scontrol asked for {sluid}")

    try:
        with in_cgroup(V2_ROOT, f"{SCOPE}/job_41/step_0/user/task_0", old.pid), \
                in_cgroup(V2_ROOT, f"{SCOPE}/{SLUID}/step_0/user/task_0", new.pid):
            att = Attributor(job_of_cgroup=parse_cgroup, jobs_dir=str(jobs), sluid_job=ask)
            samples, allocs, problems = att.attribute(time.time(), [
                ProcessReading(old.pid, GPU_A, None, 10.0, None),
                ProcessReading(new.pid, GPU_A, None, 10.0, None)])
    finally:
        stop(old)
        stop(new)
    assert problems == ()
    assert {s.pid: s.job_id for s in samples} == {old.pid: "41", new.pid: "42"}
    view = cycle_view(Cycle(time.time(), "n", (), samples, allocs))
    assert all(why_rogue(s, view) is None for s in samples)


def test_without_a_map_scontrol_names_the_job_once(tmp_path: Path) -> None:
    calls: list[str] = []

    def ask(sluid: str) -> str | None:
        calls.append(sluid)
        return "77"

    proc = _sleeper()
    try:
        with in_cgroup(V2_ROOT, f"{SCOPE}/{OTHER}/step_batch/user/task_0", proc.pid):
            att = Attributor(job_of_cgroup=parse_cgroup,
                             jobs_dir=str(tmp_path / "jobs"), sluid_job=ask, refresh_s=0.0)
            reading = [ProcessReading(proc.pid, GPU_A, None, 10.0, None)]
            first, _, _ = att.attribute(100.0, reading)
            again, _, _ = att.attribute(101.0, reading)
    finally:
        stop(proc)
    assert [s.job_id for s in first + again] == ["77", "77"] and calls == [OTHER]


def test_a_sluid_no_one_knows_is_reported_and_never_rogue(tmp_path: Path) -> None:
    """Decided and documented (docs/monitor.md): a process in a SLUID job cgroup whose job neither
    a map nor scontrol names carries the SLUID as its job, a ``sluid-unknown`` problem every
    cycle, and is never judged rogue (so never killed); the scheduler is asked again only after
    the interval. A process in no job cgroup at all stays "in no job"."""
    calls: list[str] = []

    def ask(sluid: str) -> str | None:
        calls.append(sluid)
        if len(calls) == 1:
            raise CommandError("scontrol timed out", ("scontrol",))
        return None

    proc, outsider = _sleeper(), _sleeper()
    try:
        with in_cgroup(V2_ROOT, f"{SCOPE}/{OTHER}/step_0/user/task_0", proc.pid):
            att = Attributor(job_of_cgroup=parse_cgroup,
                             jobs_dir=str(tmp_path / "jobs"), sluid_job=ask, squeue_interval_s=60.0)
            reading = [ProcessReading(proc.pid, GPU_A, None, 10.0, None),
                       ProcessReading(outsider.pid, GPU_A, None, 10.0, None)]
            samples, allocs, problems = att.attribute(100.0, reading)
            _, _, later = att.attribute(110.0, reading)
            _, _, after = att.attribute(170.0, reading)
    finally:
        stop(proc)
        stop(outsider)
    by_pid = {s.pid: s for s in samples}
    assert by_pid[proc.pid].job_id == OTHER and by_pid[outsider.pid].job_id is None
    assert sorted(p.kind for p in problems) == ["sluid-error", "sluid-unknown"]
    assert [p.kind for p in later] == ["sluid-unknown"] and calls == [OTHER, OTHER]
    assert [p.kind for p in after] == ["sluid-unknown"]
    view = cycle_view(Cycle(100.0, "n", (), samples, allocs))
    assert why_rogue(by_pid[proc.pid], view) is None
    assert why_rogue(by_pid[outsider.pid], view) == "it is in no job"


def test_a_process_claiming_a_sluid_in_its_environment_is_still_in_no_job(tmp_path: Path) -> None:
    """The attacker's account: nobody's process outside every job cgroup sets SLURM_JOB_SLUID,
    SLURM_JOB_ID and SLURM_JOBID to a mapped job's; it stays in no job (rogue)."""
    jobs = tmp_path / "jobs"
    _map(jobs, "42", SLUID)
    liar = _sleeper({"SLURM_JOB_SLUID": SLUID, "SLURM_JOB_ID": "42", "SLURM_JOBID": "42"})
    try:
        att = Attributor(job_of_cgroup=parse_cgroup, jobs_dir=str(jobs), sluid_job=lambda s: "42")
        samples, allocs, _ = att.attribute(time.time(), [ProcessReading(liar.pid, GPU_A, None, 10.0, None)])
    finally:
        stop(liar)
    assert samples[0].job_id is None
    view = cycle_view(Cycle(time.time(), "n", (), samples, allocs))
    assert why_rogue(samples[0], view) == "it is in no job"
