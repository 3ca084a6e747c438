"""Each adapter's cgroup layout on hostile text (pure): a job only in its own scheduler's form or
gpuslurm's own job cgroups, never from below a user's systemd unit, and ``/proc/PID/cgroup`` texts
read line by line through the same layout."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from tests.helpers.props_hostile import mutated

from gpuslurm.jobid import valid_job_id, valid_sluid
from gpuslurm.pbs import cgroup_paths as pbs
from gpuslurm.slurm import cgroup_paths as slurm
from gpuslurm.state.cgroup import job_of_file, job_of_path

PARSER = settings(max_examples=300)
REAL = ("/slurm_vm/uid_0/job_1/step_batch", "/system.slice/vm_slurmstepd.scope/job_1/step_batch/user/task_0",
        "/system.slice/vm_slurmstepd.scope/s90XM8DGXCJ300/step_batch/user/task_0",
        "/pbs_jobs.service/jobid/5.pbshost", "/gpuslurm.mps/mps_5.pbshost", "/gpuslurm/job_7")
paths = st.one_of(st.sampled_from(REAL).flatmap(lambda real: mutated(real, edits=3)), st.text(max_size=80))


def _own(path: str) -> object:
    return job_of_path(path, lambda parts: None)


@PARSER
@given(paths)
def test_each_layout_names_its_own_schedulers_form_or_gpuslurms(path: str) -> None:
    own = _own(path)
    for layout in (slurm, pbs):
        job = layout.parse_cgroup_path(path)
        if job is None:
            continue
        assert (job.job_id is None) != (job.sluid is None)
        if own is not None:  # gpuslurm's own cgroup at the top: the same job in every layout
            assert job == own
            continue
        if layout is slurm:
            assert (job.sluid is not None and valid_sluid(job.sluid)) or \
                (str(job.job_id).isdigit() and valid_job_id(str(job.job_id)))
        else:
            assert job.sluid is None and "." in str(job.job_id) and valid_job_id(str(job.job_id))


@PARSER
@given(paths, st.sampled_from(["user.slice", "user@1000.service"]))
def test_no_layout_names_a_job_below_a_users_own_unit(path: str, unit: str) -> None:
    """systemd lets a user shape the cgroups below these: nothing there is any scheduler's job."""
    below = f"/{unit}{path if path.startswith('/') else '/' + path}"
    for layout in (slurm, pbs):
        assert layout.parse_cgroup_path(below) is None, below


@PARSER
@given(st.lists(st.tuples(st.sampled_from(["0", "4", "6", "12"]), st.sampled_from(["", "memory", "freezer"]),
                          paths), max_size=5))
def test_a_cgroup_file_names_one_of_its_lines_jobs(lines: list[tuple[str, str, str]]) -> None:
    kept = [f"{h}:{c}:{p}" for h, c, p in lines]
    text = "".join(f"{line}\n" for line in kept if line.splitlines() == [line])
    for layout in (slurm, pbs):
        job = layout.parse_cgroup(text)
        assert job == job_of_file(text, layout.parse_cgroup_path)
        named = [layout.parse_cgroup_path(line.split(":", 2)[2]) for line in text.splitlines()]
        assert all(line.count(":") >= 2 for line in text.splitlines())
        assert (job is None and not any(named)) or job in named
