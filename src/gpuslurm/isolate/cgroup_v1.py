"""gpuslurm's own device cgroups on cgroup v1 (the ``devices`` hierarchy).

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
in ``<cgroup_root>/devices/gpuslurm/mps_<id>`` (:func:`gpuslurm.isolate.devices.mps_cgroup_v1`),
which only root joins and the task prolog never does; the epilog removes it with the job's.
"""

from __future__ import annotations

import os

from gpuslurm.isolate import cgroupfs
from gpuslurm.tuples import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Sequence

    from gpuslurm.isolate.denylist import Device

DEFAULT_CGROUP_ROOT = "/sys/fs/cgroup"


V1_PARENT = "gpuslurm"  # our directory in the v1 devices hierarchy


def v1_job_dir(cgroup_root: str, job_id: str, kind: str = "job") -> str:
    """``job_<id>``: the job's tasks (the task prolog joins it); ``mps_<id>``: the job's MPS
    daemon alone, where Slurm constrains the tasks but has no job cgroup yet at prolog time."""
    return os.path.join(cgroup_root, "devices", V1_PARENT, cgroupfs.job_name(job_id, kind))


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
            cgroupfs.write(os.path.join(path, "devices.deny"), dev.v1_rule)
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
    return cgroupfs.join(v1_job_dir(cgroup_root, job_id), pid, "devices",
                         f"/{V1_PARENT}/{cgroupfs.job_name(job_id)}")


def remove_v1(cgroup_root: str, job_id: str, wait_s: float = 2.0, kind: str = "job") -> bool:
    """Kill what is left in the job's devices cgroup and remove it; False if it stays busy."""
    return cgroupfs.remove_cgroup(v1_job_dir(cgroup_root, job_id, kind), wait_s)



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


def configured_cgroup_root() -> str:
    """``[paths] cgroup_root`` of the site's config file at the default path (never the file a
    job's ``$GPUSLURM_CONFIG`` names); the standard root when the file is absent or sets none.

    This runs before every task that has no devices cgroup at the standard root, so the file is
    parsed (the schema and ``tomllib``: 3-15 ms of CPU a task) only when its text can name the
    key: a file without ``cgroup_root`` and without a backslash (an escape in a quoted key can
    spell it: TOML 1.0's ``\\u``, ``\\U``, TOML 1.1's ``\\x``) cannot set it."""
    from gpuslurm.configfile import DEFAULT_PATH, read_config_text

    text = read_config_text(DEFAULT_PATH, False)
    if text is None or ("cgroup_root" not in text and "\\" not in text):
        return DEFAULT_CGROUP_ROOT
    from gpuslurm.config import parse_config

    return parse_config(text, DEFAULT_PATH).paths.cgroup_root


def join_job_cgroup(job_id: str, pid: int) -> str | None:
    """The task prolog's step (v1): move the task ``pid`` into job ``job_id``'s devices cgroup, if
    there is one (the scheduler's adapter reads both from its hook environment).

    The standard cgroup root is tried first, then the one the site config file names. The
    task prolog's environment is the job's, so ``$GPUSLURM_CONFIG`` is ignored here: a job's own
    config file must not steer the task away from its cgroup.
    """
    path = join_v1(DEFAULT_CGROUP_ROOT, job_id, pid)
    if path is not None:
        return path
    try:
        configured = configured_cgroup_root()
    except Exception:  # a bad config must not stop the join at the standard root (tried above)
        return None
    return None if configured == DEFAULT_CGROUP_ROOT else join_v1(configured, job_id, pid)
