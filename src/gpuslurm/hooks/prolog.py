"""The job-start step every scheduler runs as root before a job: gate, isolate, MPS, map.

``job_start`` takes a neutral :class:`gpuslurm.state.job.HookJob` and the scheduler's actions (a
:class:`gpuslurm.state.scheduler.Scheduler`); the adapters call it: Slurm's Prolog
(:mod:`gpuslurm.slurm.hooks`), PBS's execjob_begin (:mod:`gpuslurm.pbs`).

Steps: find the job's GPUs (none: deny every GPU where gpuslurm isolates, nothing else to do);
check each GPU's health; take the node out of service and fail if a fault says ``drain``; limit
the job's devices; start its MPS daemon if it asked for one; write the job map.

Failure policy. The step is a gate, so it fails closed: a health fault with action ``drain``
drains the node with a reason naming the GPU and the fault and returns 1; anything that stops it
from knowing which GPUs the job has or whether they are healthy (a broken config, a bundle or
``health.json`` that does not parse, a map it cannot write safely) raises, and the adapter's
:func:`gpuslurm.hooks.log.guarded` turns that into the error's code (2, 3 or 4), on which Slurm
drains the node and requeues the job. Logging never changes the exit code. What the job's user
controls (a malformed MPS request, an MPS daemon failing as the user) never drains the node: the
scheduler refuses the job with a reason (Slurm: ``scontrol requeuehold``) and the step returns 0
(docs/hooks.md, rule 3). Every external command runs with ``[hooks] command_timeout_s``.
"""

from __future__ import annotations

import os
import time

from gpuslurm.errors import CommandError, GpuslurmError, InputError
from gpuslurm.hooks.log import EXIT_INTERNAL, EXIT_UNHEALTHY, HookLog, JobFaultError
from gpuslurm.tuples import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence
    from typing import Any

    from gpuslurm.config import Config
    from gpuslurm.hw.identity import AnyNode, NodeIdentity
    from gpuslurm.state.job import HookJob, JobDevice
    from gpuslurm.state.scheduler import Scheduler

__all__ = ["EXIT_INTERNAL", "EXIT_UNHEALTHY", "HookLog", "JobFaultError", "job_start"]


def job_start(job: HookJob, scheduler: Scheduler, cfg: Config, log: HookLog,
              spec: str | None = None, *, node: AnyNode | None = None, isolate: bool | None = None,
              gated: bool = False) -> int:
    """Run the job-start step for ``job`` on this node (``spec``: a replayed capture bundle, else
    NVML); 0 when the job may run (or was refused without harm to the node), 1 when a health
    fault drained the node. Raises GpuslurmError when it cannot decide (see the module docstring).

    ``node`` is the node's identities when the adapter has them already; ``isolate`` overrides
    ``[cgroup] devices`` (None: :func:`gpuslurm.isolate.devices.wanted`); ``gated`` says the
    adapter has checked the health of the job's GPUs itself (PBS, before choosing them).
    """
    job_id, uid, user = job.job_id, job.uid, job.user
    log.job_id = job_id
    if spec is None and cfg.paths.nvml_library:  # slurmd gives hooks no LD_LIBRARY_PATH
        from gpuslurm.hw.nvml_lib import use_library

        use_library(cfg.paths.nvml_library)
    if isolate is None:
        from gpuslurm.isolate.devices import wanted

        isolate = wanted(cfg)
    from gpuslurm.state.out_of_service import HOLDER_COMMENT

    if uid == 0 and job.comment == HOLDER_COMMENT:  # root's holder of a GPU out of service
        log.info("a holder of a GPU out of service (gpuslurm gpu list): no gate, no map")
        return 0
    if job.gpus is None:
        from gpuslurm.isolate.devices import isolate_job

        # a job without GPUs here: nothing to check or map, but every GPU is denied to it
        if isolate:
            _log_isolation(log, isolate_job(cfg, job_id, uid, (), node or _node(spec, cfg, log),
                                                 scheduler=job.scheduler,
                                                 v2_dir=_v2_dir(scheduler, job, cfg)))
        return 0

    from gpuslurm.state.job import resolve_devices
    from gpuslurm.state.jobmap import job_map, write_map

    node = node or _node(spec, cfg, log)
    devices = resolve_devices(job.gpus, node)
    if not devices:
        from gpuslurm.isolate.devices import isolate_job

        if isolate:
            _log_isolation(log, isolate_job(cfg, job_id, uid, (), node, scheduler=job.scheduler,
                                                 v2_dir=_v2_dir(scheduler, job, cfg)))
        return 0
    gpus = list({d.gpu.uuid: d.gpu for d in devices}.values())  # MIG devices share their GPU's health

    from gpuslurm.policy.health import drain_reason, gate_enabled, gate_faults, gpu_label
    from gpuslurm.state.out_of_service import OutOfServiceStore

    out_store = OutOfServiceStore(cfg.paths.state_dir)
    out = out_store.read()  # a corrupt record raises: the gate fails closed
    if held := [g for g in gpus if g.uuid in out]:  # given a GPU out of service: never run on it
        g = held[0]
        why = f"GPU {gpu_label(g.index, g.minor, g.uuid)} is out of service: {out[g.uuid].reason}"
        return _requeue_job(scheduler, job_id, why, log)

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
    if not drains and (outs := [f for f in faults if f.action == "gpu_out"]):
        taken = _take_out(outs, node, out_store, scheduler, job.node_name, log)
        if taken is not None:
            return _requeue_job(scheduler, job_id, taken, log)
        drains = outs  # the last GPU in service: the node is drained instead
    if drains:
        reason = drain_reason(drains, labels)
        name = job.node_name
        try:
            scheduler.drain_node(name, reason)
            log.error(f"drained {name}: {reason}")
        except GpuslurmError as exc:  # the scheduler drains the node itself when the step fails
            log.error(f"could not drain {name} ({exc}); failing so that {job.scheduler} drains it: "
                      f"{reason}")
        from gpuslurm.hooks.epilog import record_refusal

        record_refusal(job, time.time(),
                       [{"uuid": d.uuid, "minor": d.minor, "gres_index": d.gres_index,
                         "parent_uuid": d.gpu.uuid if d.mig is not None else None} for d in devices],
                       faults, cfg, log)
        return EXIT_UNHEALTHY
    if isolate:
        from gpuslurm.isolate.devices import isolate_job

        _log_isolation(log, isolate_job(cfg, job_id, uid, devices, node,  # fails closed: raises
                                        scheduler=job.scheduler, v2_dir=_v2_dir(scheduler, job, cfg)))
    try:
        mps = _start_mps(job, cfg, devices, node, log, isolate)
    except JobFaultError as exc:  # the job's own input or its user's limits: fail the job, not the node
        return _refuse_job(scheduler, job_id, str(exc), log)
    try:  # every step after MPS started: a failure stops the daemon again
        jmap = job_map(job_id, user, uid, devices, account=job.account, sluid=job.sluid)
        path = write_map(jmap, cfg.paths.jobs_dir)
        log.info(f"{len(devices)} device(s) {','.join(d.uuid for d in devices)} mapped in {path}")
    except BaseException:
        if mps:
            _stop_mps_after_failure(cfg, job_id, log)
            _release_mps_cgroup(cfg, job_id, log)
        raise
    return 0


