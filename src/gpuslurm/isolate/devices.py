"""gpuslurm's own GPU device isolation, for nodes where Slurm's cgroup.conf does not constrain devices.

What is denied (``denied_devices``, pure): the node's GPUs not given to the job (character major
195, the GPU's minor) and, for MIG, the ``nvidia-caps`` capability devices of MIG instances not
given. Everything else stays allowed (``/dev/nvidiactl``, ``nvidia-uvm``, ``/dev/null``...): a
deny list, as Slurm builds for GRES devices. A job without GPUs is denied every GPU.

How, on cgroup v1 (the ``devices`` hierarchy; verified in the real Slurm 22.05 test cluster).
With ``ConstrainDevices=no`` Slurm leaves every task in the root devices cgroup, and when the
prolog runs (as root, a child of slurmd) none of the job's processes exist yet, not even with
``PrologFlags=Contain``. So:

1. the prolog makes ``<cgroup_root>/devices/gpuslurm/job_<id>``, writes the denials to its
   ``devices.deny`` and only then hands ``cgroup.procs`` (nothing else) to the job's uid;
2. the task prolog, which slurmstepd runs as the user in a child of the task process before that
   process execs the user's program (``SLURM_TASK_PID`` is its parent), writes that pid into
   ``cgroup.procs``. v1 lets a process move one of its own uid into a cgroup whose
   ``cgroup.procs`` it may write; everything the task starts inherits the cgroup. The user
   cannot loosen it: ``devices.*`` are root's, a v1 child never has more than its parent, and
   leaving would need write access to another cgroup's ``cgroup.procs``;
3. the epilog kills what is left in the cgroup and removes it.

Where Slurm constrains the tasks instead, a job's MPS daemon still gets the same limits, alone,
in ``<cgroup_root>/devices/gpuslurm/mps_<id>`` (:func:`mps_cgroup_v1`), which only root joins
and the task prolog never does; the epilog removes it with the job's.

On cgroup v2 the prolog attaches a BPF device program (``gpuslurm.isolate.bpf``) to the job's
cgroup under slurmd's stepd scope (``job_<id>``, or 26.05's ``s<SLUID>``: the Slurm adapter finds
which, :mod:`gpuslurm.slurm.cgroup_v2`), creating the directory Slurm will use when it has not yet;
Slurm later puts the job's steps below it, and the program holds for all of them, per job (a
step's own GPUs are Slurm's ``ConstrainDevices=yes``). No task-prolog step. Slurm makes every
directory there as root: the job's user can neither make a cgroup below nor move a process out,
and ``BPF_F_ALLOW_MULTI`` keeps the program in force under any program attached below.
A job's MPS daemon gets the same denials in a cgroup of its own, ``gpuslurm.mps/mps_<id>`` at
the v2 root (:func:`mps_cgroup_v2` says why there), which the epilog removes.

PBS jobs have no scheduler's cgroup to attach to (unless PBS's cgroups hook runs, and then
gpuslurm leaves devices to it), so on cgroup v2 execjob_begin makes one of gpuslurm's own at the
v2 root, ``gpuslurm.pbs/job_<id>`` (:func:`setup_own_v2`, the same shape as the MPS daemon's),
with the BPF program attached before any process is in it; execjob_launch and execjob_attach
(root, in pbs_mom) move the task into it (:func:`join_v2`); ``cgroup.procs`` stays root's, so the
user can neither join another job's nor leave (moving needs write access to the common
ancestor's ``cgroup.procs``, the root's); execjob_end kills what is left and removes it.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence

from gpuslurm.tuples import TYPE_CHECKING, NamedTuple

if TYPE_CHECKING:
    from gpuslurm.config import Config
    from gpuslurm.hw.model import Node
    from gpuslurm.state.job import JobDevice

NVIDIA_MAJOR = 195
DEFAULT_CGROUP_ROOT = "/sys/fs/cgroup"
V1_PARENT = "gpuslurm"  # our directory in the v1 devices hierarchy


class Device(NamedTuple):
    """A character device number."""

    major: int
    minor: int

    @property
    def v1_rule(self) -> str:
        return f"c {self.major}:{self.minor} rwm"


# --- pure decisions ---------------------------------------------------------------------------


def char_majors(proc_devices: str) -> dict[str, int]:
    """Character device majors by driver name, from the text of ``/proc/devices``."""
    majors: dict[str, int] = {}
    in_char = False
    for line in proc_devices.splitlines():
        text = line.strip()
        if text.endswith(":"):
            in_char = text == "Character devices:"
            continue
        number, _, name = text.partition(" ")
        if in_char and number.isdigit() and name.strip():
            majors.setdefault(name.strip(), int(number))
    return majors


def denied_devices(node: Node, given: Sequence[JobDevice], caps_major: int | None) -> tuple[Device, ...]:
    """The devices a job holding ``given`` must not open on ``node``.

    ``caps_major`` is the ``nvidia-caps`` major, or None when that driver is not loaded: then no
    capability device can be opened anyway and none is listed. A MIG instance of another job on
    a GPU this job uses is reachable through the shared ``/dev/nvidia<minor>``, so its capability
    minors must be known; ValueError when they are not.
    """
    mine_gpus = {d.gpu.minor for d in given}
    allowed_caps: set[int] = set()
    for d in given:
        if d.mig is not None:
            allowed_caps.update(m for m in (d.mig.gi_minor, d.mig.ci_minor) if m is not None)
    given_migs = {(d.gpu.uuid, d.mig.gi_id, d.mig.ci_id) for d in given if d.mig is not None}
    denied = {Device(NVIDIA_MAJOR, g.minor) for g in node.gpus if g.minor not in mine_gpus}
    for gpu in node.gpus:
        for mig in gpu.mig_devices:
            if (gpu.uuid, mig.gi_id, mig.ci_id) in given_migs:
                continue
            caps = [m for m in (mig.gi_minor, mig.ci_minor) if m is not None]
            if len(caps) < 2 and gpu.minor in mine_gpus and caps_major is not None:
                raise ValueError(f"MIG device {mig.gi_id}/{mig.ci_id} of GPU {gpu.index} has no "
                                 f"capability minors (mig-minors): it cannot be denied")
            if caps_major is not None:
                denied.update(Device(caps_major, m) for m in caps if m not in allowed_caps)
    return tuple(sorted(denied))


# --- cgroup v1 --------------------------------------------------------------------------------


def _job_name(job_id: str, kind: str = "job") -> str:
    """``<kind>_<id>`` for a Slurm or a PBS job id (``job_123``, ``mps_45.pbshost``)."""
    from gpuslurm.jobid import valid_job_id

    if not valid_job_id(job_id):
        raise ValueError(f"not a Slurm job id (nor a PBS one): {job_id!r}")
    return f"{kind}_{job_id}"


def cgroup_version(cgroup_root: str) -> int | None:
    """1 when ``cgroup_root`` has a v1 ``devices`` hierarchy, 2 when it is a cgroup2 mount."""
    if os.path.exists(os.path.join(cgroup_root, "devices", "devices.deny")):
        return 1
    if os.path.exists(os.path.join(cgroup_root, "cgroup.controllers")):
        return 2
    return None


def v1_job_dir(cgroup_root: str, job_id: str, kind: str = "job") -> str:
    """``job_<id>``: the job's tasks (the task prolog joins it); ``mps_<id>``: the job's MPS
    daemon alone, where Slurm constrains the tasks but has no job cgroup yet at prolog time."""
    return os.path.join(cgroup_root, "devices", V1_PARENT, _job_name(job_id, kind))


def _write(path: str, text: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)


def setup_v1(cgroup_root: str, job_id: str, uid: int | None, denied: Sequence[Device],
             kind: str = "job") -> str:
    """Make the job's devices cgroup with ``denied`` written, joinable by ``uid`` (None: by root
    only); its path.

    A cgroup left by an earlier run of the same job id is emptied and made afresh.
    """
    from gpuslurm.errors import HardwareError

    path = v1_job_dir(cgroup_root, job_id, kind)
    try:
        try:  # only ours: the devices hierarchy itself must already be mounted
            os.mkdir(os.path.dirname(path), 0o755)
        except FileExistsError:
            pass
        if os.path.isdir(path) and not remove_v1(cgroup_root, job_id, kind=kind):
            raise HardwareError(f"{path}: left by an earlier job and still busy")
        os.mkdir(path, 0o755)
    except OSError as exc:
        raise HardwareError(f"cannot make the job's devices cgroup {path}: {exc.strerror}") from None
    try:
        for dev in denied:  # the kernel takes one rule per write
            _write(os.path.join(path, "devices.deny"), dev.v1_rule)
        # Last: until now no process of the job's user could enter it half-configured.
        if uid is not None:
            os.chown(os.path.join(path, "cgroup.procs"), uid, -1, follow_symlinks=False)
    except OSError as exc:
        try:
            os.rmdir(path)
        except OSError:
            pass
        raise HardwareError(f"cannot set up the job's devices cgroup {path}: {exc.strerror}") from None
    return path


def join_v1(cgroup_root: str, job_id: str, pid: int) -> str | None:
    """Move ``pid`` into the job's devices cgroup; its path, or None when the job has none."""
    return _join(v1_job_dir(cgroup_root, job_id), pid, "devices", f"/{V1_PARENT}/{_job_name(job_id)}")


