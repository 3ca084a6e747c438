"""Which job a cgroup path names, as far as no scheduler is concerned: the neutral value
(:class:`CgroupJob`), gpuslurm's own job cgroups, and the choice among a ``/proc/PID/cgroup`` file's
lines. Each scheduler's own layout is its adapter's (:mod:`gpuslurm.slurm.cgroup_paths`,
:mod:`gpuslurm.pbs.cgroup_paths`), reached through
:meth:`gpuslurm.state.scheduler.Scheduler.job_of_cgroup`; the monitor's attribution and the job-end
step's leftovers read it.

Pure text parsing; nothing here touches the system.

- gpuslurm's own job cgroups (``gpuslurm.isolate.cgroup_v1``/``cgroup_v2``): v1 ``/gpuslurm/job_<id>``
  in the devices hierarchy, v2 ``/gpuslurm.pbs/job_<id>`` (jobs of a scheduler that makes none); a
  job's MPS daemon's, v1 ``/gpuslurm/mps_<id>``, v2 ``/gpuslurm.mps/mps_<id>``: its job's too. Only
  root makes them, and only at a hierarchy's top.
- A scheduler's layout is searched only above any ``user.slice`` or ``user@<uid>.service`` part
  (:func:`user_unit`): systemd lets users make cgroups there, so no scheduler's job lives below.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import NamedTuple

from gpuslurm.jobid import valid_job_id

# gpuslurm's own cgroups (gpuslurm.isolate.cgroup_v1/cgroup_v2 make them; root alone): the directory at the
# top of a hierarchy → the kinds of job cgroup below it. ``job_<id>``: the job's tasks; ``mps_<id>``:
# the job's MPS daemon alone, the job's as much as its tasks.
_OWN = {"gpuslurm": ("job", "mps"), "gpuslurm.pbs": ("job",), "gpuslurm.mps": ("mps",)}


class CgroupJob(NamedTuple):
    """A job named by a cgroup path: by its id, or (Slurm 26.05's cgroup/v2 layout) by its SLUID
    alone; exactly one of ``job_id`` and ``sluid`` is set."""

    job_id: str | None
    step: str | None = None  # "0", "batch", "extern", "interactive", …
    uid: int | None = None  # cgroup v1 paths carry it
    node: str | None = None  # the ``slurm_<node>`` / ``<node>_slurmstepd.scope`` prefix, if any
    sluid: str | None = None  # ``s<13 digits>`` when the path names the job by SLUID

    @property
    def label(self) -> str:
        """The job id, or the SLUID when the path names no id: for messages and comparisons."""
        return self.job_id if self.job_id is not None else str(self.sluid)


# One scheduler's layout: a cgroup path's parts (``path.split("/")``) → the job they name, or None.
Layout = Callable[[Sequence[str]], "CgroupJob | None"]


def user_unit(part: str) -> bool:
    """Whether ``part`` is a systemd unit whose subtree users may shape (no scheduler's job below)."""
    return part == "user.slice" or part.startswith("user@")


def job_of_path(path: str, layout: Layout) -> CgroupJob | None:
    """The job a single cgroup path names: gpuslurm's own job cgroup at the hierarchy's top, else
    what the scheduler's ``layout`` reads; None when it is inside no job."""
    parts = path.split("/")
    if len(parts) > 1 and parts[1] in _OWN:
        kind, sep, job = parts[2].partition("_") if len(parts) > 2 else ("", "", "")
        return CgroupJob(job) if sep and kind in _OWN[parts[1]] and valid_job_id(job) else None
    return layout(parts)


def job_of_file(text: str, path_job: Callable[[str], CgroupJob | None]) -> CgroupJob | None:
    """The job a ``/proc/PID/cgroup`` text puts the process in, each line's path read by
    ``path_job``, or None.

    The unified line (``0::``) and the freezer hierarchy (Slurm's v1 process tracking) are
    preferred; otherwise the first hierarchy that names a job.
    """
    found: CgroupJob | None = None
    for line in text.splitlines():
        hier, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        job = path_job(path)
        if job is None:
            continue
        if hier == "0" or "freezer" in controllers.split(","):
            return job
        if found is None:
            found = job
    return found


def own_job_of_cgroup(text: str) -> CgroupJob | None:
    """The job a ``/proc/PID/cgroup`` text names through gpuslurm's own job cgroups alone, for
    a caller that knows no scheduler (a replayed node)."""
    return job_of_file(text, lambda path: job_of_path(path, _no_layout))


def _no_layout(parts: Sequence[str]) -> None:
    return None
