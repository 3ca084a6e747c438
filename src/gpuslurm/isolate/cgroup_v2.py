"""gpuslurm's own device limits on cgroup v2: a BPF device program on a job's cgroup.

On cgroup v2 the prolog attaches a BPF device program (``gpuslurm.isolate.bpf``) to the job's
cgroup under slurmd's stepd scope (``job_<id>``, or 26.05's ``s<SLUID>``: the Slurm adapter finds
which, :mod:`gpuslurm.slurm.cgroup_v2`), creating the directory Slurm will use when it has not yet;
Slurm later puts the job's steps below it, and the program holds for all of them, per job (a
step's own GPUs are Slurm's ``ConstrainDevices=yes``). No task-prolog step. Slurm makes every
directory there as root: the job's user can neither make a cgroup below nor move a process out,
and ``BPF_F_ALLOW_MULTI`` keeps the program in force under any program attached below.
A job's MPS daemon gets the same denials in a cgroup of its own, ``gpuslurm.mps/mps_<id>`` at
the v2 root (:func:`gpuslurm.isolate.devices.mps_cgroup_v2` says why there), which the epilog removes.

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
from collections.abc import Sequence

from gpuslurm.isolate import cgroupfs
from gpuslurm.tuples import TYPE_CHECKING

if TYPE_CHECKING:
    from gpuslurm.isolate.denylist import Device

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
    return os.path.join(cgroup_root, V2_MPS_PARENT, cgroupfs.job_name(job_id, "mps"))


def v2_pbs_dir(cgroup_root: str, job_id: str) -> str:
    """``<cgroup_root>/gpuslurm.pbs/job_<id>``: a PBS job's tasks, on cgroup v2."""
    return os.path.join(cgroup_root, V2_PBS_PARENT, cgroupfs.job_name(job_id))


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
        if os.path.isdir(path) and not cgroupfs.remove_cgroup(path):
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
    return cgroupfs.join(v2_pbs_dir(cgroup_root, job_id), pid, "",
                         f"/{V2_PBS_PARENT}/{cgroupfs.job_name(job_id)}")


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

