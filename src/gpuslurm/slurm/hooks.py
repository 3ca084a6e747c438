"""Slurm's Prolog, Epilog and TaskProlog: Slurm's hook environment in, the neutral steps run.

Each turns the environment slurmd gives it into a :class:`gpuslurm.state.job.HookJob`
(:func:`gpuslurm.slurm.hookenv.hook_job`), loads the hooks' config, and runs the step of
:mod:`gpuslurm.hooks` with Slurm's actions (:class:`gpuslurm.slurm.adapter.SlurmScheduler`:
``scontrol`` drain, requeue-hold, AdminComment). The exit code is Slurm's: 0 lets the job run; any
other Prolog exit drains the node and requeues the job (the failure policy is in
:mod:`gpuslurm.hooks.prolog`). Slurm 22.05 passes hooks only its own variables: the config and a
replayed bundle come from ``GPUSLURM_CONFIG`` / ``GPUSLURM_CAPTURE`` baked into the executables
``gpuslurm install`` writes.
"""

from __future__ import annotations

import time
from collections.abc import Mapping

from gpuslurm.hooks.log import HookLog, guarded
from gpuslurm.tuples import TYPE_CHECKING

if TYPE_CHECKING:
    from typing import TextIO

    from gpuslurm.config import Config
    from gpuslurm.hw.source import HardwareSource
    from gpuslurm.slurm.adapter import SlurmScheduler
    from gpuslurm.state.job import HookJob


def run_prolog(environ: Mapping[str, str], log: HookLog | None = None) -> int:
    """The Prolog: 0 ok, 1 drained for a health fault, else an error's code."""
    log = log or HookLog("prolog")

    def step() -> int:
        from gpuslurm.hooks.prolog import job_start

        job, cfg, scheduler = _setup(environ, log)
        return job_start(job, scheduler, cfg, log, _source(environ, cfg))

    return guarded(log, step)


def run_epilog(environ: Mapping[str, str], log: HookLog | None = None,
               now: float | None = None) -> int:
    """The Epilog: 0 unless a drain was needed and failed."""
    log = log or HookLog("epilog")

    def step() -> int:
        from gpuslurm.hooks.epilog import job_end

        job, cfg, scheduler = _setup(environ, log)
        return job_end(job, scheduler, cfg, log, _source(environ, cfg),
                       time.time() if now is None else now)

    return guarded(log, step)


def _source(environ: Mapping[str, str], cfg: Config) -> HardwareSource:
    """The node's hardware: the bundle ``GPUSLURM_CAPTURE`` names (baked into the installed
    executables), else NVML from ``[paths] nvml_library`` (slurmd gives hooks no LD_LIBRARY_PATH)."""
    from gpuslurm.hw.source import hardware_source

    return hardware_source(nvml_library=cfg.paths.nvml_library, environ=environ)


def task_prolog_lines(environ: Mapping[str, str]) -> list[str]:
    """The ``export`` lines for this task of a Slurm job (none for a task without GPUs)."""
    from gpuslurm.config import load_config
    from gpuslurm.hooks.taskprolog import task_exports
    from gpuslurm.slurm.hookenv import HookEnv, gpu_claim

    env = HookEnv.from_environ(environ)
    claim = gpu_claim(env)
    if claim is None:
        return []
    cfg = load_config(environ=environ)
    source = _source(environ, cfg)
    pairs = task_exports(claim, env.job_id, local_id=environ.get("SLURM_LOCALID", "0"),
                         keep_cuda_visible_devices=bool(environ.get("CUDA_VISIBLE_DEVICES", "").strip()),
                         keep_device_order=bool(environ.get("CUDA_DEVICE_ORDER", "").strip()),
                         source=source, run_dir=cfg.paths.run_dir)
    return [f"export {name}={value}" for name, value in pairs]


def run_task_prolog(environ: Mapping[str, str], out: TextIO, log: HookLog | None = None) -> int:
    """The TaskProlog, as the job's user: ``export`` lines on ``out``; 0 unless the task could not
    join its devices cgroup."""
    from gpuslurm.hooks.taskprolog import task_start
    from gpuslurm.slurm.hookenv import join_task_cgroup

    log = log or HookLog("task-prolog", use_syslog=False)
    # task_start keeps its own policy (only isolation refuses the task); what escapes it is a bug
    return guarded(log, lambda: task_start(lambda: join_task_cgroup(environ),
                                           lambda: task_prolog_lines(environ), out, log))


def _setup(environ: Mapping[str, str], log: HookLog) -> tuple[HookJob, Config, SlurmScheduler]:
    from gpuslurm.hooks.cache import load_hook_config
    from gpuslurm.slurm.adapter import SlurmScheduler
    from gpuslurm.slurm.hookenv import hook_job

    job = hook_job(environ)
    log.job_id = job.job_id
    cfg = load_hook_config(environ, log.warning)
    return job, cfg, SlurmScheduler.from_config(cfg)
