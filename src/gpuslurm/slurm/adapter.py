"""Slurm behind :class:`gpuslurm.state.scheduler.Scheduler`: squeue for the jobs on a node, scontrol to
drain and resume it. The one squeue wrapper the monitor and the live view share."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the hooks build this adapter on every job: keep its imports to os
    from collections.abc import Mapping

    from gpuslurm.config import Config, GpuOutConfig
    from gpuslurm.hw.model import Node
    from gpuslurm.samples import Allocation
    from gpuslurm.state.job import HookJob
    from gpuslurm.state.out_of_service import OutOfService


class SlurmScheduler:
    """Slurm's commands at ``squeue`` and ``scontrol``, each bounded by ``timeout`` seconds."""

    name = "slurm"

    def __init__(self, *, squeue: str, scontrol: str, timeout: float,
                 scancel: str = "/usr/bin/scancel", sacctmgr: str = "/usr/bin/sacctmgr",
                 gpu_out: GpuOutConfig | None = None) -> None:
        self.gpu_out = gpu_out
        self.squeue = squeue
        self.scontrol = scontrol
        self.scancel = scancel
        self.sacctmgr = sacctmgr
        self.timeout = timeout

    @classmethod
    def from_config(cls, cfg: Config) -> SlurmScheduler:
        """The commands ``[paths]`` names, bounded by ``[hooks] command_timeout_s``."""
        p = cfg.paths
        return cls(squeue=p.squeue, scontrol=p.scontrol, scancel=p.scancel, sacctmgr=p.sacctmgr,
                   timeout=cfg.hooks.command_timeout_s, gpu_out=cfg.gpu_out)

    def can_list_jobs(self) -> bool:
        """Whether squeue is there to run (the monitor falls back to the job maps alone)."""
        return os.access(self.squeue, os.X_OK)

    def node_allocations(self, node_name: str, node: Node) -> tuple[Allocation, ...]:
        from gpuslurm.samples import Allocation
        from gpuslurm.slurm.squeue import node_allocations

        found = node_allocations(self.squeue, node_name, node, timeout=self.timeout)
        return tuple(Allocation(j.job.job_id, j.job.user, j.job.uid, j.uuids, j.job.start, j.job.account,
                                source="squeue") for j in found)

    def job_cgroup_v2(self, job: HookJob, cfg: Config) -> tuple[str, ...]:
        """The job's directory under slurmd's cgroup/v2 stepd scope, or every place slurmstepd may
        make it (:mod:`gpuslurm.slurm.cgroup_v2`); HardwareError naming what was looked for."""
        from gpuslurm.slurm.cgroup_v2 import job_cgroup

        return job_cgroup(cfg, job.node_name, job.job_id, job.sluid).paths

    def existing_job_cgroup_v2(self, job: HookJob, cfg: Config) -> tuple[str, ...]:
        """Those of the job's directories that exist (the epilog removes the empty ones)."""
        from gpuslurm.slurm.cgroup_v2 import existing_job_cgroup_dirs

        return existing_job_cgroup_dirs(cfg, job.node_name, job.job_id, job.sluid)

    def job_of_sluid(self, sluid: str) -> str | None:
        """The id of the job Slurm names ``sluid`` (26.05: ``scontrol show -d job s<SLUID>``); None
        when slurmctld knows none. CommandError when scontrol fails to run."""
        from gpuslurm.slurm.sluid import job_of_sluid

        return job_of_sluid(sluid, scontrol=self.scontrol, timeout=self.timeout)

    def drain_node(self, node_name: str, reason: str) -> None:
        from gpuslurm.slurm.scontrol import drain_node

        drain_node(node_name, reason, scontrol=self.scontrol, timeout=self.timeout)

    def resume_node(self, node_name: str) -> None:
        from gpuslurm.slurm.scontrol import resume_node

        resume_node(node_name, scontrol=self.scontrol, timeout=self.timeout)

    def requeue_job(self, job_id: str, reason: str) -> str:
        from gpuslurm.slurm.scontrol import requeue_job

        return requeue_job(job_id, reason, scontrol=self.scontrol, scancel=self.scancel, timeout=self.timeout)

    def refuse_job(self, job_id: str, reason: str) -> str:
        from gpuslurm.slurm.scontrol import refuse_job

        return refuse_job(job_id, reason, scontrol=self.scontrol, scancel=self.scancel, timeout=self.timeout)

    def set_admin_comment(self, job_id: str, text: str) -> None:
        from gpuslurm.slurm.scontrol import set_admin_comment

        set_admin_comment(job_id, text, scontrol=self.scontrol, timeout=self.timeout)

    def apply_gpus_out(self, node_name: str, node: Node, out: Mapping[str, OutOfService]) -> str:
        """Holder jobs on the GPUs out of service (:mod:`gpuslurm.slurm.gpu_out`), per ``[gpu_out]``."""
        from gpuslurm.config import GpuOutConfig
        from gpuslurm.slurm.gpu_out import GpuOutOptions, reconcile

        cfg = self.gpu_out or GpuOutConfig()
        opts = GpuOutOptions(node_name, scontrol=self.scontrol, squeue=self.squeue, sbatch=cfg.sbatch,
                             scancel=self.scancel, timeout_s=self.timeout, holder_mem_mib=cfg.holder_mem_mib,
                             job_on_gpu=cfg.job_on_gpu)
        return reconcile(node, out, opts)

    def set_final_comment(self, job_id: str, text: str) -> str:
        """The job's AdminComment as it ends; slurmctld refuses a finished job's (22.05), so then
        its record in slurmdbd, where there is one. What happened, for the log."""
        from gpuslurm.errors import GpuslurmError
        from gpuslurm.slurm.scontrol import (
            refused_as_finished,
            set_accounting_admin_comment,
            set_admin_comment,
        )

        try:
            set_admin_comment(job_id, text, scontrol=self.scontrol, timeout=self.timeout)
            return f"AdminComment: {text}"
        except GpuslurmError as exc:
            if not refused_as_finished(exc):
                raise
        stands = "Slurm does not update a finished job: the monitor's last AdminComment stands"
        if not os.access(self.sacctmgr, os.X_OK):
            return stands
        if set_accounting_admin_comment(job_id, text, sacctmgr=self.sacctmgr, timeout=self.timeout):
            return f"AdminComment (in slurmdbd, the job has finished): {text}"
        return stands  # no slurmdbd: slurmctld's copy is all there is