def _join(path: str, pid: int, controllers: str, want: str) -> str | None:
    """Write ``pid`` into ``path``'s ``cgroup.procs`` and check ``/proc/PID/cgroup`` says ``want``
    for the hierarchy ``controllers`` ("" for the unified one); None when ``path`` does not exist."""
    from gpuslurm.errors import HardwareError
    from gpuslurm.hw.procfs import read_cgroup_text

    if not os.path.isdir(path):
        return None
    try:
        _write(os.path.join(path, "cgroup.procs"), str(pid))
        lines = read_cgroup_text(pid).splitlines()
    except OSError as exc:
        raise HardwareError(f"cannot move process {pid} into {path}: {exc.strerror}") from None
    if not any(line.split(":", 2)[1:] == [controllers, want] for line in lines if line.count(":") >= 2):
        raise HardwareError(f"process {pid} is not in {path} after moving it")
    return path


def remove_v1(cgroup_root: str, job_id: str, wait_s: float = 2.0, kind: str = "job") -> bool:
    """Kill what is left in the job's devices cgroup and remove it; False if it stays busy."""
    return remove_cgroup(v1_job_dir(cgroup_root, job_id, kind), wait_s)


# --- cgroup v2 --------------------------------------------------------------------------------


def setup_v2(path: str, denied: Sequence[Device]) -> str:
    """Attach a program denying ``denied`` to the job's v2 cgroup ``path`` (the scheduler's, found
    by its adapter; made if missing, its parent must exist); ``path``.

    Attached with ``BPF_F_ALLOW_MULTI`` (:mod:`gpuslurm.isolate.bpf`): it runs for every cgroup
    below, whatever programs Slurm or anyone attaches there, so no step, task or sub-cgroup of the
    job escapes it.
    """
    from gpuslurm.errors import HardwareError
    from gpuslurm.isolate.bpf import deny_devices

    parent = os.path.dirname(path)
    if not os.path.isdir(parent):
        raise HardwareError(f"{parent} does not exist: is slurmd using cgroup/v2 there? "
                            f"(set cgroup.v2_job_parent)")
    try:
        try:
            os.mkdir(path, 0o755)
        except FileExistsError:
            pass
        deny_devices(path, [(d.major, d.minor) for d in denied])
    except OSError as exc:
        raise HardwareError(f"cannot set up the job's cgroup {path}: {exc.strerror}") from None
    return path


