"""Which Slurm or PBS job a cgroup path names: the monitor's attribution and the epilog's leftovers
read it.

Pure text parsing of ``/proc/PID/cgroup`` lines and cgroup paths; nothing here touches the system.

- Slurm: v1 ``/slurm[_<node>]/uid_<uid>/job_<id>/step_<step>``, v2
  ``/<slice>/[<node>_]slurmstepd.scope/job_<id>/step_<step>`` (``<slice>`` is cgroup.conf's
  ``CgroupSlice``, 25.11+, default ``system.slice``). From 26.05 the v2 job directory is named by
  the job's SLUID, ``/<slice>/[<node>_]slurmstepd.scope/s<SLUID>/step_<step>``, unless cgroup.conf
  says ``CgroupJobIdPaths=yes`` (26.05.2+); such a path carries no job id: :class:`CgroupJob` then
  has ``sluid`` set and ``job_id`` None, and the caller maps the SLUID to its job (the prolog's
  job maps, then ``scontrol``), never through anything the job's processes could set.
- PBS (OpenPBS's cgroups hook, ``src/hooks/cgroups/pbs_cgroups.PY``): ``/<prefix>.service/jobid/<id>``
  in each v1 controller (and the unified v2 tree of PBS Professional 2022+), ``<prefix>`` being the
  hook's ``cgroup_prefix`` (default ``pbs_jobs``); PBS Pro before 19 used ``/pbspro/<id>``. The id
  is a full PBS id (``123.server``, ``123[4].server``).
- gpuslurm's own job cgroups (``gpuslurm.isolate.cgroup_v1``/``cgroup_v2``): v1 ``/gpuslurm/job_<id>`` in the
  devices hierarchy, v2 ``/gpuslurm.pbs/job_<id>`` (PBS jobs); a job's MPS daemon's, v1
  ``/gpuslurm/mps_<id>``, v2 ``/gpuslurm.mps/mps_<id>``: its job's too. Only root makes them.
"""

from __future__ import annotations

from typing import NamedTuple

from gpuslurm.jobid import valid_job_id, valid_sluid

# gpuslurm's own cgroups (gpuslurm.isolate.cgroup_v1/cgroup_v2 make them; root alone): the directory at the
# top of a hierarchy → the kinds of job cgroup below it. ``job_<id>``: the job's tasks; ``mps_<id>``:
# the job's MPS daemon alone, the job's as much as its tasks.
_OWN = {"gpuslurm": ("job", "mps"), "gpuslurm.pbs": ("job",), "gpuslurm.mps": ("mps",)}


class CgroupJob(NamedTuple):
    """A Slurm or PBS job named by a cgroup path: by its id, or (Slurm 26.05's cgroup/v2 layout)
    by its SLUID alone; exactly one of ``job_id`` and ``sluid`` is set."""

    job_id: str | None
    step: str | None = None  # "0", "batch", "extern", "interactive", …
    uid: int | None = None  # cgroup v1 paths carry it
    node: str | None = None  # the ``slurm_<node>`` / ``<node>_slurmstepd.scope`` prefix, if any
    sluid: str | None = None  # ``s<13 digits>`` when the path names the job by SLUID

    @property
    def label(self) -> str:
        """The job id, or the SLUID when the path names no id: for messages and comparisons."""
        return self.job_id if self.job_id is not None else str(self.sluid)


def parse_cgroup_path(path: str) -> CgroupJob | None:
    """The job a single cgroup path names, or None when it is not inside a Slurm or PBS job."""
    parts = path.split("/")
    for i, part in enumerate(parts):
        if part == "user.slice" or part.startswith("user@"):
            return None  # systemd lets users make cgroups here: no scheduler's job lives below
        if (part.endswith(".service") and len(part) > 8 and parts[i + 1:i + 2] == ["jobid"]) \
                or part == "pbspro":
            rest = parts[i + 2:] if part != "pbspro" else parts[i + 1:]
            return _pbs_job(rest)
        if part in _OWN and i == 1:  # at the hierarchy's top only
            rest = parts[i + 1:]
            kind, sep, job = rest[0].partition("_") if rest else ("", "", "")
            return CgroupJob(job) if sep and kind in _OWN[part] and valid_job_id(job) else None
        if part == "slurm" or part.startswith("slurm_"):
            node = part[6:] or None
            rest = parts[i + 1:]
            uid: int | None = None
            if rest and rest[0].startswith("uid_"):
                if not rest[0][4:].isdigit():
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


def _job(rest: list[str], uid: int | None, node: str | None, *, by_sluid: bool = False) -> CgroupJob | None:
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


def _pbs_job(rest: list[str]) -> CgroupJob | None:
    if not rest or "." not in rest[0] or not valid_job_id(rest[0]):
        return None
    return CgroupJob(rest[0])


def parse_cgroup(text: str) -> CgroupJob | None:
    """The job a ``/proc/PID/cgroup`` text puts the process in, or None.

    The unified line (``0::``) and the freezer hierarchy (Slurm's v1 process tracking) are
    preferred; otherwise the first hierarchy that names a job.
    """
    found: CgroupJob | None = None
    for line in text.splitlines():
        hier, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        job = parse_cgroup_path(path)
        if job is None:
            continue
        if hier == "0" or "freezer" in controllers.split(","):
            return job
        if found is None:
            found = job
    return found
