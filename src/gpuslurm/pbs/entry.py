"""The PBS hook's gpuslurm side: ``python -I -c 'from gpuslurm.pbs.entry import run; run()' EVENT``.

``plugins/pbs/gpuslurm_hook.py`` runs this with the event's JSON on stdin
(:mod:`gpuslurm.pbs.request`) and applies the JSON answer printed on stdout
(:mod:`gpuslurm.pbs.answer`). Each event builds a neutral :class:`gpuslurm.state.job.HookJob` and
runs the same steps the Slurm hooks run:

* ``exechost_startup``: the node's vnodes, one per NUMA node with its CPUs, memory and GPUs
  (:func:`gpuslurm.gres.pbs_vnodes.plan_vnodes`, the layout ``gpuslurm pbs-conf`` prints);
* ``execjob_begin``: chooses the job's GPUs and runs the prolog (:mod:`gpuslurm.pbs.begin`),
  which starts the job's MPS daemon when it asked for one (``-l gpuslurm_mps=true``);
* ``execjob_launch``: the task's environment from the job map (``CUDA_VISIBLE_DEVICES`` as UUIDs,
  ``CUDA_DEVICE_ORDER``, the gpuslurm hints, MPS), and the task joins the job's devices cgroup;
* ``execjob_attach``: a process attached to the job (``pbs_attach``) joins that cgroup;
* ``execjob_end``: the epilog (leftovers, release check, map removal, summary).

Exit codes: 0 with an answer on stdout (which may refuse the event); 2 bad input (the request,
the config); 3 the node could not be read; 4 a command failed; 70 a bug. Anything but 0 prints one
line on stderr (after the log lines, which go there too). What the hook does with a failure
depends on the event (docs/pbs.md): execjob_begin, execjob_launch and execjob_attach fail closed,
exechost_startup and execjob_end only log.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Sequence

from gpuslurm.errors import EXIT_OK, EXIT_USAGE, HardwareError, InputError, exit_now
from gpuslurm.tuples import TYPE_CHECKING

if TYPE_CHECKING:
    from typing import BinaryIO, NoReturn, TextIO

    from gpuslurm.config import Config
    from gpuslurm.hooks.log import HookLog
    from gpuslurm.hw.source import HardwareSource
    from gpuslurm.pbs.answer import HookAnswer
    from gpuslurm.pbs.request import PbsRequest
    from gpuslurm.state.job import HookJob

CODE = "from gpuslurm.pbs.entry import run; run()"  # what the hook runs with -I


def main(argv: Sequence[str] | None = None, stdin: BinaryIO | None = None, stdout: TextIO | None = None,
         stderr: TextIO | None = None) -> int:
    """Answer the event ``argv[0]`` names (default ``sys.argv[1:]``); the exit code."""
    from gpuslurm.hooks.log import HookLog, guarded
    from gpuslurm.pbs.request import EVENTS

    args = list(sys.argv[1:] if argv is None else argv)
    err = stderr if stderr is not None else sys.stderr
    if len(args) != 1 or args[0] not in EVENTS:
        print(f"usage: python -I -c '{CODE}' {{{','.join(EVENTS)}}} < request.json "
              "(run by gpuslurm's PBS hook)", file=err)
        return EXIT_USAGE
    event = args[0]
    log = HookLog(f"pbs {event}", stream=err)
    answers: list[HookAnswer] = []

    def step() -> int:
        answers.append(answer_event(event, stdin if stdin is not None else sys.stdin.buffer, log))
        return EXIT_OK

    rc = guarded(log, step)  # an error or a bug: one line; the hook fails closed where it must
    if rc != EXIT_OK:
        return rc
    out = stdout if stdout is not None else sys.stdout
    out.write(answers[0].to_json() + "\n")
    out.flush()
    return EXIT_OK


def answer_event(event: str, stdin: BinaryIO, log: HookLog) -> HookAnswer:
    """Read the request, run the event's steps; the answer (GpuslurmError when it cannot)."""
    from gpuslurm.hooks.cache import load_hook_config
    from gpuslurm.pbs.answer import HookAnswer
    from gpuslurm.pbs.request import read_request

    req = read_request(stdin, event)
    log.job_id = req.job_id
    cfg = load_hook_config(os.environ, log.warning)
    answer = HookAnswer()
    if event == "exechost_startup":
        _startup(req, cfg, _source(cfg), log, answer)
    elif event == "execjob_begin":
        _begin(req, cfg, _source(cfg), log, answer)
    elif event == "execjob_launch":
        _launch(req, cfg, _source(cfg), log, answer)
    elif event == "execjob_attach":
        _join(req, cfg, log)
    else:
        _end(req, cfg, _source(cfg), log, answer)
    return answer


