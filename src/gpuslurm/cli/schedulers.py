"""Which scheduler the node's commands ask for its jobs: ``[scheduler] kind`` (see docs/config.md),
and, inside a job, whose job it is (:func:`job_gpus_from_env`)."""

from __future__ import annotations

import os
from collections.abc import Mapping

from gpuslurm.tuples import TYPE_CHECKING  # not typing's: pick imports this module (gpuslurm.tuples)

if TYPE_CHECKING:
    from gpuslurm.config import Config
    from gpuslurm.hw.model.node import Node
    from gpuslurm.state.scheduler import Scheduler


def scheduler_kind(cfg: Config) -> str:
    """``slurm`` or ``pbs``: the configured kind, or for ``auto`` PBS when ``paths.qstat`` runs and
    ``paths.squeue`` does not (a node with both is a Slurm node that has PBS's client installed)."""
    kind: str = cfg.scheduler.kind
    if kind != "auto":
        return kind
    if os.access(cfg.paths.qstat, os.X_OK) and not os.access(cfg.paths.squeue, os.X_OK):
        return "pbs"
    return "slurm"


def scheduler_for(cfg: Config, timeout: float) -> Scheduler:
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


# Every adapter with the variable its jobs' environment always holds, in the order they are asked
# (Slurm first: a Slurm job on a node with PBS's client keeps SLURM_JOB_ID). An adapter is imported
# only when its variable is set: pick runs inside every job and outside any.
JOB_ENV_ADAPTERS = (("SLURM_JOB_ID", "gpuslurm.slurm.adapter", "SlurmScheduler"),
                    ("PBS_JOBID", "gpuslurm.pbs.scheduler", "PbsScheduler"))


def job_gpus_from_env(environ: Mapping[str, str], node: Node) -> tuple[str, ...] | None:
    """The UUIDs a process with ``environ`` may use, from the first adapter whose job it is in
    (:meth:`gpuslurm.state.scheduler.Scheduler.job_gpus_from_env`); None outside any job."""
    import importlib

    for variable, module, name in JOB_ENV_ADAPTERS:
        if not environ.get(variable, "").strip():
            continue
        adapter: Scheduler = getattr(importlib.import_module(module), name)()
        if (found := adapter.job_gpus_from_env(environ, node)) is not None:
            return found
    return None
