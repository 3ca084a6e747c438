"""The classic PBS prologue and epilogue: ``$PBS_HOME/mom_priv/prologue`` and ``epilogue``.

For sites without hooks. pbs_mom runs them as root (``run_pelog`` in OpenPBS's
``src/resmom/prolog.c``) with positional arguments: the prologue gets the job id, the user and the
group (3); the epilogue those, then the job name, session id, requested resources, resources used,
queue, account and exit status (10). They run the same neutral steps as the hook
(:func:`gpuslurm.hooks.prolog.job_start`, :func:`gpuslurm.hooks.epilog.job_end`), with PBS's
answer applied here with ``qmgr`` instead of through a hook event. What they cannot do: set the
job's environment (pbs_mom gives a prologue no way to), so no ``CUDA_VISIBLE_DEVICES``, and
therefore no choice of GPUs and no device cgroup.

Which GPUs the job has. PBS counts ``ngpus`` per vnode and assigns no device, and without
``CUDA_VISIBLE_DEVICES`` or a cgroup a job can open every GPU of its vnodes. So its GPUs are all
the GPUs of the vnodes where ``exec_vnode`` (``qstat -f -F json JOB``) gives it ``ngpus`` on this
host: NUMA node n's for gpuslurm's vnode ``HOST[n]``, every GPU of the host for any other vnode.
Those are health-gated, mapped (the job map, for the monitor), killed on and checked at the end.
Two jobs on one vnode share its GPUs: the end then kills only what is provably the job's.

Exit codes, as pbs_mom reads them (``start_exec.c``: a batch job's prologue exiting 1 aborts the
job, any other non-zero requeues it; an interactive job's is aborted on any non-zero):

* prologue: 0 the job runs; 2 bad input (arguments, job id, config); 3 a GPU fault took the
  job's vnodes offline (or the node could not be read); 4 a command failed (qstat, qmgr);
  70 a bug. Never 1: a node's fault must not delete the user's job, so every refusal requeues.
* epilogue: 0, or 1 when a fault needed a vnode offline and qmgr could not do it; 2 bad input;
  3, 4, 70 as above. pbs_mom ignores the epilogue's code except 2, which requeues a checkpointed
  job; pbs_mom never passes arguments that give 2.

Every line goes to stderr (the job's error file: pbs_mom opens it for both scripts) and syslog.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Mapping, Sequence

from gpuslurm.errors import (
    EXIT_PBS_REFUSED,
    EXIT_UNHEALTHY,
    EXIT_USAGE,
    GpuslurmError,
    HardwareError,
    InputError,
    exit_now,
)
from gpuslurm.tuples import TYPE_CHECKING

if TYPE_CHECKING:
    from typing import NoReturn, TextIO

    from gpuslurm.config import Config
    from gpuslurm.hooks.log import HookLog
    from gpuslurm.hw.source import HardwareSource
    from gpuslurm.pbs.answer import HookAnswer
    from gpuslurm.pbs.qstat import PbsJob
    from gpuslurm.state.job import HookJob

KINDS = {"prologue": 3, "epilogue": 10}  # the arguments pbs_mom passes (argv[1:])
MAX_ARG = 4096  # for the arguments read: the job id, user and group


def main(kind: str, argv: Sequence[str], environ: Mapping[str, str] | None = None,
         stderr: TextIO | None = None, mom_priv: str | None = None) -> int:
    """Run the ``kind`` script ("prologue", "epilogue") on pbs_mom's arguments; the exit code.

    ``mom_priv``: where the script is (default ``$PBS_HOME/mom_priv`` from pbs.conf); when
    gpuslurm's hook is enabled there, the hook does all of this and the script does nothing."""
    from gpuslurm.hooks.log import HookLog, guarded

    err = stderr if stderr is not None else sys.stderr
    env = os.environ if environ is None else environ
    if kind not in KINDS:
        print(f"gpuslurm pbs: unknown script {kind!r} (prologue or epilogue)", file=err)
        return EXIT_USAGE
    log = HookLog(f"pbs {kind}", stream=err)

    def step() -> int:
        args = check_args(kind, argv)
        log.job_id = args[0]
        if mom_priv is not None:
            here = mom_priv
        else:
            from gpuslurm.pbs.classic_install import pbs_home

            here = os.path.join(pbs_home(env), "mom_priv")
        if hook_enabled(here):
            log.info(f"gpuslurm's hook is enabled on this host: the {kind} leaves the job to it")
            return 0
        return _run(kind, args, env, log)

    return guarded(log, step)  # an error or a bug: one line, and the prologue fails closed (requeue)


def hook_enabled(mom_priv: str) -> bool:
    """Whether gpuslurm's PBS hook is enabled here (``mom_priv/hooks/gpuslurm.HK``, as pbs_mom
    keeps it): then execjob_begin and execjob_end do what the scripts would, and more."""
    try:
        with open(os.path.join(mom_priv, "hooks", "gpuslurm.HK"), "rb") as handle:
            lines = handle.read(1 << 16).decode(errors="replace").splitlines()
    except OSError:
        return False
    return any(line.replace(" ", "").lower() == "enabled=true" for line in lines)