def _source(cfg: Config) -> HardwareSource:
    """The node's hardware: the bundle ``GPUSLURM_CAPTURE`` names, else NVML from ``[paths]
    nvml_library`` (pbs_mom's hook process has no LD_LIBRARY_PATH either)."""
    from gpuslurm.hw.source import hardware_source

    return hardware_source(nvml_library=cfg.paths.nvml_library)


def _startup(req: PbsRequest, cfg: Config, source: HardwareSource, log: HookLog, answer: HookAnswer) -> None:
    """The NUMA vnodes, each GPU out of service (the record) taken from its vnode's ``ngpus``."""
    from gpuslurm.gres.pbs_vnodes import MEMORY_LEFT_OUT, has_migs, memory_known, plan_vnodes
    from gpuslurm.pbs.gpu_out import startup_counts
    from gpuslurm.state.out_of_service import OutOfServiceStore

    host = req.hostname
    node = source.node(links=False)
    counts = startup_counts(node, host, OutOfServiceStore(cfg.paths.state_dir).read())
    migs = has_migs(node)  # nmigs only where MIG instances are: a server may not have the resource
    answer.vnodes[host] = {"ncpus": 0, "mem": "0kb", "ngpus": 0}  # as pbs-conf: it all goes to NUMA vnodes
    if not memory_known(node):
        del answer.vnodes[host]["mem"]
        log.info(MEMORY_LEFT_OUT)
    if migs:
        answer.vnodes[host]["nmigs"] = 0
    for vnode in plan_vnodes(node):
        name = f"{host}[{vnode.numa_node}]"
        answer.vnodes[name] = {"ncpus": len(vnode.cpus), "ngpus": counts[name]}
        if vnode.memory_mib is not None:
            answer.vnodes[name]["mem"] = f"{vnode.memory_mib}mb"
        if migs:
            answer.vnodes[name]["nmigs"] = vnode.nmigs


def _begin(req: PbsRequest, cfg: Config, source: HardwareSource, log: HookLog, answer: HookAnswer) -> None:
    from gpuslurm.pbs.answer import PbsHookActions
    from gpuslurm.pbs.begin import run_begin
    from gpuslurm.pbs.request import local_shares

    job = _job(req, cfg, strict=True)
    if req.mps:
        log.info(f"the job asks for its own MPS daemon (gpuslurm_mps), share {job.mps_share}%")
    shares = local_shares(req)
    isolate = pbs_isolates(cfg, req, log)
    actions = PbsHookActions(answer, tuple(s.vnode for s in shares), pbs_cgroups=req.pbs_cgroups)
    rc = run_begin(job, tuple(shares), cfg, source, log, answer, actions, isolate)
    if rc != 0:  # a health fault the prolog found (and drained for), or its own refusal
        answer.reject(f"gpuslurm: the job cannot start on {req.hostname} (prolog exit {rc}; "
                      f"see pbs_mom's log)")


def _launch(req: PbsRequest, cfg: Config, source: HardwareSource, log: HookLog, answer: HookAnswer) -> None:
    from gpuslurm.pbs.request import local_shares
    from gpuslurm.state.jobmap import read_map

    job_id, _ = req.require_job()
    jmap = read_map(job_id, cfg.paths.jobs_dir)
    if jmap is None:
        if local_shares(req):
            raise InputError(f"job {job_id} has GPUs on {req.hostname} but no map: its execjob_begin "
                             "did not choose them (was the hook enabled after the job started?)",
                             source=cfg.paths.jobs_dir)
        answer.env["CUDA_VISIBLE_DEVICES"] = ""  # no GPUs here: CUDA sees none
    else:
        from gpuslurm.hooks.cache import hook_node
        from gpuslurm.hooks.taskprolog import task_devices, task_values
        from gpuslurm.state.job import GpuClaim

        devices = task_devices(GpuClaim(uuids=jmap.uuids, source="the job map"), job_id,
                               node=lambda: hook_node(source, cfg.paths.run_dir, log.warning),
                               run_dir=cfg.paths.run_dir, uid=jmap.uid)
        answer.env.update(task_values(devices, 0, run_dir=cfg.paths.run_dir, job_id=job_id,
                                      uid=jmap.uid))
    _join(req, cfg, log)


