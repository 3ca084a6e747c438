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

import os
import time

from gpuslurm.hooks.log import HookLog, guarded
from gpuslurm.tuples import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import TextIO

    from gpuslurm.config import Config
    from gpuslurm.hw.model.node import Node
    from gpuslurm.hw.source import HardwareSource
    from gpuslurm.slurm.adapter import SlurmScheduler
    from gpuslurm.state.job import HookJob
    from gpuslurm.state.taskinfo import TaskInfo


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
    """The ``export`` lines for this task of a Slurm job (none for a task without GPUs).

    Once per task, so the common case parses nothing: the run directory named by the config's
    ``[paths] run_dir = "..."`` line (:func:`gpuslurm.hooks.cache.run_dir_hint`) holds the task
    file the prolog wrote for this job, which is only found there if the prolog, parsing the same
    config, wrote it there. Otherwise (a config that names run_dir another way, a job started
    before task files) the config is parsed, and the node read when there is still no task file.
    """
    from gpuslurm.hooks.taskprolog import task_exports
    from gpuslurm.slurm.hookenv import HookEnv, gpu_claim

    env = HookEnv.from_environ(environ)
    claim = gpu_claim(env)
    if claim is None:
        return []
    uid = os.getuid() or None  # root reads any job's
    local_id = environ.get("SLURM_LOCALID", "0")
    keep_visible = bool(environ.get("CUDA_VISIBLE_DEVICES", "").strip())
    keep_order = bool(environ.get("CUDA_DEVICE_ORDER", "").strip())
    hinted = _hinted(environ, env.job_id, uid)
    if hinted is not None:
        run_dir, info = hinted
        pairs = task_exports(claim, env.job_id, local_id=local_id, keep_cuda_visible_devices=keep_visible,
                             keep_device_order=keep_order, node=_no_node, run_dir=run_dir, uid=uid, info=info)
    else:
        from gpuslurm.config import load_config

        cfg = load_config(environ=environ)
        pairs = task_exports(claim, env.job_id, local_id=local_id, keep_cuda_visible_devices=keep_visible,
                             keep_device_order=keep_order,
                             node=lambda: _source(environ, cfg).node(links=False),
                             run_dir=cfg.paths.run_dir, uid=uid)
    return [f"export {name}={value}" for name, value in pairs]


def _hinted(environ: Mapping[str, str], job_id: str | None, uid: int | None) -> tuple[str, TaskInfo] | None:
    """The run directory of the config's ``run_dir`` line and this job's task file in it, if any."""
    from gpuslurm.configfile import config_path, read_config_text
    from gpuslurm.hooks.cache import run_dir_hint
    from gpuslurm.state.taskinfo import read_task_info

    text = read_config_text(*config_path(environ))
    run_dir = run_dir_hint(text or "")
    info = None if job_id is None else read_task_info(run_dir, job_id, uid)
    return None if info is None else (run_dir, info)


def _no_node() -> Node:
    raise AssertionError("the task file was there a moment ago")  # pragma: no cover


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