V2_MPS_PARENT = "gpuslurm.mps"  # our directory at the v2 root: the MPS daemons' own cgroups
V2_PBS_PARENT = "gpuslurm.pbs"  # and PBS jobs' own (no scheduler's cgroup to attach to)


def v2_mps_dir(cgroup_root: str, job_id: str) -> str:
    """``<cgroup_root>/gpuslurm.mps/mps_<id>``: the job's MPS daemon alone (see :func:`mps_cgroup_v2`)."""
    return os.path.join(cgroup_root, V2_MPS_PARENT, _job_name(job_id, "mps"))


def v2_pbs_dir(cgroup_root: str, job_id: str) -> str:
    """``<cgroup_root>/gpuslurm.pbs/job_<id>``: a PBS job's tasks, on cgroup v2."""
    return os.path.join(cgroup_root, V2_PBS_PARENT, _job_name(job_id))


def setup_mps_v2(cgroup_root: str, job_id: str, denied: Sequence[Device]) -> str:
    """Make ``gpuslurm.mps/mps_<id>`` with a program denying ``denied`` attached; its path."""
    return setup_own_v2(v2_mps_dir(cgroup_root, job_id), denied, "the MPS daemon's cgroup")


def setup_own_v2(path: str, denied: Sequence[Device], what: str = "the job's cgroup") -> str:
    """Make ``path`` (``<root>/gpuslurm.<kind>/<name>``, a cgroup of gpuslurm's own at the v2
    root) with a program denying ``denied`` attached; ``path``.

    The parent is made root's (0755) when missing and must be a directory of root's, no link; a
    cgroup left by an earlier run of the same job id is emptied (SIGKILL) and made afresh. The
    program is attached before any process can be in it; ``cgroup.procs`` stays root's.
    """
    import stat

    from gpuslurm.errors import HardwareError
    from gpuslurm.isolate.bpf import deny_devices

    parent = os.path.dirname(path)
    try:
        try:
            os.mkdir(parent, 0o755)
        except FileExistsError:
            pass
        st = os.lstat(parent)
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != 0:
            raise HardwareError(f"{parent}: not a cgroup directory of root's")
        if os.path.isdir(path) and not remove_cgroup(path):
            raise HardwareError(f"{path}: left by an earlier job and still busy")
        os.mkdir(path, 0o755)
    except OSError as exc:
        raise HardwareError(f"cannot make {what} {path}: {exc.strerror}") from None
    try:
        deny_devices(path, [(d.major, d.minor) for d in denied])
    except (OSError, HardwareError) as exc:
        try:
            os.rmdir(path)
        except OSError:
            pass
        why = exc.strerror if isinstance(exc, OSError) else str(exc)
        raise HardwareError(f"cannot limit {what} {path}: {why}") from None
    return path