def _join(req: PbsRequest, cfg: Config, log: HookLog) -> None:
    """Move the task (or the attached process) into the job's devices cgroup, when it has one
    (cgroup v1: ``devices/gpuslurm/job_<id>``; v2: ``gpuslurm.pbs/job_<id>``)."""
    from gpuslurm.isolate.cgroup_v1 import join_v1
    from gpuslurm.isolate.cgroup_v2 import join_v2
    from gpuslurm.isolate.cgroupfs import cgroup_version

    job_id, _ = req.require_job()
    root = cfg.paths.cgroup_root
    version = cgroup_version(root)
    if version not in (1, 2):
        return
    if req.pid is None:
        raise InputError(f"pid is missing for {req.event}", source="PBS hook request")
    join = join_v1 if version == 1 else join_v2
    if req.event != "execjob_attach":  # execjob_launch: pbs_mom's own child, root's until it execs
        path = join(root, job_id, req.pid)  # HardwareError when it fails: the task must not run
    else:  # the pid the user gave pbs_attach, which pbs_mom checks only after its hooks ran
        path = _join_users_process(req, cfg, join)
    if path is not None:
        log.info(f"process {req.pid} joined {path}")


def _join_users_process(req: PbsRequest, cfg: Config, join: Callable[[str, str, int], str | None]
                        ) -> str | None:
    """``join`` the attached process only when it is the job's user's: every uid in
    ``/proc/PID/status`` (real, effective, saved, file system) the job's. pbs_mom runs execjob_attach
    with any pid ``pbs_attach -p`` names and refuses a stranger's only afterwards: moved into the
    job's cgroup, root's or another user's process would lose its GPUs and be killed at the job's
    end. The process is held by a pidfd while it is read and moved, so a pid reused in between is
    refused (InputError: exit 2, the attach refused)."""
    import signal

    from gpuslurm.hw.live.procfs import read_uids

    job_id, _ = req.require_job()
    pid = req.pid
    assert pid is not None
    uid = _job(req, cfg, strict=False).uid
    source = f"execjob_attach of job {job_id}"
    try:
        pidfd = os.pidfd_open(pid)
    except OSError as exc:
        raise InputError(f"process {pid}: {exc.strerror}", source=source) from None
    try:
        try:
            uids: tuple[int, ...] = read_uids(pid)
            signal.pidfd_send_signal(pidfd, 0)  # still the process the pidfd holds
        except OSError as exc:
            raise InputError(f"process {pid}: {exc.strerror}", source=source) from None
        except ValueError:  # no Uid line of four: never taken for the job's user's
            uids = ()
        if len(uids) != 4 or any(u != uid for u in uids):
            raise InputError(f"process {pid} is not the job's user's (uid {uid}): not attached",
                             source=source)
        other = _other_job(pid, job_id, source)
        if other is not None:  # the user's process of another job: it would leave that job's limits
            raise InputError(f"process {pid} is in job {other}'s cgroup: not attached", source=source)
        path = join(cfg.paths.cgroup_root, job_id, pid)
        try:
            signal.pidfd_send_signal(pidfd, 0)
        except OSError:
            raise InputError(f"process {pid} exited while it was attached", source=source) from None
        return path
    finally:
        os.close(pidfd)


def _other_job(pid: int, job_id: str, source: str) -> str | None:
    """The job other than ``job_id`` whose cgroup (the scheduler's or gpuslurm's) holds ``pid``."""
    from gpuslurm.hw.live.procfs import read_cgroup_text
    from gpuslurm.pbs.cgroup_paths import parse_cgroup_path

    try:
        text = read_cgroup_text(pid)
    except OSError as exc:
        raise InputError(f"process {pid}: {exc.strerror}", source=source) from None
    for line in text.splitlines():
        job = parse_cgroup_path(line.split(":", 2)[-1])
        if job is not None and job.job_id != job_id:
            return job.label  # a Slurm 26.05 SLUID path: some other scheduler's job, never this one
    return None


