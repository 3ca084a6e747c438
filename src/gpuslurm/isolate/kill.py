"""Kill processes safely: each pinned with a pidfd, its start time (and owner) checked again once
pinned, so a PID reused meanwhile by another process, root's or another user's, is never signalled.

Used by the epilog's leftovers, the monitor's rogue kills and MPS stop.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping, Sequence

from gpuslurm.hw.live.procfs import PROC_ROOT
from gpuslurm.tuples import NamedTuple

KILL_WAIT_S = 2.0  # after SIGKILL; a process still there by then is stuck in the kernel
SURVIVED = "survived SIGKILL"


class Target(NamedTuple):
    """A process to kill: the PID and the start time that identify it, and (``uid``) the real uid
    it must still have once pinned (None: any)."""

    gpu: str
    pid: int
    user: str | None
    start_ticks: int
    uid: int | None = None


def kill_processes(targets: Sequence[Target], grace_s: float, proc_root: str = PROC_ROOT,
                   kill_wait_s: float = KILL_WAIT_S) -> dict[int, str]:
    """SIGTERM, up to ``grace_s`` seconds, SIGKILL; the outcome per PID.

    Each process is pinned with a pidfd and its start time (and ``uid``) checked again before any
    signal, so a PID reused meanwhile is never signalled (it counts as gone).
    """
    import signal

    out: dict[int, str] = {}
    fds: dict[int, int] = {}
    try:
        for t in targets:
            if t.pid in fds or t.pid in out:  # one process on several GPUs
                continue
            fd_or_why = pin(t, proc_root)
            if isinstance(fd_or_why, str):
                out[t.pid] = fd_or_why
                continue
            fd = fd_or_why
            fds[t.pid] = fd
        alive = _signal_and_wait(fds, signal.SIGTERM, grace_s)
        out.update({pid: "exited after SIGTERM" for pid in fds if pid not in alive})
        left = _signal_and_wait(alive, signal.SIGKILL, kill_wait_s)
        out.update({pid: SURVIVED if pid in left else "killed with SIGKILL" for pid in alive})
    finally:
        for fd in fds.values():
            os.close(fd)
    return out


def _signal_and_wait(fds: Mapping[int, int], sig: int, timeout_s: float) -> dict[int, int]:
    """Signal every pidfd; the ones whose process has not exited within ``timeout_s``."""
    import select
    import signal

    if not fds:
        return {}
    poller = select.poll()
    by_fd = {}
    for pid, fd in fds.items():
        try:
            signal.pidfd_send_signal(fd, sig)
        except ProcessLookupError:
            pass  # exited already: the poll below sees it
        poller.register(fd, select.POLLIN)
        by_fd[fd] = pid
    deadline = time.monotonic() + timeout_s
    while by_fd:
        left = deadline - time.monotonic()
        for fd, _ in poller.poll(max(0, int(left * 1000))):  # a pidfd is readable once its process exits
            poller.unregister(fd)
            by_fd.pop(fd, None)
        if left <= 0:
            break
    return {pid: fd for fd, pid in by_fd.items()}


def pin(t: Target, proc_root: str = PROC_ROOT) -> int | str:
    """A pidfd for ``t`` if it still is that process (start time, and owner when given); else why not."""
    from gpuslurm.hw.live.procfs import ProcessProblem, read_identity

    try:
        fd = os.pidfd_open(t.pid)
    except ProcessLookupError:
        return "gone before it was signalled"
    except OSError as exc:  # ENOSYS before Linux 5.3: no safe way to signal
        return f"not signalled: pidfd_open: {exc.strerror}"
    now = read_identity(t.pid, proc_root)
    if (isinstance(now, ProcessProblem) or now.start_ticks != t.start_ticks
            or (t.uid is not None and real_uid(t.pid, proc_root) != t.uid)):
        os.close(fd)
        return "gone before it was signalled"
    return fd


def send_signal(targets: Sequence[Target], sig: int, proc_root: str = PROC_ROOT) -> list[int]:
    """Send ``sig`` once to each target still the same process (and owner); the PIDs signalled."""
    import signal

    sent = []
    for t in targets:
        fd = pin(t, proc_root)
        if isinstance(fd, str):
            continue
        try:
            signal.pidfd_send_signal(fd, sig)
            sent.append(t.pid)
        except ProcessLookupError:
            pass
        finally:
            os.close(fd)
    return sent


def real_uid(pid: int, proc_root: str = PROC_ROOT) -> int | None:
    """The real uid of a live process (None for one gone or a zombie)."""
    from gpuslurm.hw.live.procfs import ProcessProblem, read_status

    status = read_status(pid, proc_root)
    return None if isinstance(status, ProcessProblem) or not status.alive else status.uid
