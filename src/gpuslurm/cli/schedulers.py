"""Which scheduler the node's commands ask for its jobs: ``[scheduler] kind`` (see docs/config.md)."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any


def scheduler_kind(cfg: Any) -> str:
    """``slurm`` or ``pbs``: the configured kind, or for ``auto`` PBS when ``paths.qstat`` runs and
    ``paths.squeue`` does not (a node with both is a Slurm node that has PBS's client installed)."""
    kind: str = cfg.scheduler.kind
    if kind != "auto":
        return kind
    if os.access(cfg.paths.qstat, os.X_OK) and not os.access(cfg.paths.squeue, os.X_OK):
        return "pbs"
    return "slurm"


def scheduler_for(cfg: Any, timeout: float) -> Any:
    """The Scheduler adapter of ``[scheduler] kind``, its commands bounded by ``timeout`` seconds."""
    if scheduler_kind(cfg) == "pbs":
        from gpuslurm.pbs.scheduler import PbsScheduler

        p = cfg.paths
        return PbsScheduler(qstat=p.qstat, pbsnodes=p.pbsnodes, timeout=timeout, jobs_dir=p.jobs_dir,
                            qalter=p.qalter, qhold=p.qhold, qrerun=p.qrerun, qdel=p.qdel, qmgr=p.qmgr,
                            gpu_out=cfg.gpu_out)
    from gpuslurm.slurm.adapter import SlurmScheduler

    return SlurmScheduler(squeue=cfg.paths.squeue, scontrol=cfg.paths.scontrol, timeout=timeout,
                          scancel=cfg.paths.scancel, gpu_out=cfg.gpu_out)


def action_command(cfg: Any) -> str:
    """The program the scheduler's node actions need (scontrol, or qmgr for PBS)."""
    return str(cfg.paths.qmgr if scheduler_kind(cfg) == "pbs" else cfg.paths.scontrol)


def build_scheduler(cfg: Any, warn: Callable[[str], None] | None = None) -> Any:
    """The Scheduler adapter for this node, or None when its job-listing command is missing (the
    monitor then attributes from the job maps alone; ``warn`` says so)."""
    sched = scheduler_for(cfg, cfg.monitor.command_timeout_s)
    command = cfg.paths.qstat if sched.name == "pbs" else cfg.paths.squeue
    if not sched.can_list_jobs():
        if warn is not None:
            warn(f"{command} is missing: jobs without a job map stay unattributed to GPUs")
        return None
    return sched
