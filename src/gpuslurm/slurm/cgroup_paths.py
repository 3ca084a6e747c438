"""Which Slurm job a cgroup path names: Slurm's cgroup layouts, every release the project runs.

Pure text parsing of ``/proc/PID/cgroup`` lines and cgroup paths; nothing here touches the system.
The Slurm adapter answers :meth:`gpuslurm.state.scheduler.Scheduler.job_of_cgroup` with it.

- cgroup v1: ``/slurm[_<node>]/uid_<uid>/job_<id>/step_<step>`` in each controller.
- cgroup v2: ``/<slice>/[<node>_]slurmstepd.scope/job_<id>/step_<step>`` (``<slice>`` is
  cgroup.conf's ``CgroupSlice``, 25.11+, default ``system.slice``). From 26.05 the job directory is
  named by the job's SLUID, ``/<slice>/[<node>_]slurmstepd.scope/s<SLUID>/step_<step>``, unless
  cgroup.conf says ``CgroupJobIdPaths=yes`` (26.05.2+); such a path carries no job id:
  :class:`~gpuslurm.state.cgroup.CgroupJob` then has ``sluid`` set and ``job_id`` None, and the
  caller maps the SLUID to its job (the prolog's job maps, then ``scontrol``), never through
  anything the job's processes could set.
- gpuslurm's own job cgroups (:func:`gpuslurm.state.cgroup.job_of_path`) count as their job's.

Only the first Slurm directory from the top counts: below a job's step Slurm delegates the subtree
to the job, whose user may name directories there as they like.
"""

from __future__ import annotations

from collections.abc import Sequence

from gpuslurm.jobid import valid_job_id, valid_sluid
from gpuslurm.state.cgroup import CgroupJob, job_of_file, job_of_path, user_unit


def parse_cgroup_path(path: str) -> CgroupJob | None:
    """The job a single cgroup path names, or None when it is not inside a Slurm job (or one of
    gpuslurm's own job cgroups)."""
    return job_of_path(path, _layout)


def parse_cgroup(text: str) -> CgroupJob | None:
    """The job a ``/proc/PID/cgroup`` text puts the process in, or None
    (:func:`gpuslurm.state.cgroup.job_of_file`)."""
    return job_of_file(text, parse_cgroup_path)


def _layout(parts: Sequence[str]) -> CgroupJob | None:
    for i, part in enumerate(parts):
        if user_unit(part):
            return None
        if part == "slurm" or part.startswith("slurm_"):
            node = part[6:] or None
            rest = parts[i + 1:]
            uid: int | None = None
            if rest and rest[0].startswith("uid_"):
                if not (rest[0][4:].isascii() and rest[0][4:].isdigit() and len(rest[0]) <= 14):
                    return None
                uid = int(rest[0][4:])
                rest = rest[1:]
            return _job(rest, uid, node)
        if part.endswith("slurmstepd.scope"):
            prefix = part[: -len("slurmstepd.scope")]
            node = prefix[:-1] if prefix.endswith("_") and len(prefix) > 1 else None
            if prefix and node is None:
                continue  # some other unit whose name merely ends that way
            return _job(parts[i + 1:], None, node, by_sluid=True)
    return None


def _job(rest: Sequence[str], uid: int | None, node: str | None, *,
         by_sluid: bool = False) -> CgroupJob | None:
    """``job_<id>[/step_<step>]``, or with ``by_sluid`` (cgroup v2) also ``s<SLUID>[/step_<step>]``."""
    if not rest:
        return None
    step = rest[1][5:] if len(rest) > 1 and rest[1].startswith("step_") else None
    if by_sluid and valid_sluid(rest[0]):
        return CgroupJob(None, step or None, uid, node, sluid=rest[0])
    if not rest[0].startswith("job_"):
        return None
    job_id = rest[0][4:]
    if not (job_id.isascii() and job_id.isdigit() and valid_job_id(job_id)):  # Slurm's cgroups: digits
        return None
    return CgroupJob(job_id, step or None, uid, node)