def check_args(kind: str, argv: Sequence[str]) -> list[str]:
    """pbs_mom's arguments, checked: the count, the job id, the user name; InputError else."""
    from gpuslurm.pbs.scheduler import check_pbs_job_id

    want = KINDS[kind]
    args = list(argv)
    if len(args) != want:
        names = "JOBID USER GROUP" + (" JOBNAME SESSION RESOURCES USED QUEUE ACCOUNT EXIT"
                                      if kind == "epilogue" else "")
        raise InputError(f"the {kind} takes {want} arguments ({names}), as pbs_mom passes them; "
                         f"got {len(args)}", source="pbs_mom's arguments")
    # only the job id, user and group are read: the rest (job name, account, ...) are the user's
    # own text, unbounded by PBS (qsub -A), and must not stop the epilogue's clean-up
    if any(len(a) > MAX_ARG or "\0" in a for a in args[:3]):
        raise InputError("an argument is too long", source="pbs_mom's arguments")
    check_pbs_job_id(args[0])
    user = args[1]
    if not (0 < len(user) <= 64 and user.isascii() and user.isprintable() and " " not in user
            and not user.startswith("-")):
        raise InputError(f"not a user name: {user[:64]!r}", source="pbs_mom's arguments")
    return args


def _run(kind: str, args: list[str], environ: Mapping[str, str], log: HookLog) -> int:
    from gpuslurm.hooks.cache import load_hook_config
    from gpuslurm.pbs.answer import HookAnswer, PbsHookActions

    job_id, user = args[0], args[1]
    cfg = load_hook_config(environ, log.warning)
    from gpuslurm.hw.source import hardware_source

    source = hardware_source(nvml_library=cfg.paths.nvml_library, environ=environ)
    host = node_name(cfg)
    answer = HookAnswer()
    if kind == "prologue":
        from gpuslurm.state.jobmap import read_map

        if read_map(job_id, cfg.paths.jobs_dir) is not None:  # gpuslurm's execjob_begin chose them
            log.info("the job has a map already (gpuslurm's hook): the prologue leaves it to the hook")
            return 0
        pbs_job = _qstat_job(cfg, job_id)  # fails closed: which GPUs to gate is not known without it
        shares = gpu_shares(pbs_job, host)
        job = _hook_job(job_id, user, host, cfg, strict=True, uuids=_job_gpus(shares, host, source, cfg, log))
        actions = PbsHookActions(answer, tuple(v for v, _ in shares))
        from gpuslurm.hooks.prolog import job_start

        rc = job_start(job, actions, cfg, log, source, isolate=False)
        apply_offline(answer, cfg, log)  # a failure is logged; the job is refused all the same
        if rc == EXIT_UNHEALTHY:  # the core drained (here: vnodes offline) for a health fault
            return EXIT_PBS_REFUSED
        if rc != 0:
            return rc
        if not answer.accept:  # the core requeued or refused it (a GPU out of service)
            log.error(f"the job does not run here: {answer.message}")
            return EXIT_PBS_REFUSED
        return 0
    uuids: tuple[str, ...] | None = None
    vnodes: tuple[str, ...] = ()
    try:  # only for a job without a map (the prologue did not run): the end still cleans up
        shares = gpu_shares(_qstat_job(cfg, job_id), host)
        vnodes = tuple(v for v, _ in shares)
        uuids = _job_gpus(shares, host, source, cfg, log)
    except GpuslurmError as exc:
        log.warning(f"cannot read the job from qstat ({exc}); its map names its GPUs")
    job = _hook_job(job_id, user, host, cfg, strict=False, uuids=uuids)
    from gpuslurm.hooks.epilog import job_end

    rc = job_end(job, PbsHookActions(answer, vnodes), cfg, log, source, time.time())
    if apply_offline(answer, cfg, log):
        return EXIT_UNHEALTHY
    return rc


def node_name(cfg: Config) -> str:
    """PBS's name for this host: ``[monitor] node_name``, else the short host name."""
    import socket

    return cfg.monitor.node_name or socket.gethostname().split(".")[0]


def _qstat_job(cfg: Config, job_id: str) -> PbsJob:
    from gpuslurm.pbs.qstat import parse_qstat_json
    from gpuslurm.runner import run_command

    source = f"qstat -f -F json {job_id}"
    result = run_command([cfg.paths.qstat, "-f", "-F", "json", job_id], timeout=cfg.hooks.command_timeout_s)
    for job in parse_qstat_json(result.stdout, source):
        if job.job_id == job_id:
            return job
    raise InputError(f"the server does not list job {job_id}", source=source)


