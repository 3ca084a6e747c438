"""``gpuslurm prolog``: runs as root in slurmd's environment before each job on the node.

Steps: read the hook environment and the config; find the job's GPUs (none: nothing to do);
check each GPU's health; drain the node and fail if a fault says ``drain``; write the job map.
:func:`run_prolog` is Slurm's entry (its environment becomes a neutral
:class:`gpuslurm.state.job.HookJob`, its scontrol a Scheduler); :func:`prolog_job` is the steps
themselves, which PBS's execjob_begin runs too (:mod:`gpuslurm.pbs.begin`).

Failure policy. The prolog is a gate, so it fails closed: a health fault with action ``drain``
drains the node with a reason naming the GPU and the fault and exits 1; anything that stops it
from knowing which GPUs the job has or whether they are healthy (a broken config, a bundle or
``health.json`` that does not parse, a map it cannot write safely) exits with that error's code
(2, 3 or 4) and Slurm then drains the node with "Prolog error" and requeues the job. Logging is
the only non-essential step; it never changes the exit code. What the job's user controls
(a malformed MPS request, an MPS daemon failing as the user) never drains the node: the job is
held with a reason (``scontrol requeuehold``) and the prolog exits 0 (docs/hooks.md, rule 3).
Every external command (scontrol) runs with ``[hooks] command_timeout_s``.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, TextIO

from gpuslurm.errors import CommandError, GpuslurmError, InputError, one_line

if TYPE_CHECKING:
    from gpuslurm.config import Config
    from gpuslurm.hw.identity import AnyNode, NodeIdentity
    from gpuslurm.state.job import HookJob
    from gpuslurm.state.scheduler import Scheduler

EXIT_UNHEALTHY = 1  # a health fault drained the node
EXIT_INTERNAL = 70


class JobFaultError(Exception):
    """A failure the job's user caused or controls (its --comment/--constraint, its environment,
    its own limits): the prolog fails that job and exits 0, so the node stays up."""


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
        line = one_line(f"gpuslurm {self.hook}{job}: {message}")
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


def scheduler_label(job: HookJob) -> str:
    """The job's scheduler as people write it: Slurm, PBS."""
    return {"slurm": "Slurm", "pbs": "PBS"}.get(job.scheduler, job.scheduler)


def run_prolog(environ: Mapping[str, str], log: HookLog | None = None) -> int:
    """Slurm's prolog; the exit code for Slurm (0 ok, 1 drained for a fault, else an error's code)."""
    log = log or HookLog("prolog")
    try:
        from gpuslurm.hooks.cache import load_hook_config
        from gpuslurm.slurm.hookenv import HookEnv, hook_job

        job = hook_job(HookEnv.from_environ(environ), environ)
        log.job_id = job.job_id
        cfg = load_hook_config(environ, log.warning)
        return prolog_job(job, cfg, slurm_actions(cfg), log, environ.get("GPUSLURM_CAPTURE") or None)
    except GpuslurmError as exc:
        log.error(str(exc))
        return exc.exit_code
    except Exception as exc:  # a bug: fail closed, the job must not start on an unchecked GPU
        log.error(f"internal error: {type(exc).__name__}: {exc}")
        return EXIT_INTERNAL


def slurm_actions(cfg: Any) -> Scheduler:
    """Slurm's drain, refuse and AdminComment, as the neutral steps call them."""
    from gpuslurm.slurm.adapter import SlurmScheduler

    return SlurmScheduler(squeue=cfg.paths.squeue, scontrol=cfg.paths.scontrol, scancel=cfg.paths.scancel,
                          timeout=cfg.hooks.command_timeout_s)


