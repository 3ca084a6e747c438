"""The only module that runs external commands.

Every call takes an absolute path (hooks run with no PATH), never a shell, and a timeout that
kills the whole process group, so a hung ``nvidia-smi`` cannot hang a prolog.
"""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from gpuslurm.errors import CommandError

DEFAULT_TIMEOUT = 10.0


@dataclass(frozen=True, slots=True)
class CommandResult:
    argv: tuple[str, ...]
    returncode: int
    stdout: str
    stderr: str


def run_command(argv: list[str] | tuple[str, ...], *, timeout: float = DEFAULT_TIMEOUT,
                check: bool = True, env: dict[str, str] | None = None,
                input_text: str | None = None, user: int | None = None,
                group: int | None = None, groups: list[int] | None = None,
                cwd: str | None = None, cgroup_procs: str | None = None) -> CommandResult:
    """Run ``argv`` (first element an absolute path) and return its output.

    ``user``/``group`` (numeric ids; root only) run it as that user, with the supplementary
    ``groups`` given (none by default), e.g. a job's MPS daemon as the job's user. Raises
    CommandError when the program is missing, times out, or (with ``check``) exits non-zero.
    ``cgroup_procs``: a ``cgroup.procs`` file (v1 or v2) the child writes its own pid into before
    it drops to the user and execs (the job's devices cgroup: gpuslurm's, or the scheduler's,
    which only root may join), so the program never runs outside it.
    """
    args = tuple(str(a) for a in argv)
    if not args or not os.path.isabs(args[0]):
        raise CommandError(f"refusing to run {args[:1]!r}: commands need an absolute path", args)
    verify = None
    if user is not None:
        gid = group if group is not None else user
        for what, value in (("uid", user), ("gid", gid), *(("group", g) for g in groups or ())):
            if not 0 <= value <= MAX_ID:  # (uid_t)-1 would leave the child root
                raise CommandError(f"refusing to run {Path(args[0]).name} as impossible {what} {value}", args)
        verify = _child_setup(user, gid, groups or (), cgroup_procs)
    elif cgroup_procs is not None:
        raise CommandError("joining a cgroup before exec is only for commands run as a user", args)
    try:
        proc = subprocess.Popen(
            args, stdin=subprocess.PIPE if input_text is not None else subprocess.DEVNULL,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
            # a job's name, comment or directory can hold any bytes: never let them crash a reader
            encoding="utf-8", errors="replace",
            start_new_session=True, cwd=cwd,
            # the drop is the child's own (verify), after it joined cgroup_procs as root
            preexec_fn=verify,
        )
    except subprocess.SubprocessError as exc:  # the child found it was not fully dropped
        raise CommandError(f"{args[0]}: not run: privileges were not dropped ({exc})", args) from exc
    except FileNotFoundError as exc:
        raise CommandError(f"{args[0]}: not found", args) from exc
    except PermissionError as exc:
        raise CommandError(f"{args[0]}: permission denied", args) from exc
    try:
        out, err = proc.communicate(input=input_text, timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        _kill_group(proc)
        raise CommandError(f"{Path(args[0]).name}: timed out after {timeout:g} s", args) from exc
    result = CommandResult(args, proc.returncode, out, err)
    if check and proc.returncode != 0:
        first = (err.strip() or out.strip()).splitlines()
        why = first[0] if first else "no output"
        raise CommandError(f"{Path(args[0]).name} exited {proc.returncode}: {why}", args,
                           proc.returncode, err)
    return result


MAX_ID = 2**32 - 2  # 2**32 - 1 is (uid_t)-1: "leave unchanged" to setresuid


def _dropped_check(uid: int, gid: int, groups: Sequence[int]) -> Callable[[], None]:
    """A check that aborts unless real, effective and saved ids and the supplementary groups are
    exactly ``uid``, ``gid`` and ``groups`` (the child's last step before exec)."""
    want_groups = sorted(set(groups))

    def check() -> None:
        if (os.getresuid() != (uid, uid, uid) or os.getresgid() != (gid, gid, gid)
                or sorted(set(os.getgroups()) - {gid}) != [g for g in want_groups if g != gid]):
            raise PermissionError("ids after the drop are not the job's")

    return check


def _child_setup(uid: int, gid: int, groups: Sequence[int],
                 cgroup_procs: str | None = None) -> Callable[[], None]:
    """Run in the child before exec: join ``cgroup_procs`` (still root), drop to ``uid``:``gid``
    with exactly ``groups`` (setgroups, then gid, then uid: each step needs the privilege the
    next one drops), then :func:`_dropped_check`."""
    want_groups = sorted(set(groups))
    verify = _dropped_check(uid, gid, groups)

    def setup() -> None:
        if cgroup_procs is not None:
            fd = os.open(cgroup_procs, os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
            try:
                os.write(fd, b"0")  # 0: the writing process itself
            finally:
                os.close(fd)
        os.setgroups(want_groups)
        os.setresgid(gid, gid, gid)
        os.setresuid(uid, uid, uid)
        verify()

    return setup


def _kill_group(proc: subprocess.Popen[str]) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    try:
        proc.communicate(timeout=1.0)
    except subprocess.TimeoutExpired:
        # something that left the group still holds our pipes: stop reading, just reap ours
        for pipe in (proc.stdin, proc.stdout, proc.stderr):
            if pipe is not None:
                pipe.close()
        proc.wait()


def which(name: str, candidates: tuple[str, ...] = ("/usr/bin", "/usr/sbin", "/bin", "/sbin",
                                                    "/usr/local/bin", "/usr/local/sbin")) -> str | None:
    """First absolute path of ``name`` in a fixed list of system directories (PATH is not used)."""
    for d in candidates:
        p = os.path.join(d, name)
        if os.access(p, os.X_OK):
            return p
    return None