def _v2_dir(scheduler: Scheduler, job: HookJob, cfg: Config) -> Callable[[], Sequence[str]] | None:
    """How to find the job's directory (or every place it may be) in the scheduler's cgroup v2
    tree (the Slurm adapter's ``job_cgroup_v2``), for :func:`gpuslurm.isolate.devices.isolate_job`;
    None where it has none."""
    finder = getattr(scheduler, "job_cgroup_v2", None)
    if not callable(finder):
        return None
    return lambda: tuple(str(p) for p in finder(job, cfg))


def _node(spec: str | None, cfg: Any, log: HookLog) -> NodeIdentity:
    """The node's GPU identities (cached when replayed; never the link matrix, most of NVML's calls)."""
    from gpuslurm.hooks.cache import node_identity

    return node_identity(spec, cfg.paths.run_dir, log.warning)


def _start_mps(job: HookJob, cfg: Config, devices: Sequence[JobDevice], node: AnyNode,
               log: HookLog, isolated: bool) -> bool:
    """Start the job's MPS daemon if it asked for one (True).

    What the job's user controls raises JobFaultError (a malformed request, a daemon that fails to
    start as the user, e.g. at their process limit); what the admin controls (the MPS control
    program, the run directory) raises its own error, failing closed."""
    from gpuslurm.isolate.mps_request import job_gid, mps_request

    job_id, uid = job.job_id, job.uid
    try:  # what the job asked for (--comment, --constraint) and who it runs as
        request = mps_request(job.mps_share, job.comment, job.features, cfg.mps)
        gid = job_gid(job.gid, uid) if request is not None else 0
    except InputError as exc:
        raise JobFaultError(f"bad MPS request: {exc}") from exc
    if request is None:
        return False
    if not os.access(cfg.paths.mps_control, os.X_OK):  # the admin's: fail closed, the node drains
        raise InputError("is not an executable MPS control program", source=cfg.paths.mps_control)
    from gpuslurm.isolate.mps import start_mps

    procs = _job_devices_procs(cfg, job, devices, node, isolated)
    try:
        daemon = start_mps(job_id, uid, gid, [d.uuid for d in devices], request, run_dir=cfg.paths.run_dir,
                           mps_control=cfg.paths.mps_control, timeout=cfg.hooks.command_timeout_s,
                           pinned_memory_limit_mib=cfg.mps.pinned_memory_limit_mib, cgroup_procs=procs)
    except CommandError as exc:  # runs as the user: their process limit, their environment
        _release_mps_cgroup(cfg, job_id, log)
        raise JobFaultError(f"the job's MPS daemon did not start: {exc}") from exc
    except BaseException:
        _release_mps_cgroup(cfg, job_id, log)
        raise
    log.info(f"MPS ({request.trigger}) daemon pid {daemon.pid} as uid {uid}, "
             f"{request.active_thread_percentage}% threads, pipe {daemon.pipe_dir}")
    return True