def prolog_job(job: HookJob, cfg: Config, scheduler: Scheduler, log: HookLog, spec: str | None, *,
               node: AnyNode | None = None, isolate: bool | None = None,
               gated: bool = False) -> int:
    """The neutral prolog steps for ``job`` (see the module docstring); its exit code.

    ``scheduler`` drains the node and refuses the job in its scheduler's way; ``spec`` names a
    replayed bundle (None: NVML); ``node`` is the node's identities when the caller has them;
    ``isolate`` overrides ``[cgroup] devices`` (None: :func:`gpuslurm.isolate.devices.wanted`);
    ``gated`` says the caller has already checked the health of the job's GPUs.
    Errors other than a health fault or a job fault are raised (the caller fails closed).
    """
    log.job_id = job.job_id
    if isolate is None:
        from gpuslurm.isolate.devices import wanted

        isolate = wanted(cfg)
    if job.gpus is None:
        from gpuslurm.isolate.devices import isolate_job

        # a job without GPUs here: nothing to check or map, but every GPU is denied to it
        if isolate:
            _log_isolation(log, isolate_job(cfg, job.job_id, job.uid, (), node or _node(spec, cfg, log)))
        return 0

    from gpuslurm.state.job import resolve_devices
    from gpuslurm.state.jobmap import job_map, write_map

    node = node or _node(spec, cfg, log)
    devices = resolve_devices(job.gpus, node)
    if not devices:
        from gpuslurm.isolate.devices import isolate_job

        if isolate:
            _log_isolation(log, isolate_job(cfg, job.job_id, job.uid, (), node))
        return 0
    gpus = list({d.gpu.uuid: d.gpu for d in devices}.values())  # MIG devices share their GPU's health

    from gpuslurm.policy.health import drain_reason, gate_enabled, gate_faults, gpu_label

    faults = []
    if gate_enabled(cfg.health) and not gated:
        from gpuslurm.hw.health import read_health

        health = read_health(gpus, spec)
        for gpu in gpus:
            faults.extend(gate_faults(health[gpu.uuid], cfg.health))
    labels = {g.uuid: gpu_label(g.index, g.minor, g.uuid) for g in gpus}
    for fault in faults:
        log.warning(f"GPU {labels[fault.uuid]}: {fault.check}: {fault.message} "
                    f"(action {fault.action})")
    drains = [f for f in faults if f.action == "drain"]
    if drains:
        reason = drain_reason(drains, labels)
        try:
            scheduler.drain_node(job.node_name, reason)
            log.error(f"drained {job.node_name}: {reason}")
        except CommandError as exc:  # the scheduler takes the node out itself when the prolog fails
            log.error(f"could not drain {job.node_name} ({exc}); failing so that "
                      f"{scheduler_label(job)} drains it: {reason}")
        from gpuslurm.hooks.epilog import record_refusal

        record_refusal(job, time.time(),
                       [{"uuid": d.uuid, "minor": d.minor, "gres_index": d.gres_index,
                         "parent_uuid": d.gpu.uuid if d.mig is not None else None} for d in devices],
                       faults, cfg, log)
        return EXIT_UNHEALTHY
    from gpuslurm.isolate.devices import isolate_job

    if isolate:
        _log_isolation(log, isolate_job(cfg, job.job_id, job.uid, devices, node))  # fails closed: raises
    try:
        mps = _start_mps(job, cfg, [d.uuid for d in devices], log, isolate)
    except JobFaultError as exc:  # the job's own input or its user's limits: fail the job, not the node
        return _refuse_job(scheduler, job.job_id, str(exc), log)
    try:  # every step after MPS started: a failure stops the daemon again
        path = write_map(job_map(job.job_id, job.user, job.uid, devices, account=job.account),
                         cfg.paths.jobs_dir)
        log.info(f"{len(devices)} device(s) {','.join(d.uuid for d in devices)} mapped in {path}")
    except BaseException:
        if mps:
            _stop_mps_after_failure(cfg, job.job_id, log)
        raise
    return 0


def _node(spec: str | None, cfg: Any, log: HookLog) -> NodeIdentity:
    """The node's GPU identities (cached when replayed; never the link matrix, most of NVML's calls)."""
    from gpuslurm.hooks.cache import node_identity

    return node_identity(spec, cfg.paths.run_dir, log.warning)


