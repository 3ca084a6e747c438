"""The job-start step every scheduler runs as root before a job: gate, isolate, MPS, map.

``job_start`` takes a neutral :class:`gpuslurm.state.job.HookJob` and the scheduler's actions (a
:class:`gpuslurm.state.scheduler.Scheduler`); the adapters call it: Slurm's Prolog
(:mod:`gpuslurm.slurm.hooks`), PBS's classic prologue (:mod:`gpuslurm.pbs.classic`). PBS's
execjob_begin (:mod:`gpuslurm.pbs.begin`) chooses the job's GPUs itself and runs the same steps
around its choice.

Steps, one function each: :func:`prepare` (the NVML library, whether to isolate); find the job's
GPUs (none: :func:`deny_all_devices`, every GPU denied where gpuslurm isolates);
:func:`out_of_service_gate` (a GPU out of service: the job is requeued); :func:`health_gate`
(each fault acted on as :func:`gpuslurm.policy.fault_response.respond` decides, the one fault
response every scheduler and the monitor share); :func:`start_on_devices` (limit the job's
devices, start its MPS daemon if it asked for one, write the job map).

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

from gpuslurm.errors import EXIT_UNHEALTHY, CommandError, GpuslurmError, InputError
from gpuslurm.hooks.log import HookLog, JobFaultError
from gpuslurm.tuples import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from gpuslurm.config import Config
    from gpuslurm.hw.model.node import Gpu, Node
    from gpuslurm.hw.source import HardwareSource
    from gpuslurm.policy.health import Fault
    from gpuslurm.state.job import HookJob, JobDevice
    from gpuslurm.state.out_of_service import OutOfServiceStore
    from gpuslurm.state.scheduler import Scheduler

__all__ = ["HookLog", "JobFaultError", "deny_all_devices", "health_gate",
           "job_start", "out_of_service_gate", "prepare", "start_on_devices"]


def job_start(job: HookJob, scheduler: Scheduler, cfg: Config, log: HookLog,
              source: HardwareSource, *, node: Node | None = None, isolate: bool | None = None) -> int:
    """Run the job-start step for ``job``, whose GPUs the scheduler chose (Slurm's prolog, PBS's
    classic prologue), on this node (``source``: a replayed capture bundle or NVML); 0 when the
    job may run (or was refused without harm to the node), 1 when a health fault drained the node.
    Raises GpuslurmError when it cannot decide (see the module docstring).

    ``node`` is the node when the adapter has it already; ``isolate`` overrides
    ``[cgroup] devices`` (None: :func:`gpuslurm.isolate.devices.wanted`). The steps, each its own
    function: :func:`prepare`, the holder's pass, the job's devices, :func:`out_of_service_gate`,
    :func:`health_gate`, :func:`start_on_devices`. PBS's execjob_begin chooses the devices itself
    (gated by :func:`gpuslurm.pbs.begin.health_offline` before the choice) and runs the last step.
    """
    isolate = prepare(job, scheduler, cfg, log, isolate)
    from gpuslurm.state.out_of_service import HOLDER_COMMENT

    if job.uid == 0 and job.comment == HOLDER_COMMENT:  # root's holder of a GPU out of service
        log.info("a holder of a GPU out of service (gpuslurm gpu list): no gate, no map")
        return 0
    if job.gpus is None:  # a job without GPUs here: nothing to check or map
        return deny_all_devices(job, scheduler, cfg, log, lambda: node or _node(source, cfg, log), isolate)
    from gpuslurm.state.job import resolve_devices

    node = node or _node(source, cfg, log)
    devices = resolve_devices(job.gpus, node)
    if not devices:
        return deny_all_devices(job, scheduler, cfg, log, lambda: node, isolate)
    gpus = list({d.gpu.uuid: d.gpu for d in devices}.values())  # MIG devices share their GPU's health
    if (refused := out_of_service_gate(job, scheduler, cfg, log, gpus)) is not None:
        return refused
    if (drained := health_gate(job, scheduler, cfg, log, source, node, devices)) is not None:
        return drained
    return start_on_devices(job, scheduler, cfg, log, node, devices, isolate)


def prepare(job: HookJob, scheduler: Scheduler, cfg: Config, log: HookLog, isolate: bool | None) -> bool:
    """The first step of every job start: name the job in the log; whether gpuslurm limits the
    job's devices. (The adapter's :class:`HardwareSource` has loaded the configured NVML library:
    slurmd gives hooks no LD_LIBRARY_PATH.)"""
    log.job_id = job.job_id
    if isolate is None:
        from gpuslurm.isolate.devices import wanted

        return wanted(cfg, lambda: scheduler.constrains_devices(cfg))
    return isolate


def deny_all_devices(job: HookJob, scheduler: Scheduler, cfg: Config, log: HookLog,
                     node: Callable[[], Node], isolate: bool) -> int:
    """A job given no GPU here: nothing to check or map, but every GPU is denied to it (where
    gpuslurm isolates; ``node`` is asked only then)."""
    if isolate:
        from gpuslurm.isolate.devices import isolate_job

        _log_isolation(log, isolate_job(cfg, job.job_id, job.uid, (), node(), scheduler=scheduler.name,
                                        v2_dir=_v2_dir(scheduler, job, cfg)))
    return 0


def out_of_service_gate(job: HookJob, scheduler: Scheduler, cfg: Config, log: HookLog,
                        gpus: Sequence[Gpu]) -> int | None:
    """A job given a GPU out of service never runs on it: it is requeued (the hook's code);
    None when none of ``gpus`` is out. A corrupt record raises: the gate fails closed."""
    from gpuslurm.policy.health import gpu_label
    from gpuslurm.state.out_of_service import OutOfServiceStore

    out = OutOfServiceStore(cfg.paths.state_dir).read()
    if held := [g for g in gpus if g.uuid in out]:
        g = held[0]
        why = f"GPU {gpu_label(g.index, g.minor, g.uuid)} is out of service: {out[g.uuid].reason}"
        return _requeue_job(scheduler, job.job_id, why, log)
    return None


def health_gate(job: HookJob, scheduler: Scheduler, cfg: Config, log: HookLog, source: HardwareSource,
                node: Node, devices: Sequence[JobDevice]) -> int | None:
    """Check the health of the job's GPUs and act on the faults as
    :func:`gpuslurm.policy.fault_response.respond` decides: a GPU to drain for drains the node
    and the step fails (EXIT_UNHEALTHY); GPUs taken out drain the node for new jobs (the graceful
    path) and the job is requeued (the hook's code). None when the job may run."""
    from gpuslurm.policy.health import gate_enabled, gate_faults, gpu_label

    if not gate_enabled(cfg.health):
        return None
    from gpuslurm.hw.health import read_health

    gpus = list({d.gpu.uuid: d.gpu for d in devices}.values())
    health = read_health(gpus, source)
    faults = [f for gpu in gpus for f in gate_faults(health[gpu.uuid], cfg.health)]
    if not faults:
        return None
    labels = {g.uuid: gpu_label(g.index, g.minor, g.uuid) for g in node.gpus}
    for fault in faults:
        log.warning(f"GPU {labels[fault.uuid]}: {fault.check}: {fault.message} (action {fault.action})")
    from gpuslurm.policy.fault_response import LAST_IN_SERVICE, respond
    from gpuslurm.state.out_of_service import OutOfServiceStore, take_out_decided

    store = OutOfServiceStore(cfg.paths.state_dir)
    response = take_out_decided(store, lambda out: respond(faults, node.gpus, out), "prolog",
                                now=time.time(), out=store.read())
    for d in response.take_outs:
        log.error(f"GPU {labels[d.uuid]} taken out of service: {d.reason}")
    for d in response.drains:
        if d.why == LAST_IN_SERVICE:
            log.error(f"GPU {labels[d.uuid]} is the last GPU in service: draining the node instead "
                      "of taking it out")
    if response.drains:
        return _drain_for(job, scheduler, cfg, log, devices, response.drain_faults, faults, labels)
    if response.take_outs:
        _drain_for_new_jobs(scheduler, job.node_name, node, store, log)
        return _requeue_job(scheduler, job.job_id, "; ".join(d.reason for d in response.take_outs), log)
    return None


def start_on_devices(job: HookJob, scheduler: Scheduler, cfg: Config, log: HookLog, node: Node,
                     devices: Sequence[JobDevice], isolate: bool) -> int:
    """The steps on the job's gated devices: limit the job to them, start its MPS daemon if it
    asked for one, write the job map. 0; what the job's user controls refuses the job (the
    hook's code), what the node's does raises."""
    job_id = job.job_id
    if isolate:
        from gpuslurm.isolate.devices import isolate_job

        _log_isolation(log, isolate_job(cfg, job_id, job.uid, devices, node,  # fails closed: raises
                                        scheduler=scheduler.name, v2_dir=_v2_dir(scheduler, job, cfg)))
    try:
        mps = _start_mps(job, scheduler, cfg, devices, node, log, isolate)
    except JobFaultError as exc:  # the job's own input or its user's limits: fail the job, not the node
        return _refuse_job(scheduler, job_id, str(exc), log)
    from gpuslurm.state.jobmap import job_map, write_map

    try:  # every step after MPS started: a failure stops the daemon again
        jmap = job_map(job_id, job.user, job.uid, devices, account=job.account, sluid=job.sluid)
        path = write_map(jmap, cfg.paths.jobs_dir)
        log.info(f"{len(devices)} device(s) {','.join(d.uuid for d in devices)} mapped in {path}")
        _write_task_info(job, cfg, devices, log)
    except BaseException:
        if mps:
            _stop_mps_after_failure(cfg, job_id, log)
            _release_mps_cgroup(cfg, job_id, log)
        raise
    return 0


def _write_task_info(job: HookJob, cfg: Config, devices: Sequence[JobDevice], log: HookLog) -> None:
    """What the job's tasks need (:mod:`gpuslurm.state.taskinfo`), so that the task prolog, once
    per task, reads one small file instead of the node. Bookkeeping: a failure costs the tasks
    time (the task prolog then reads the node), never the job."""
    from gpuslurm.isolate.mps_request import job_gid
    from gpuslurm.state.taskinfo import TaskInfo, task_device, write_task_info

    try:
        info = TaskInfo(job.job_id, job.uid, tuple(task_device(d) for d in devices))
        write_task_info(cfg.paths.run_dir, info, job_gid(job.gid, job.uid))
    except (GpuslurmError, OSError, ValueError) as exc:
        log.warning(f"no task file for the job's tasks (they read the node instead): {exc}")


def _drain_for(job: HookJob, scheduler: Scheduler, cfg: Config, log: HookLog, devices: Sequence[JobDevice],
               drains: list[Fault], faults: list[Fault], labels: dict[str, str]) -> int:
    """Drain the node for ``drains`` and record the refused job's summary; EXIT_UNHEALTHY."""
    from gpuslurm.policy.health import drain_reason

    reason = drain_reason(drains, labels)
    name = job.node_name
    try:
        scheduler.drain_node(name, reason)
        log.error(f"drained {name}: {reason}")
    except GpuslurmError as exc:  # the scheduler drains the node itself when the step fails
        log.error(f"could not drain {name} ({exc}); failing so that {job.scheduler} drains it: {reason}")
    from gpuslurm.hooks.epilog import record_refusal

    record_refusal(job, time.time(),
                   [{"uuid": d.uuid, "minor": d.minor, "gres_index": d.gres_index,
                     "parent_uuid": d.gpu.uuid if d.mig is not None else None} for d in devices],
                   faults, cfg, log)
    return EXIT_UNHEALTHY


def _v2_dir(scheduler: Scheduler, job: HookJob, cfg: Config) -> Callable[[], Sequence[str] | None]:
    """How to find the job's directory (or every place it may be) in the scheduler's cgroup v2
    tree, for :func:`gpuslurm.isolate.devices.isolate_job`: asked only on cgroup v2; None there
    where the scheduler makes the job none (gpuslurm makes its own)."""
    return lambda: scheduler.job_cgroup_v2(job, cfg)


def _node(source: HardwareSource, cfg: Config, log: HookLog) -> Node:
    """The node's GPUs (cached when replayed; never the link matrix, most of NVML's calls)."""
    from gpuslurm.hooks.cache import hook_node

    return hook_node(source, cfg.paths.run_dir, log.warning)


def _start_mps(job: HookJob, scheduler: Scheduler, cfg: Config, devices: Sequence[JobDevice], node: Node,
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

    procs = _job_devices_procs(cfg, job, scheduler, devices, node, isolated)
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


def _drain_for_new_jobs(scheduler: Scheduler, name: str, node: Node, store: OutOfServiceStore,
                        log: HookLog) -> None:
    """GPUs taken out: drain the node for new jobs with the graceful path's reason (the monitor, or
    ``health --act``, rewrites gres.conf and resumes it once its running jobs end)."""
    from gpuslurm.state.out_of_service import gpu_out_reason

    out = store.read()
    present = {g.uuid for g in node.gpus}
    reason = gpu_out_reason(len(node.gpus), {u: r for u, r in out.items() if u in present})
    try:
        scheduler.drain_node(name, reason)
        log.error(f"drained {name} for new jobs: {reason}")
    except GpuslurmError as exc:
        log.error(f"could not drain {name} for new jobs ({exc}); the GPUs are recorded out of service")


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


def _job_devices_procs(cfg: Config, job: HookJob, scheduler: Scheduler, devices: Sequence[JobDevice],
                       node: Node, isolated: bool) -> str | None:
    """The devices cgroup the job's MPS daemon starts in (its ``cgroup.procs``), so the daemon and
    its servers never reach a GPU the job was not given. cgroup v1: gpuslurm's own (made by
    isolate_job just before) when gpuslurm isolates here; else the scheduler's job cgroup if it
    already exists; else (the scheduler constrains the tasks but has no job cgroup yet: Slurm
    22.05, also with ``PrologFlags=Contain``) one for the daemon alone. cgroup v2: always one for
    the daemon alone (``isolate.devices.mps_cgroup_v2`` says why). None with ``[cgroup] devices
    = "never"``."""
    import os

    from gpuslurm.isolate.cgroup_v1 import scheduler_devices_procs, v1_job_dir
    from gpuslurm.isolate.cgroupfs import cgroup_version
    from gpuslurm.isolate.devices import mps_cgroup_v1, mps_cgroup_v2

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
    found = scheduler_devices_procs(root, scheduler.devices_cgroup_v1_dirs(job))
    return found if found is not None else mps_cgroup_v1(cfg, job.job_id, devices, node)


def _release_mps_cgroup(cfg: Config, job_id: str, log: HookLog) -> None:
    """The prolog failed after making the daemon's own cgroup: remove it (the epilog may not run)."""
    from gpuslurm.isolate.devices import release_mps_cgroup

    try:
        if (path := release_mps_cgroup(cfg, job_id)) is not None:
            log.warning(f"removed the MPS daemon's cgroup {path}")
    except Exception as exc:  # the prolog's own error is the one to report
        log.error(f"cannot remove the MPS daemon's cgroup: {exc}")


def _stop_mps_after_failure(cfg: Config, job_id: str, log: HookLog) -> None:
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
