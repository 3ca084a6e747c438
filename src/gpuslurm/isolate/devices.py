"""gpuslurm's own GPU device isolation, for nodes where Slurm's cgroup.conf does not constrain devices:
the hook steps (whether to isolate, limit a job, release it, the MPS daemon's own cgroup).

What is denied: :mod:`gpuslurm.isolate.denylist` (pure); how: :mod:`gpuslurm.isolate.cgroup_v1`
(a ``devices`` cgroup the task prolog joins) and :mod:`gpuslurm.isolate.cgroup_v2` (a BPF device
program); each step imports only the half the node's cgroup version needs.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence

from gpuslurm.isolate.cgroupfs import cgroup_version, remove_cgroup
from gpuslurm.tuples import TYPE_CHECKING

if TYPE_CHECKING:
    from gpuslurm.config import Config
    from gpuslurm.hw.model.node import Node
    from gpuslurm.isolate.denylist import Device
    from gpuslurm.state.job import JobDevice

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
                node: Node, *, scheduler: str,
                v2_dir: Callable[[], Sequence[str] | None] | None = None) -> str:
    """The prolog's step: limit the job to ``given``; a line for the log. The caller has decided
    that gpuslurm isolates here (:func:`wanted` for Slurm; the PBS adapter decides for PBS).
    On cgroup v2 the job's cgroup is the scheduler's, which ``v2_dir`` finds (its adapter's
    :meth:`gpuslurm.state.scheduler.Scheduler.job_cgroup_v2`: for Slurm every place slurmstepd
    may make it, each getting the program), or, where ``v2_dir`` answers None (the scheduler makes
    the job none: PBS), gpuslurm's own (:func:`gpuslurm.isolate.cgroup_v2.v2_pbs_dir`).
    ``scheduler`` names it in errors.

    Any failure raises a GpuslurmError, so that the prolog fails and the job does not start
    with every GPU open.
    """
    from gpuslurm.errors import HardwareError

    denied = _denied_for(given, node)  # the MPS daemon's cgroups deny the same
    root = cfg.paths.cgroup_root
    version = cgroup_version(root)
    if version == 1:
        from gpuslurm.isolate.cgroup_v1 import setup_v1

        path = setup_v1(root, job_id, uid, denied)
    elif version == 2:
        from gpuslurm.isolate.cgroup_v2 import setup_own_v2, setup_v2, v2_pbs_dir

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
        from gpuslurm.isolate.cgroup_v1 import remove_v1, v1_job_dir

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
        from gpuslurm.isolate.cgroup_v2 import remove_v2, v2_pbs_dir

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
    from gpuslurm.hw.live.procfs import read_devices
    from gpuslurm.isolate.denylist import char_majors, denied_devices

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
    from gpuslurm.isolate.cgroup_v1 import setup_v1

    denied = _denied_for(given, node)
    return os.path.join(setup_v1(cfg.paths.cgroup_root, job_id, None, denied, kind="mps"), "cgroup.procs")


def mps_cgroup_v2(cfg: Config, job_id: str, given: Sequence[JobDevice], node: Node) -> str:
    """Make ``<cgroup_root>/gpuslurm.mps/mps_<id>`` with a BPF program denying what the job's
    tasks are denied (:func:`gpuslurm.isolate.denylist.denied_devices`, MIG capabilities
    included) and return its ``cgroup.procs``, which only root may write (the daemon's process
    joins before dropping to the user; its servers inherit it). Raises HardwareError (the prolog
    fails closed).

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
    from gpuslurm.isolate.cgroup_v2 import setup_mps_v2

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
        from gpuslurm.isolate.cgroup_v1 import v1_job_dir

        path = v1_job_dir(root, job_id, "mps")
    elif version == 2:
        from gpuslurm.isolate.cgroup_v2 import v2_mps_dir

        path = v2_mps_dir(root, job_id)
    else:
        return None
    if not os.path.isdir(path):
        return None
    if not remove_cgroup(path):
        raise HardwareError(f"{path}: processes of the job survive SIGKILL; left in place")
    return path