def _start_mps(job: HookJob, cfg: Any, uuids: list[str], log: HookLog, isolated: bool) -> bool:
    """Start the job's MPS daemon if it asked for one (True).

    What the job's user controls raises JobFaultError (a malformed request, a daemon that fails to
    start as the user, e.g. at their process limit); what the admin controls (the MPS control
    program, the run directory) raises its own error, failing closed."""
    from gpuslurm.isolate.mps_request import job_mps_request, user_gid

    try:  # what the job asked for (--comment, --constraint) and who it runs as
        request = job_mps_request(job.mps_share, job.comment, job.features, cfg.mps)
        gid = user_gid(job.uid, job.gid) if request is not None else 0
    except InputError as exc:
        raise JobFaultError(f"bad MPS request: {exc}") from exc
    if request is None:
        return False
    if not os.access(cfg.paths.mps_control, os.X_OK):  # the admin's: fail closed, the node drains
        raise InputError("is not an executable MPS control program", source=cfg.paths.mps_control)
    from gpuslurm.isolate.mps import start_mps

    try:
        daemon = start_mps(job.job_id, job.uid, gid, uuids, request, run_dir=cfg.paths.run_dir,
                           mps_control=cfg.paths.mps_control, timeout=cfg.hooks.command_timeout_s,
                           pinned_memory_limit_mib=cfg.mps.pinned_memory_limit_mib,
                           cgroup_procs=_job_devices_procs(cfg, job.job_id) if isolated else None)
    except CommandError as exc:  # runs as the user: their process limit, their environment
        raise JobFaultError(f"the job's MPS daemon did not start: {exc}") from exc
    log.info(f"MPS ({request.trigger}) daemon pid {daemon.pid} as uid {job.uid}, "
             f"{request.active_thread_percentage}% threads, pipe {daemon.pipe_dir}")
    return True


def _refuse_job(scheduler: Scheduler, job_id: str, why: str, log: HookLog) -> int:
    """Fail the job for ``why`` without draining the node: 0 when the scheduler took it out, else an
    error code (the job must not start: the scheduler then drains the node, the one way left)."""
    reason = f"gpuslurm refused this job: {why}"
    try:
        done = scheduler.refuse_job(job_id, reason)
    except CommandError as exc:
        log.error(f"{reason}; and could not requeue or cancel it ({exc}): failing the prolog")
        return exc.exit_code
    log.error(f"{reason} (job {done}; the node stays up)")
    return 0


def _job_devices_procs(cfg: Any, job_id: str) -> str | None:
    """gpuslurm's v1 devices cgroup of the job (made by isolate_job just before), for the MPS
    daemon to start in; None when gpuslurm does not isolate here or uses v2."""
    import os

    from gpuslurm.isolate.devices import cgroup_version, v1_job_dir

    if cgroup_version(cfg.paths.cgroup_root) != 1:
        return None
    procs = os.path.join(v1_job_dir(cfg.paths.cgroup_root, job_id), "cgroup.procs")
    return procs if os.path.exists(procs) else None


def _stop_mps_after_failure(cfg: Any, job_id: str, log: HookLog) -> None:
    from gpuslurm.isolate.mps import stop_mps

    try:
        done = stop_mps(job_id, run_dir=cfg.paths.run_dir, mps_control=cfg.paths.mps_control,
                        timeout=cfg.hooks.command_timeout_s, grace=cfg.epilog.kill_grace_s)
        stuck = f"; pids {list(done.stuck)} survived SIGKILL" if done and done.stuck else ""
        log.warning(f"prolog failed after MPS started: stopped it again{stuck}")
    except Exception as exc:  # the prolog's own error is the one to report
        log.error(f"prolog failed after MPS started, and stopping MPS failed too: {exc}")


def _log_isolation(log: HookLog, what: str | None) -> None:
    if what is not None:
        log.info(what)
