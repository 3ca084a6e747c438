"""Slurm behind :class:`gpuslurm.state.scheduler.Scheduler`: squeue for the jobs on a node, scontrol to
drain and resume it. The one squeue wrapper the monitor and the live view share."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from gpuslurm.samples import Allocation

if TYPE_CHECKING:
    from collections.abc import Mapping

    from gpuslurm.config import GpuOutConfig
    from gpuslurm.hw.model import Node
    from gpuslurm.state.out_of_service import OutOfService


class SlurmScheduler:
    """Slurm's commands at ``squeue`` and ``scontrol``, each bounded by ``timeout`` seconds."""

    name = "slurm"

    def __init__(self, *, squeue: str, scontrol: str, timeout: float,
                 scancel: str = "/usr/bin/scancel", gpu_out: GpuOutConfig | None = None) -> None:
        self.gpu_out = gpu_out
        self.squeue = squeue
        self.scontrol = scontrol
        self.scancel = scancel
        self.timeout = timeout

    def can_list_jobs(self) -> bool:
        """Whether squeue is there to run (the monitor falls back to the job maps alone)."""
        return os.access(self.squeue, os.X_OK)

    def node_allocations(self, node_name: str, node: Node) -> tuple[Allocation, ...]:
        from gpuslurm.slurm.squeue import node_allocations

        found = node_allocations(self.squeue, node_name, node, timeout=self.timeout)
        return tuple(Allocation(j.job.job_id, j.job.user, j.job.uid, j.uuids, j.job.start, j.job.account,
                                source="squeue") for j in found)

    def drain_node(self, node_name: str, reason: str) -> None:
        from gpuslurm.slurm.scontrol import drain_node

        drain_node(node_name, reason, scontrol=self.scontrol, timeout=self.timeout)

    def resume_node(self, node_name: str) -> None:
        from gpuslurm.slurm.scontrol import resume_node

        resume_node(node_name, scontrol=self.scontrol, timeout=self.timeout)

    def refuse_job(self, job_id: str, reason: str) -> str:
        from gpuslurm.slurm.scontrol import refuse_job

        return refuse_job(job_id, reason, scontrol=self.scontrol, scancel=self.scancel, timeout=self.timeout)

    def set_admin_comment(self, job_id: str, text: str) -> None:
        from gpuslurm.slurm.scontrol import set_admin_comment

        set_admin_comment(job_id, text, scontrol=self.scontrol, timeout=self.timeout)

    def apply_gpus_out(self, node_name: str, node: Node, out: Mapping[str, OutOfService]) -> str:
        """The graceful path of :mod:`gpuslurm.slurm.gpu_out`, configured by ``[gpu_out]``."""
        from pathlib import Path

        from gpuslurm.config import GpuOutConfig
        from gpuslurm.gres.records import GresOptions
        from gpuslurm.slurm.gpu_out import GpuOutOptions, reconcile

        cfg = self.gpu_out or GpuOutConfig()
        gres = GresOptions(node_name=node_name if cfg.gres_node_name else None, mps=cfg.mps or None,
                           shard=cfg.shard or None, links=cfg.links, dev_root=cfg.dev_root)
        opts = GpuOutOptions(node_name, scontrol=self.scontrol, squeue=self.squeue,
                             gres_conf=Path(cfg.gres_conf) if cfg.gres_conf else None,
                             slurm_conf=Path(cfg.slurm_conf) if cfg.slurm_conf else None, gres=gres,
                             timeout_s=self.timeout)
        return reconcile(node, out, opts)