def join_v2(cgroup_root: str, job_id: str, pid: int) -> str | None:
    """Move ``pid`` into the PBS job's own v2 cgroup (as root); its path, or None when it has none."""
    return _join(v2_pbs_dir(cgroup_root, job_id), pid, "", f"/{V2_PBS_PARENT}/{_job_name(job_id)}")


def remove_cgroup(path: str, wait_s: float = 2.0) -> bool:
    """Kill what is left in the cgroup at ``path`` (v1 or v2) and remove it; False if it stays busy.

    Killing, not moving out: a process moved to the root cgroup would regain every GPU.
    """
    deadline = time.monotonic() + wait_s
    while True:
        try:
            os.rmdir(path)
            return True
        except FileNotFoundError:
            return True
        except OSError:
            if time.monotonic() > deadline:
                return False
        try:
            with open(os.path.join(path, "cgroup.procs")) as fh:
                pids = [int(p) for p in fh.read().split()]
        except FileNotFoundError:
            return True
        import signal  # only now: an enum-heavy module the hooks need only to kill

        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.02)


def remove_v2(path: str) -> bool:
    """Remove the job's v2 cgroup ``path`` if it is empty (Slurm normally has); the program goes
    with it."""
    try:
        os.rmdir(path)
    except FileNotFoundError:
        return True
    except OSError:
        return False  # still in use, or Slurm's children left: Slurm removes it
    return True


# --- the hook steps ---------------------------------------------------------------------------


def wanted(cfg: Config, scheduler_constrains: Callable[[], bool]) -> bool:
    """Whether this node's config asks gpuslurm to isolate devices: ``[cgroup] devices`` is
    ``always``, ``never``, or ``auto``: when the scheduler does not (``scheduler_constrains``: the
    adapter's :meth:`gpuslurm.state.scheduler.Scheduler.constrains_devices`, asked only then)."""
    mode = cfg.cgroup.devices
    if mode == "never":
        return False
    if mode == "always":
        return True
    if mode == "auto":
        return not scheduler_constrains()
    raise ValueError(f"unknown cgroup.devices mode {mode!r}")