def _end(req: PbsRequest, cfg: Config, source: HardwareSource, log: HookLog, answer: HookAnswer) -> None:
    from gpuslurm.hooks.epilog import job_end
    from gpuslurm.pbs.answer import PbsHookActions
    from gpuslurm.pbs.request import local_shares

    job = _job(req, cfg, strict=False)
    actions = PbsHookActions(answer, tuple(s.vnode for s in local_shares(req)), pbs_cgroups=req.pbs_cgroups)
    job_end(job, actions, cfg, log, source, time.time())


def _job(req: PbsRequest, cfg: Config, *, strict: bool) -> HookJob:
    """The neutral job. A user unknown on this host is an error when ``strict`` (execjob_begin);
    otherwise (execjob_end) the uid the job's map recorded serves."""
    import pwd

    from gpuslurm.state.job import HookJob

    job_id, user = req.require_job()
    try:
        entry = pwd.getpwnam(user)
        uid, gid = entry.pw_uid, entry.pw_gid
    except KeyError:
        if strict:
            raise InputError(f"user {user} of job {job_id} is unknown on {req.hostname}",
                             source="PBS hook request") from None
        from gpuslurm.state.jobmap import read_map

        jmap = read_map(job_id, cfg.paths.jobs_dir)
        if jmap is None:
            raise InputError(f"user {user} of job {job_id} is unknown on {req.hostname}, and the job "
                             "has no map here", source="PBS hook request") from None
        uid, gid = jmap.uid, None
    # -l gpuslurm_mps=true: the scheduler's own MPS resource, as Slurm's gres/mps (the "gres"
    # trigger), at the config's share: PBS counts no share of a GPU
    share = str(cfg.mps.active_thread_percentage) if req.mps else None
    return HookJob(scheduler="pbs", job_id=job_id, uid=uid, user=user, node_name=req.hostname, gid=gid,
                   mps_share=share)


def pbs_isolates(cfg: Config, req: PbsRequest, log: HookLog) -> bool:
    """Whether gpuslurm makes the job's devices cgroup (``[cgroup] devices``, read for PBS).

    PBS jobs get no per-job cgroup unless PBS's cgroups hook makes one, so gpuslurm makes its own
    (cgroup v1: ``<root>/devices/gpuslurm/job_<id>``; v2: ``<root>/gpuslurm.pbs/job_<id>`` with a
    BPF device program), joined by the tasks in execjob_launch. ``auto``: when PBS's cgroups hook
    is not enabled here and the host has a v1 devices hierarchy or is a cgroup2 mount.
    ``always``: the same, and an error where it cannot (neither, or PBS's cgroups hook enabled: a
    process is in one devices cgroup, and two hooks would fight over it). ``never``: no.
    """
    from gpuslurm.isolate.cgroupfs import cgroup_version

    mode = cfg.cgroup.devices
    if mode == "never":
        return False
    version = cgroup_version(cfg.paths.cgroup_root)
    if mode == "always":
        if req.pbs_cgroups:
            raise InputError('[cgroup] devices = "always", but PBS\'s cgroups hook is enabled on this '
                             'host and confines the job\'s devices itself: use "auto" or "never"',
                             source=cfg.source or "config")
        if version not in (1, 2):
            raise HardwareError(f"{cfg.paths.cgroup_root}: [cgroup] devices = \"always\", but it is "
                                "neither a cgroup v1 devices hierarchy nor a cgroup2 mount")
        return True
    if req.pbs_cgroups:
        log.info("PBS's cgroups hook is enabled here: it confines the job's devices, gpuslurm does not")
        return False
    if version not in (1, 2):
        log.info(f"{cfg.paths.cgroup_root} is neither a cgroup v1 devices hierarchy nor a cgroup2 "
                 "mount: gpuslurm does not confine PBS jobs' devices here")
        return False
    return True


def run() -> NoReturn:
    """:func:`main` on ``sys.argv``, then leave as :func:`gpuslurm.hooks.entry.run` does.

    The cyclic garbage collector is off for the hook's short life: its passes over the objects
    every import makes cost a begin about as much as its own work (18 passes, ~1.5 ms on the DGX
    H100 replay; benchmarks/README.md), and everything the process allocates is bounded (the
    request and the caches are read bounded) and freed when it exits a moment later."""
    import gc

    gc.disable()
    exit_now(main())
