"""The epilog's leftovers: which processes on a job's GPUs are the job's, and killing them safely.

Leftovers are the processes listed on the job's physical GPUs, except those of users in
``[health.leftover_processes] ignore_users``, those in another job's cgroup, PID 1 and the
epilog's own ancestors and children. When another job still holds the GPU (MIG, sharing), only
processes that are provably this job's count (its cgroup, or its owner's when that user has no
other job there). A PID is signalled through a pidfd opened after checking that the process
started before the GPUs were listed, and verified again once the pidfd pins it, so a reused PID
is never signalled. A listed PID that is gone (or a zombie) is not a leftover.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

KILL_WAIT_S = 2.0  # after SIGKILL; a process still there by then is stuck in the kernel
SURVIVED = "survived SIGKILL"


class Target(NamedTuple):
    """A leftover to kill: the PID and the start time that identify the process."""

    gpu: str
    pid: int
    user: str | None
    start_ticks: int


def leftover_verdict(proc_uid: int, proc_job: str | None, job_id: str, job_uid: int,
                     others: Sequence[tuple[str, int]] | None) -> str | None:
    """Why a process on one of the job's GPUs is not the job's leftover; None when it is.

    ``proc_job`` is the job its cgroup names; ``others`` the (job id, uid) of the other jobs
    holding that GPU, None when unknown.
    """
    if proc_job is not None:
        return None if proc_job == job_id else f"it is in job {proc_job}'s cgroup"
    if others is not None and not others:
        return None  # the GPU was this job's alone: whatever still runs on it was left behind
    if proc_uid != job_uid:
        return "the GPU is shared and the process is not this job's"
    if others is None:
        return "the other jobs on this GPU cannot be read"
    if any(uid == job_uid for _, uid in others):
        return "its owner has another job on this GPU"
    return None


def plan_kills(listed: Sequence[tuple[str, Any]], job_id: str, job_uid: int,
               holders: Mapping[str, Sequence[tuple[str, int]]] | None, ignore_users: Sequence[str],
               listed_at: float, proc_root: str = "/proc",
               ) -> tuple[list[Target], dict[tuple[str, int], tuple[str, str]]]:
    """Split the processes listed on the job's GPUs into targets and skipped ones.

    ``listed_at`` is the boot-clock time the GPUs were listed: a process that started later only
    reuses a listed PID. A skipped process is ``gone``, ``other`` (not this job's) or ``kept``
    (left alive but still counted by the release check: PID 1, this hook's own tree, unreadable).
    """
    from gpuslurm.hw.procfs import ProcessProblem, read_process
    from gpuslurm.state.cgroup import parse_cgroup

    ticks = os.sysconf("SC_CLK_TCK")
    me = os.getpid()
    protected = _stat_chain(me, proc_root)[1] | {0, 1}
    ignored = set(ignore_users)
    targets: list[Target] = []
    skipped: dict[tuple[str, int], tuple[str, str]] = {}
    for uuid, proc in listed:
        key = (uuid, proc.pid)
        if proc.user is not None and proc.user in ignored:
            skipped[key] = ("other", f"user {proc.user} is in ignore_users")
            continue
        if proc.pid in protected:
            skipped[key] = ("kept", "PID 1 or this hook's own ancestor")
            continue
        facts = read_process(proc.pid, proc_root)
        if isinstance(facts, ProcessProblem):
            skipped[key] = ("gone" if facts.kind == "pid-gone" else "kept", facts.detail)
            continue
        if facts.start_ticks / ticks > listed_at + 2 / ticks:
            skipped[key] = ("gone", "started after the GPUs were listed: its PID was reused")
            continue
        state, lineage = _stat_chain(proc.pid, proc_root)
        if state in ("Z", "X"):
            skipped[key] = ("gone", "it has exited (a zombie holds no GPU)")
            continue
        if me in lineage:
            skipped[key] = ("kept", "a child of this hook")
            continue
        cg = parse_cgroup(facts.cgroup)
        why = leftover_verdict(facts.uid, cg.job_id if cg else None, job_id, job_uid,
                               None if holders is None else holders.get(uuid, []))
        if why is None:
            targets.append(Target(uuid, proc.pid, proc.user, facts.start_ticks))
        else:
            skipped[key] = ("other", why)
    return targets, skipped


def kill_processes(targets: Sequence[Target], grace_s: float, proc_root: str = "/proc",
                   kill_wait_s: float = KILL_WAIT_S) -> dict[int, str]:
    """SIGTERM, up to ``grace_s`` seconds, SIGKILL; the outcome per PID.

    Each process is pinned with a pidfd and its start time checked again before any signal, so a
    PID reused meanwhile is never signalled (it counts as gone).
    """
    import signal

    from gpuslurm.hw.procfs import ProcessProblem, read_identity

    out: dict[int, str] = {}
    fds: dict[int, int] = {}
    try:
        for t in targets:
            if t.pid in fds or t.pid in out:  # one process on several GPUs
                continue
            try:
                fd = os.pidfd_open(t.pid)
            except ProcessLookupError:
                out[t.pid] = "gone before it was signalled"
                continue
            except OSError as exc:  # ENOSYS before Linux 5.3: no safe way to signal
                out[t.pid] = f"not signalled: pidfd_open: {exc.strerror}"
                continue
            now = read_identity(t.pid, proc_root)
            if isinstance(now, ProcessProblem) or now.start_ticks != t.start_ticks:
                os.close(fd)
                out[t.pid] = "gone before it was signalled"
                continue
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


def _stat_chain(pid: int, proc_root: str) -> tuple[str, set[int]]:
    """The state letter of ``pid`` ("" if unreadable) and the set of it and its ancestors."""
    seen: set[int] = set()
    state = ""
    while pid > 0 and pid not in seen and len(seen) < 512:
        seen.add(pid)
        try:
            with open(f"{proc_root}/{pid}/stat", "rb") as fh:
                data = fh.read()
            fields = data[data.rindex(b")") + 2:].split()
            state = state or fields[0].decode()
            pid = int(fields[1])
        except (OSError, ValueError, IndexError):
            break
    return state, seen