def gpu_shares(job: PbsJob, host: str) -> list[tuple[str, int]]:
    """The job's vnodes on ``host`` with their ``ngpus``, those without GPUs left out."""
    total: dict[str, int] = {}
    for share in job.vnodes_on(host):
        if n := share.count("ngpus"):
            total[share.vnode] = total.get(share.vnode, 0) + n
    return list(total.items())


def _job_gpus(shares: list[tuple[str, int]], host: str, source: HardwareSource, cfg: Config,
              log: HookLog) -> tuple[str, ...] | None:
    """Every GPU of the job's GPU vnodes here (module docstring) but those out of service (their
    vnode's ``ngpus`` no longer counts them: naming one would refuse every job placed there, a
    requeue loop); None when it has none here."""
    if not shares:
        return None
    from gpuslurm.hooks.cache import placement_node
    from gpuslurm.pbs.begin import out_of_service, vnode_shares

    node = placement_node(source, cfg.paths.run_dir, log.warning)
    out = out_of_service(cfg)
    uuids = tuple(dict.fromkeys(g.uuid for w in vnode_shares(node, host, tuple(shares))
                                for g in w.candidates if g.uuid.lower() not in out))
    if not uuids:
        raise HardwareError(f"the job has GPUs on vnode(s) {', '.join(v for v, _ in shares)}, "
                            f"but {host} has none there")
    return uuids


def _hook_job(job_id: str, user: str, host: str, cfg: Config, *, strict: bool,
              uuids: tuple[str, ...] | None) -> HookJob:
    """The neutral job; a user unknown here is an error in the prologue, the map's uid serves in
    the epilogue."""
    import pwd

    from gpuslurm.state.job import GpuClaim, HookJob

    try:
        entry = pwd.getpwnam(user)
        uid, gid = entry.pw_uid, entry.pw_gid
    except KeyError:
        from gpuslurm.state.jobmap import read_map

        jmap = None if strict else read_map(job_id, cfg.paths.jobs_dir)
        if jmap is None:
            raise InputError(f"user {user} of job {job_id} is unknown on {host}",
                             source="pbs_mom's arguments") from None
        uid, gid = jmap.uid, None
    gpus = GpuClaim(uuids=uuids, source="exec_vnode (qstat)") if uuids else None
    return HookJob(scheduler="pbs", job_id=job_id, uid=uid, user=user, node_name=host, gid=gid, gpus=gpus)


def apply_offline(answer: HookAnswer, cfg: Config, log: HookLog) -> bool:
    """Take the answer's vnodes offline with their comments (``qmgr``, as the hook's fallback);
    True when one could not be."""
    from gpuslurm.runner import run_command

    failed = False
    for vnode, comment in sorted(answer.offline.items()):
        if not _vnode_name(vnode):
            log.error(f"not a vnode name, left alone: {vnode[:80]!r}")
            failed = True
            continue
        text = comment.replace('"', "'")
        try:
            run_command([cfg.paths.qmgr, "-c", f'set node {vnode} state += offline, comment = "{text}"'],
                        timeout=cfg.hooks.command_timeout_s)
            log.error(f"vnode {vnode} offline: {text}")
        except GpuslurmError as exc:
            log.error(f"cannot take vnode {vnode} offline ({exc}): {text}")
            failed = True
    return failed


def _vnode_name(name: str) -> bool:
    """A vnode name qmgr takes unquoted: ``host``, ``host[3]``."""
    base, bracket, rest = name.partition("[")
    ok = 0 < len(base) <= 255 and all(c.isascii() and (c.isalnum() or c in "-_.") for c in base)
    return ok and (not bracket or (rest.endswith("]") and rest[:-1].isascii() and rest[:-1].isdigit()
                                   and len(rest) <= 6))


def run(kind: str | None = None, config: str | None = None, capture: str | None = None) -> NoReturn:
    """The installed scripts' entry (``run("prologue", config=...)``, arguments from ``sys.argv[1:]``),
    and ``python -m gpuslurm.pbs.classic prologue|epilogue ARGS...``."""
    argv = sys.argv[1:]
    # the installed script knows its kind, and mom_priv is where it is; by hand (-m): pbs.conf's
    mom_priv = os.path.dirname(os.path.abspath(sys.argv[0])) if kind is not None else None
    if kind is None:
        if not argv:
            print("usage: python -m gpuslurm.pbs.classic prologue|epilogue ARGS... "
                  "(as pbs_mom runs mom_priv/prologue and epilogue)", file=sys.stderr)
            sys.exit(EXIT_USAGE)
        kind, argv = argv[0], argv[1:]
    env = dict(os.environ)
    if config:
        env["GPUSLURM_CONFIG"] = config
    if capture:
        env["GPUSLURM_CAPTURE"] = capture
    exit_now(main(kind, argv, env, mom_priv=mom_priv), run_atexit=False)


if __name__ == "__main__":
    run()
