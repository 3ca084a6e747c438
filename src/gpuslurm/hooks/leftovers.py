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
from collections.abc import Callable, Mapping, Sequence

from gpuslurm.hw.live.procfs import PROC_ROOT
from gpuslurm.isolate.kill import Target
from gpuslurm.tuples import TYPE_CHECKING

if TYPE_CHECKING:
    from gpuslurm.hw.model.health import GpuProcess
    from gpuslurm.state.cgroup import CgroupJob


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


def plan_kills(listed: Sequence[tuple[str, GpuProcess]], job_id: str, job_uid: int,
               holders: Mapping[str, Sequence[tuple[str, int]]] | None, ignore_users: Sequence[str],
               listed_at: float, *, job_of_cgroup: Callable[[str], CgroupJob | None],
               proc_root: str = PROC_ROOT, job_sluid: str | None = None,
               ) -> tuple[list[Target], dict[tuple[str, int], tuple[str, str]]]:
    """Split the processes listed on the job's GPUs into targets and skipped ones.

    ``job_of_cgroup`` reads a ``/proc/PID/cgroup`` text in the scheduler's layout (its adapter's
    :meth:`~gpuslurm.state.scheduler.Scheduler.job_of_cgroup`).

    ``job_sluid`` is the job's SLUID (Slurm's Epilog environment, 25.11+): a process in a cgroup
    named by that SLUID (26.05's layout) is the job's; one named by any other SLUID is another
    job's, whichever that is, and so is one named by a SLUID when the job's own is unknown.

    ``listed_at`` is the boot-clock time the GPUs were listed: a process that started later only
    reuses a listed PID. A skipped process is ``gone``, ``other`` (not this job's) or ``kept``
    (left alive but still counted by the release check: PID 1, this hook's own tree, unreadable).
    """
    from gpuslurm.hw.live.procfs import ProcessProblem, read_process

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
        cg = job_of_cgroup(facts.cgroup)
        proc_job = None if cg is None else job_id if job_sluid and cg.sluid == job_sluid else cg.label
        why = leftover_verdict(facts.uid, proc_job, job_id, job_uid,
                               None if holders is None else holders.get(uuid, []))
        if why is None:
            # the owner seen now is checked again once the pidfd pins the process
            targets.append(Target(uuid, proc.pid, proc.user, facts.start_ticks, uid=facts.uid))
        else:
            skipped[key] = ("other", why)
    return targets, skipped


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
