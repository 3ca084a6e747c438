"""What PBS says about a job's cgroups, GPUs and details, shared by both PBS implementations of
:class:`gpuslurm.state.scheduler.Scheduler`; light (the hooks import it on every job)."""

from __future__ import annotations

from gpuslurm.tuples import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Mapping

    from gpuslurm.config import Config
    from gpuslurm.hw.model.node import Node
    from gpuslurm.state.cgroup import CgroupJob
    from gpuslurm.state.job import HookJob
    from gpuslurm.state.running import JobDetail


class PbsJobFacts:
    """What both PBS implementations of :class:`gpuslurm.state.scheduler.Scheduler` (PBS's commands
    here, :class:`gpuslurm.pbs.answer.PbsHookActions` inside a hook) say about a job's cgroups, GPUs
    and details, where PBS has no such thing itself."""

    def running_job_details(self, node_name: str) -> tuple[JobDetail, ...] | None:
        """None: PBS details no job's CPUs per node (placement reads Slurm's ``scontrol -d``)."""
        return None

    title = "PBS"

    def job_of_cgroup(self, cgroup_text: str) -> CgroupJob | None:
        """The PBS job (its cgroups hook's, or gpuslurm's own job cgroup) ``cgroup_text`` names
        (:mod:`gpuslurm.pbs.cgroup_paths`); None without the cgroups hook (the job's session tells)."""
        from gpuslurm.pbs.cgroup_paths import parse_cgroup

        return parse_cgroup(cgroup_text)

    def job_of_sluid(self, sluid: str) -> str | None:
        """None: PBS names no job by a SLUID (Slurm 26.05's)."""
        return None

    def job_gpus_from_env(self, environ: Mapping[str, str], node: Node) -> tuple[str, ...] | None:
        """Inside a PBS job (``PBS_JOBID`` set): ``GPUSLURM_GPU_UUIDS`` from gpuslurm's
        execjob_launch, else none (PBS counts GPUs, it does not name them). None outside one."""
        if not environ.get("PBS_JOBID", "").strip():
            return None
        named = environ.get("GPUSLURM_GPU_UUIDS", "").strip()
        return tuple(u.strip() for u in named.split(",") if u.strip())

    def job_cgroup_v2(self, job: HookJob, cfg: Config) -> None:
        """None: PBS makes its jobs no cgroup v2 directory gpuslurm could attach to; gpuslurm makes
        the job its own (:func:`gpuslurm.isolate.cgroup_v2.v2_pbs_dir`)."""
        return None

    def existing_job_cgroup_v2(self, job: HookJob, cfg: Config) -> tuple[str, ...]:
        """None of PBS's: the job-end step removes gpuslurm's own directory itself."""
        return ()

    def devices_cgroup_v1_dirs(self, job: HookJob) -> tuple[str, ...]:
        """PBS's cgroups hook's job cgroup (``pbs_jobs.service/jobid/<id>``, the default
        ``cgroup_prefix``; PBS Professional before 19: ``pbspro/<id>``); none for an id that is not
        PBS's (PBS ids name their server)."""
        from gpuslurm.jobid import valid_job_id

        if not valid_job_id(job.job_id) or "." not in job.job_id:
            return ()
        return (f"pbs_jobs.service/jobid/{job.job_id}", f"pbspro/{job.job_id}")
