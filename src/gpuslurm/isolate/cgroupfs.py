"""The cgroup mechanics gpuslurm's own device cgroups share, v1 and v2: which version a root
is, a job's cgroup name, moving a process in, and killing what is left before removing one."""

from __future__ import annotations

import os
import time


def job_name(job_id: str, kind: str = "job") -> str:
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


def write(path: str, text: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)


def join(path: str, pid: int, controllers: str, want: str) -> str | None:
    """Write ``pid`` into ``path``'s ``cgroup.procs`` and check ``/proc/PID/cgroup`` says ``want``
    for the hierarchy ``controllers`` ("" for the unified one); None when ``path`` does not exist."""
    from gpuslurm.errors import HardwareError
    from gpuslurm.hw.live.procfs import read_cgroup_text

    if not os.path.isdir(path):
        return None
    try:
        write(os.path.join(path, "cgroup.procs"), str(pid))
        lines = read_cgroup_text(pid).splitlines()
    except OSError as exc:
        raise HardwareError(f"cannot move process {pid} into {path}: {exc.strerror}") from None
    if not any(line.split(":", 2)[1:] == [controllers, want] for line in lines if line.count(":") >= 2):
        raise HardwareError(f"process {pid} is not in {path} after moving it")
    return path


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
