"""``gpuslurm prolog``: runs as root in slurmd's environment before each job on the node.

Steps: read the hook environment and the config; find the job's GPUs (none: nothing to do);
check each GPU's health; drain the node and fail if a fault says ``drain``; write the job map.

Failure policy. The prolog is a gate, so it fails closed: a health fault with action ``drain``
drains the node with a reason naming the GPU and the fault and exits 1; anything that stops it
from knowing which GPUs the job has or whether they are healthy (a broken config, a bundle or
``health.json`` that does not parse, a map it cannot write safely) exits with that error's code
(2, 3 or 4) and Slurm then drains the node with "Prolog error" and requeues the job. Logging is
the only non-essential step; it never changes the exit code. Every external command (scontrol)
runs with ``[hooks] command_timeout_s``.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from typing import TextIO

from gpuslurm.errors import CommandError, GpuslurmError

EXIT_UNHEALTHY = 1  # a health fault drained the node
EXIT_INTERNAL = 70


class HookLog:
    """One-line messages to stderr (slurmd keeps them in its log) and to syslog."""

    def __init__(self, hook: str, stream: TextIO | None = None, use_syslog: bool = True) -> None:
        self.hook = hook
        self.stream = stream if stream is not None else sys.stderr
        self.use_syslog = use_syslog
        self.job_id: str | None = None
        self.lines: list[str] = []

    def info(self, message: str) -> None:
        self._emit(6, message)  # LOG_INFO

    def warning(self, message: str) -> None:
        self._emit(4, message)  # LOG_WARNING

    def error(self, message: str) -> None:
        self._emit(3, message)  # LOG_ERR

    def _emit(self, level: int, message: str) -> None:
        job = f" job {self.job_id}" if self.job_id else ""
        line = f"gpuslurm {self.hook}{job}: {message}"
        self.lines.append(line)
        try:
            print(line, file=self.stream, flush=True)
        except (OSError, ValueError):
            pass  # a closed stderr must not turn a healthy job into a failed hook
        if self.use_syslog:
            try:
                import syslog

                syslog.openlog("gpuslurm", syslog.LOG_PID, syslog.LOG_DAEMON)
                syslog.syslog(level, line)
            except OSError:
                pass


def node_name(environ: Mapping[str, str]) -> str:
    """The Slurm name of this node: ``SLURMD_NODENAME``, else the short host name."""
    return environ.get("SLURMD_NODENAME", "").strip() or os.uname().nodename.split(".")[0]


def run_prolog(environ: Mapping[str, str], log: HookLog | None = None) -> int:
    """Run the prolog; the exit code for Slurm (0 ok, 1 drained for a fault, else an error's code)."""
    log = log or HookLog("prolog")
    try:
        return _prolog(environ, log)
    except GpuslurmError as exc:
        log.error(str(exc))
        return exc.exit_code
    except Exception as exc:  # a bug: fail closed, the job must not start on an unchecked GPU
        log.error(f"internal error: {type(exc).__name__}: {exc}")
        return EXIT_INTERNAL


def _prolog(environ: Mapping[str, str], log: HookLog) -> int:
    from gpuslurm.config import load_config
    from gpuslurm.slurm.hookenv import HookEnv

    env = HookEnv.from_environ(environ)
    job_id, uid, user = env.require_job()
    log.job_id = job_id
    cfg = load_config(environ=environ)
    if env.job_gpus is None and env.step_gpus is None:
        return 0  # a job without GPUs here: nothing to check or map

    from gpuslurm.hooks.jobmap import job_map, write_map
    from gpuslurm.hw.source import load_node
    from gpuslurm.slurm.hookenv import resolve_job_gpus

    spec = environ.get("GPUSLURM_CAPTURE") or None
    node = load_node(spec)
    devices = resolve_job_gpus(env, node)
    if not devices:
        return 0
    gpus = list({d.gpu.uuid: d.gpu for d in devices}.values())  # MIG devices share their GPU's health

    from gpuslurm.policy.health import drain_reason, gate_enabled, gate_faults

    faults = []
    if gate_enabled(cfg.health):
        from gpuslurm.hw.health import read_health

        health = read_health(gpus, spec)
        for gpu in gpus:
            faults.extend(gate_faults(health[gpu.uuid], cfg.health))
    labels = {g.uuid: str(g.index) for g in gpus}
    for fault in faults:
        log.warning(f"GPU {labels[fault.uuid]} {fault.uuid}: {fault.check}: {fault.message} "
                    f"(action {fault.action})")
    drains = [f for f in faults if f.action == "drain"]
    if drains:
        from gpuslurm.slurm.scontrol import drain_node

        reason = drain_reason(drains, labels)
        name = node_name(environ)
        try:
            drain_node(name, reason, scontrol=cfg.paths.scontrol, timeout=cfg.hooks.command_timeout_s)
            log.error(f"drained {name}: {reason}")
        except CommandError as exc:  # Slurm drains the node itself when the prolog fails
            log.error(f"could not drain {name} ({exc}); failing so that Slurm drains it: {reason}")
        return EXIT_UNHEALTHY
    path = write_map(job_map(job_id, user, uid, devices), cfg.paths.jobs_dir)
    log.info(f"{len(devices)} device(s) {','.join(d.uuid for d in devices)} mapped in {path}")
    return 0