def _take_out(faults: list[Any], node: AnyNode, store: Any, scheduler: Scheduler, name: str,
              log: HookLog) -> str | None:
    """``[health.*] action = "gpu_out"``: record the faulty GPUs out of service and drain the node
    for new jobs with the graceful path's reason (the monitor, or ``health --act``, rewrites
    gres.conf and resumes it once its running jobs end); why, for the job. None when one of them
    is the last GPU in service (the caller drains the node as for ``drain``)."""
    from gpuslurm.policy.health import gpu_label
    from gpuslurm.state.out_of_service import gpu_out_reason, take_out

    now = time.time()
    for fault in faults:
        gpu = next(g for g in node.gpus if g.uuid == fault.uuid)
        try:
            take_out(store, node.gpus, gpu, fault.message, "prolog", now=now)
        except InputError as exc:
            log.error(f"{exc}: draining the node instead")
            return None
        log.error(f"GPU {gpu_label(gpu.index, gpu.minor, gpu.uuid)} taken out of service: {fault.message}")
    out = store.read()
    present = {g.uuid for g in node.gpus}
    reason = gpu_out_reason(len(node.gpus), {u: r for u, r in out.items() if u in present})
    try:
        scheduler.drain_node(name, reason)
        log.error(f"drained {name} for new jobs: {reason}")
    except GpuslurmError as exc:
        log.error(f"could not drain {name} for new jobs ({exc}); the GPUs are recorded out of service")
    return "; ".join(f.message for f in faults)


def _requeue_job(scheduler: Scheduler, job_id: str, why: str, log: HookLog) -> int:
    """Requeue the job (not its fault: a GPU failed under it) without failing the prolog, so the
    node is not drained; else an error code, as :func:`_refuse_job`."""
    return _job_out(scheduler.requeue_job, job_id, f"gpuslurm requeued this job: {why}", log)


def _refuse_job(scheduler: Scheduler, job_id: str, why: str, log: HookLog) -> int:
    """Fail the job for ``why`` without draining the node: 0 when the scheduler took it out, else
    an error code (the job must not start: the scheduler then drains the node, the one way left
    to stop it)."""
    return _job_out(scheduler.refuse_job, job_id, f"gpuslurm refused this job: {why}", log)


def _job_out(action: Callable[[str, str], str], job_id: str, reason: str, log: HookLog) -> int:
    try:
        done = action(job_id, reason)
    except GpuslurmError as exc:
        log.error(f"{reason}; and could not requeue or cancel it ({exc}): failing the prolog")
        return exc.exit_code
    log.error(f"{reason} (job {done}; the node stays up)")
    return 0


def _job_devices_procs(cfg: Any, job: HookJob, devices: Sequence[JobDevice], node: AnyNode,
                       isolated: bool) -> str | None:
    """The devices cgroup the job's MPS daemon starts in (its ``cgroup.procs``), so the daemon and
    its servers never reach a GPU the job was not given. cgroup v1: gpuslurm's own (made by
    isolate_job just before) when gpuslurm isolates here; else the scheduler's job cgroup if it
    already exists; else (the scheduler constrains the tasks but has no job cgroup yet: Slurm
    22.05, also with ``PrologFlags=Contain``) one for the daemon alone. cgroup v2: always one for
    the daemon alone (``isolate.devices.mps_cgroup_v2`` says why). None with ``[cgroup] devices
    = "never"``."""
    import os

    from gpuslurm.isolate.devices import (
        cgroup_version,
        mps_cgroup_v1,
        mps_cgroup_v2,
        scheduler_devices_procs,
        v1_job_dir,
    )
    from gpuslurm.state.cgroup import scheduler_devices_dirs

    root = cfg.paths.cgroup_root
    if cfg.cgroup.devices == "never":  # no device cgroups of ours
        return None
    version = cgroup_version(root)
    if version == 2:
        return mps_cgroup_v2(cfg, job.job_id, devices, node)
    if version != 1:
        return None
    if isolated:  # gpuslurm made the job's own devices cgroup just before
        procs = os.path.join(v1_job_dir(root, job.job_id), "cgroup.procs")
        return procs if os.path.exists(procs) else None
    found = scheduler_devices_procs(root, scheduler_devices_dirs(job.scheduler, job.job_id, job.uid,
                                                                 job.node_name))
    return found if found is not None else mps_cgroup_v1(cfg, job.job_id, devices, node)


def _release_mps_cgroup(cfg: Any, job_id: str, log: HookLog) -> None:
    """The prolog failed after making the daemon's own cgroup: remove it (the epilog may not run)."""
    from gpuslurm.isolate.devices import release_mps_cgroup

    try:
        if (path := release_mps_cgroup(cfg, job_id)) is not None:
            log.warning(f"removed the MPS daemon's cgroup {path}")
    except Exception as exc:  # the prolog's own error is the one to report
        log.error(f"cannot remove the MPS daemon's cgroup: {exc}")


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
