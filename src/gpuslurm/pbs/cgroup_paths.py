"""Which PBS job a cgroup path names: the layouts of PBS's cgroups hook.

Pure text parsing of ``/proc/PID/cgroup`` lines and cgroup paths; nothing here touches the system.
The PBS adapters answer :meth:`gpuslurm.state.scheduler.Scheduler.job_of_cgroup` with it.

- OpenPBS's cgroups hook (``src/hooks/cgroups/pbs_cgroups.PY``): ``/<prefix>.service/jobid/<id>``
  in each v1 controller (and the unified v2 tree of PBS Professional 2022+), ``<prefix>`` being the
  hook's ``cgroup_prefix`` (default ``pbs_jobs``); PBS Pro before 19 used ``/pbspro/<id>``. The id
  is a full PBS id (``123.server``, ``123[4].server``).
- gpuslurm's own job cgroups (:func:`gpuslurm.state.cgroup.job_of_path`: ``/gpuslurm.pbs/job_<id>``
  where PBS makes none) count as their job's.

Without the cgroups hook a PBS job's processes are in no cgroup of PBS's: they are told by their
session (:meth:`gpuslurm.pbs.scheduler.PbsScheduler.sessions`).
"""

from __future__ import annotations

from collections.abc import Sequence

from gpuslurm.jobid import valid_job_id
from gpuslurm.state.cgroup import CgroupJob, job_of_file, job_of_path, user_unit


def parse_cgroup_path(path: str) -> CgroupJob | None:
    """The job a single cgroup path names, or None when it is not inside a PBS job (or one of
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
        if part == "pbspro":
            return _job(parts[i + 1:])
        if part.endswith(".service") and len(part) > 8 and parts[i + 1:i + 2] == ["jobid"]:
            return _job(parts[i + 2:])
    return None


def _job(rest: Sequence[str]) -> CgroupJob | None:
    if not rest or "." not in rest[0] or not valid_job_id(rest[0]):
        return None
    return CgroupJob(rest[0])