def isolate_job(cfg: Config, job_id: str, uid: int, given: Sequence[JobDevice],
                node: Node, scheduler: str = "slurm",
                v2_dir: Callable[[], Sequence[str] | None] | None = None) -> str:
    """The prolog's step: limit the job to ``given``; a line for the log. The caller has decided
    that gpuslurm isolates here (:func:`wanted` for Slurm; the PBS adapter decides for PBS).
    On cgroup v2 the job's cgroup is the scheduler's, which ``v2_dir`` finds (its adapter's
    :meth:`gpuslurm.state.scheduler.Scheduler.job_cgroup_v2`: for Slurm every place slurmstepd
    may make it, each getting the program), or, where ``v2_dir`` answers None (the scheduler makes
    the job none: PBS), gpuslurm's own (:func:`v2_pbs_dir`). ``scheduler`` names it in errors.

    Any failure raises a GpuslurmError, so that the prolog fails and the job does not start
    with every GPU open.
    """
    from gpuslurm.errors import HardwareError

    denied = _denied_for(given, node)  # the MPS daemon's cgroups deny the same
    root = cfg.paths.cgroup_root
    version = cgroup_version(root)
    if version == 1:
        path = setup_v1(root, job_id, uid, denied)
    elif version == 2:
        if v2_dir is None:
            raise HardwareError(f"{scheduler}: no way to find the job's cgroup v2 directory")
        paths = v2_dir()
        if paths is None:  # the scheduler makes the job no cgroup: gpuslurm's own
            path = setup_own_v2(v2_pbs_dir(root, job_id), denied)
        elif not paths:
            raise HardwareError(f"{scheduler}: no cgroup v2 directory found for the job")
        else:
            path = ", ".join(setup_v2(p, denied) for p in paths)
    else:
        raise HardwareError(f"{root}: neither a cgroup v1 devices hierarchy nor a cgroup2 mount")
    return f"devices cgroup {path}: {len(denied)} device(s) denied"


def release_job(cfg: Config, job_id: str, v2_dir: Callable[[], Sequence[str]] | None = None) -> str | None:
    """The epilog's step: remove the job's cgroup; a line for the log, or None if there was none.
    ``v2_dir``: the scheduler's v2 job directories that exist (each removed when empty)."""
    from gpuslurm.errors import HardwareError

    root = cfg.paths.cgroup_root
    version = cgroup_version(root)
    if version == 1:
        done = []
        for kind in ("job", "mps"):
            path = v1_job_dir(root, job_id, kind)
            if not os.path.isdir(path):
                continue
            if not remove_v1(root, job_id, kind=kind):
                raise HardwareError(f"{path}: processes of the job survive SIGKILL; left in place")
            done.append(path)
        return f"removed {', '.join(done)}" if done else None
    if version == 2:
        done = []
        for slurms in v2_dir() if v2_dir is not None else ():
            if os.path.isdir(slurms) and remove_v2(slurms):
                done.append(slurms)
        own = v2_pbs_dir(root, job_id)  # a PBS job's: killing what is left, as on v1
        if os.path.isdir(own):
            if not remove_cgroup(own):
                raise HardwareError(f"{own}: processes of the job survive SIGKILL; left in place")
            done.append(own)
        if (mps := release_mps_cgroup(cfg, job_id)) is not None:
            done.append(mps)
        return f"removed {', '.join(done)}" if done else None
    return None


def _denied_for(given: Sequence[JobDevice], node: Node) -> tuple[Device, ...]:
    from gpuslurm.errors import HardwareError
    from gpuslurm.hw.procfs import read_devices

    caps_major = char_majors(read_devices() or "").get("nvidia-caps")
    try:
        return denied_devices(node, given, caps_major)
    except ValueError as exc:
        raise HardwareError(str(exc)) from None


def mps_cgroup_v1(cfg: Config, job_id: str, given: Sequence[JobDevice], node: Node) -> str:
    """Make ``mps_<id>``, the job's limits for its MPS daemon alone, and return its
    ``cgroup.procs`` (only root may join it: the daemon's process does, before dropping to the
    user). For nodes where Slurm constrains the tasks' devices but, in 22.05, makes no job cgroup
    before the prolog, not even with ``PrologFlags=Contain``; the task prolog never joins it, so
    Slurm's per-step limits stay Slurm's. Raises HardwareError (the prolog fails closed)."""
    denied = _denied_for(given, node)
    return os.path.join(setup_v1(cfg.paths.cgroup_root, job_id, None, denied, kind="mps"), "cgroup.procs")


