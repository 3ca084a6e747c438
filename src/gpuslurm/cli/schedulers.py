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


def build_scheduler(cfg: Any, warn: Callable[[str], None] | None = None) -> Any:
    """The Scheduler adapter for this node, or None when its job-listing command is missing (the
    monitor then attributes from the job maps alone; ``warn`` says so)."""
    timeout = cfg.monitor.command_timeout_s
    if scheduler_kind(cfg) == "pbs":
        from gpuslurm.pbs.scheduler import PbsScheduler

        p = cfg.paths
        sched: Any = PbsScheduler(qstat=p.qstat, pbsnodes=p.pbsnodes, timeout=timeout, jobs_dir=p.jobs_dir,
                                  qalter=p.qalter, qhold=p.qhold, qrerun=p.qrerun, qdel=p.qdel)
        command = p.qstat
    else:
        from gpuslurm.slurm.adapter import SlurmScheduler

        sched = SlurmScheduler(squeue=cfg.paths.squeue, scontrol=cfg.paths.scontrol, timeout=timeout,
                               scancel=cfg.paths.scancel, gpu_out=cfg.gpu_out)
        command = cfg.paths.squeue
    if not sched.can_list_jobs():
        if warn is not None:
            warn(f"{command} is missing: jobs without a job map stay unattributed to GPUs")
        return None
    return sched