def mps_cgroup_v2(cfg: Config, job_id: str, given: Sequence[JobDevice], node: Node) -> str:
    """Make ``<cgroup_root>/gpuslurm.mps/mps_<id>`` with a BPF program denying what the job's
    tasks are denied (:func:`denied_devices`, MIG capabilities included) and return its
    ``cgroup.procs``, which only root may write (the daemon's process joins before dropping to
    the user; its servers inherit it). Raises HardwareError (the prolog fails closed).

    Why a cgroup of its own, at the v2 root, also where gpuslurm isolates the job: a v2 process
    is in one cgroup for every controller, and the places under ``[cgroup] v2_job_parent`` are
    Slurm's. Its cgroup/v2 plugin enables controllers in ``job_<id>/cgroup.subtree_control``,
    which the kernel refuses while a process sits in ``job_<id>`` itself (no internal
    processes), and removes the job's directories itself; in 22.05 there is none yet while the
    prolog runs. A root-owned ``gpuslurm.mps`` at the root (as Docker's cgroupfs driver keeps
    ``docker/``) is outside every systemd unit and Slurm's scope, so neither moves the daemon
    out, and the user can leave it only by writing a ``cgroup.procs`` of root's. The BPF
    program composes with any above (``BPF_F_ALLOW_MULTI``); the epilog removes the cgroup.
    """
    return os.path.join(setup_mps_v2(cfg.paths.cgroup_root, job_id, _denied_for(given, node)),
                        "cgroup.procs")


def release_mps_cgroup(cfg: Config, job_id: str) -> str | None:
    """Remove the MPS daemon's own cgroup (v1 ``mps_<id>`` or v2 ``gpuslurm.mps/mps_<id>``),
    killing what is left in it; its path, or None when there was none. HardwareError when
    processes survive SIGKILL (left in place)."""
    from gpuslurm.errors import HardwareError

    root = cfg.paths.cgroup_root
    version = cgroup_version(root)
    if version == 1:
        path = v1_job_dir(root, job_id, "mps")
    elif version == 2:
        path = v2_mps_dir(root, job_id)
    else:
        return None
    if not os.path.isdir(path):
        return None
    if not remove_cgroup(path):
        raise HardwareError(f"{path}: processes of the job survive SIGKILL; left in place")
    return path


def scheduler_devices_procs(cgroup_root: str, relative_dirs: Sequence[str]) -> str | None:
    """The ``cgroup.procs`` of the first of ``relative_dirs`` (below the v1 ``devices`` mount)
    that exists as a directory chain root owns, no link in it; None when none does (no v1, the
    scheduler does not constrain devices, or made no job cgroup yet)."""
    import stat

    top = os.path.join(cgroup_root, "devices")
    for rel in relative_dirs:
        path = top
        for part in rel.split("/"):
            path = os.path.join(path, part)
            try:
                st = os.lstat(path)
            except OSError:
                break
            if not stat.S_ISDIR(st.st_mode) or st.st_uid != 0:
                break
        else:
            procs = os.path.join(path, "cgroup.procs")
            if os.path.isfile(procs):
                return procs
    return None


def join_job_cgroup(job_id: str, pid: int) -> str | None:
    """The task prolog's step (v1): move the task ``pid`` into job ``job_id``'s devices cgroup, if
    there is one (the scheduler's adapter reads both from its hook environment).

    The standard cgroup root is always tried, besides the one the site config file names. The
    task prolog's environment is the job's, so ``$GPUSLURM_CONFIG`` is ignored here: a job's own
    config file must not steer the task away from its cgroup.
    """
    roots = [DEFAULT_CGROUP_ROOT]
    try:
        from gpuslurm.config import load_config

        configured = load_config(environ={}).paths.cgroup_root  # the site's file, never the job's
        if configured != DEFAULT_CGROUP_ROOT:
            roots.append(configured)
    except Exception:  # a bad config must not stop the join at the standard root
        roots = [DEFAULT_CGROUP_ROOT]
    for root in roots:
        path = join_v1(root, job_id, pid)
        if path is not None:
            return path
    return None
