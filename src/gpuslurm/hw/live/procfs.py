"""The one door to ``/proc``: what the monitor, the hooks and the kills need to know about a process,
and the few node-wide files gpuslurm reads there (no other module names a /proc path:
tests/hw/test_procfs_door.py).

A process can exit between any two reads, and its PID can be reused by another one. So every
reader returns a :class:`ProcessProblem` instead of raising, and :func:`read_process` checks the
start time before and after reading the rest: if it changed, the facts would mix two processes,
and the PID is reported gone. Reads use ``os.open``/``os.read`` on whole small files: the monitor
does this for every GPU process every cycle, and Python's buffered ``open`` costs twice as much.
"""

from __future__ import annotations

import errno
import os

from gpuslurm.tuples import TYPE_CHECKING, NamedTuple  # not typing's: the hooks read /proc here

if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import TypeVar

    _T = TypeVar("_T")

PROC_ROOT = "/proc"
BOOT_ID = f"{PROC_ROOT}/sys/kernel/random/boot_id"  # this boot's id (the kmsg cursor's)
MEMINFO = f"{PROC_ROOT}/meminfo"
_GONE = (errno.ENOENT, errno.ESRCH)
_READ_SIZE = 65536


class ProcessFacts(NamedTuple):
    """One process: its name, identity (start time) and owner, and its cgroup file's text."""

    pid: int
    comm: str
    start_ticks: int  # field 22 of /proc/PID/stat: with the PID, names one process for its lifetime
    uid: int  # real uid
    cgroup: str
    session: int = -1  # field 6 of /proc/PID/stat: PBS without cgroups finds a job's processes by it


class ProcessProblem(NamedTuple):
    """Why a process could not be read: ``pid-gone`` or ``proc-unreadable``."""

    pid: int
    kind: str
    detail: str


class ProcIdentity(NamedTuple):
    comm: str
    start_ticks: int
    session: int = -1


def _read(path: str) -> bytes:
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        return os.read(fd, _READ_SIZE)
    finally:
        os.close(fd)


def _problem(pid: int, path: str, exc: OSError) -> ProcessProblem:
    if exc.errno in _GONE:
        return ProcessProblem(pid, "pid-gone", "the process exited")
    return ProcessProblem(pid, "proc-unreadable", f"{path}: {exc.strerror or exc}")


def parse_stat(data: bytes) -> ProcIdentity:
    """``comm`` and start time from a ``/proc/PID/stat`` line; ValueError if it is not one.

    The name is between the first ``(`` and the *last* ``)``: a process may put ``)`` in it.
    """
    open_at = data.index(b"(")
    close_at = data.rindex(b")")
    fields = data[close_at + 2:].split()
    # after the name: state is field 3, session field 6, starttime field 22, so indices 3 and 19
    name = data[open_at + 1:close_at].decode("utf-8", "replace")
    return ProcIdentity(name, int(fields[19]), int(fields[3]))


class ProcStatus(NamedTuple):
    """The lines of ``/proc/PID/status`` gpuslurm reads."""

    uid: int  # real uid
    state: str | None = None  # R, S, D, Z (zombie), X (dead), ...; None: no State line
    ppid: int | None = None  # None: no PPid line

    @property
    def alive(self) -> bool:
        """Not a zombie or dead: a process that still runs (and can still open files)."""
        return self.state not in ("Z", "X")


def _status_field(data: bytes, key: bytes) -> bytes | None:
    if data.startswith(key):
        at = 0
    else:
        at = data.find(b"\n" + key) + 1
        if at == 0:
            return None
    end = data.find(b"\n", at)
    return data[at + len(key):end if end >= 0 else None]


def parse_status(data: bytes) -> ProcStatus:
    """Real uid, state and parent from a ``/proc/PID/status`` text; ValueError without a Uid line.

    The one parser of that file (the monitor, process kills, MPS stop). Each key is found at a
    line start; the ``Name:`` line, the process's own choice, cannot hold a newline (the kernel
    escapes it), so it cannot fake another. The kernel always writes State and PPid; a file
    without them (a replayed /proc) reads as a running process without a known parent.
    """
    uid = _status_field(data, b"Uid:")
    if uid is None:
        raise ValueError("no Uid: line")
    state = (_status_field(data, b"State:") or b"").split()
    ppid = _status_field(data, b"PPid:")
    return ProcStatus(int(uid.split()[0]), state[0].decode("ascii", "replace") if state else None,
                      None if ppid is None else int(ppid.split()[0]))


def _read_parsed(pid: int, path: str, parse: Callable[[bytes], _T], what: str) -> _T | ProcessProblem:
    """``parse`` of ``path`` (``pid``'s, one bounded read), or why it could not be read."""
    try:
        data = _read(path)
    except OSError as exc:
        return _problem(pid, path, exc)
    try:
        return parse(data)
    except (ValueError, IndexError):
        if not data:  # a process reaped while being read leaves an empty file behind
            return ProcessProblem(pid, "pid-gone", "the process exited")
        return ProcessProblem(pid, "proc-unreadable", f"{path}: not {what}")


def read_status(pid: int, proc_root: str = PROC_ROOT) -> ProcStatus | ProcessProblem:
    """``pid``'s status (one bounded read), or why it could not be read."""
    return _read_parsed(pid, f"{proc_root}/{pid}/status", parse_status, "a status file")


def read_environ(pid: int, proc_root: str = PROC_ROOT, limit: int = 1 << 20) -> list[bytes]:
    """``pid``'s environment as ``NAME=value`` items, at most ``limit`` bytes of it ([] when gone)."""
    try:
        fd = os.open(f"{proc_root}/{pid}/environ", os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return []
    try:
        chunks, size = [], 0
        while size < limit:
            chunk = os.read(fd, min(_READ_SIZE, limit - size))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
    except OSError:
        return []
    finally:
        os.close(fd)
    return b"".join(chunks).split(b"\0")


def read_identity(pid: int, proc_root: str = PROC_ROOT) -> ProcIdentity | ProcessProblem:
    """Name and start time of ``pid`` (one read of its stat file)."""
    return _read_parsed(pid, f"{proc_root}/{pid}/stat", parse_stat, "a stat line")


def read_process(pid: int, proc_root: str = PROC_ROOT,
                 identity: ProcIdentity | None = None) -> ProcessFacts | ProcessProblem:
    """Everything about ``pid``; ``identity`` is a stat reading already made this cycle."""
    first = identity if identity is not None else read_identity(pid, proc_root)
    if isinstance(first, ProcessProblem):
        return first
    base = f"{proc_root}/{pid}"
    try:
        path = f"{base}/cgroup"
        cgroup = _read(path).decode("utf-8", "replace")
        path = f"{base}/status"
        status = _read(path)
    except OSError as exc:
        return _problem(pid, path, exc)
    try:
        uid = parse_status(status).uid
    except (ValueError, IndexError):
        if not status:
            return ProcessProblem(pid, "pid-gone", "the process exited")
        return ProcessProblem(pid, "proc-unreadable", f"{base}/status: not a status file")
    again = read_identity(pid, proc_root)
    if isinstance(again, ProcessProblem):
        return again
    if again.start_ticks != first.start_ticks:
        return ProcessProblem(pid, "pid-gone", "the process exited and its PID was reused")
    return ProcessFacts(pid, again.comm, again.start_ticks, uid, cgroup, again.session)


_boot: dict[str, float] = {}


def boot_time(proc_root: str = PROC_ROOT) -> float:
    """The kernel's boot time (``btime`` in ``/proc/stat``), in Unix seconds; read once."""
    cached = _boot.get(proc_root)
    if cached is None:
        try:
            data = _read(f"{proc_root}/stat")
            at = data.index(b"\nbtime ")
            cached = float(data[at + 7:data.index(b"\n", at + 1)])
        except (OSError, ValueError):
            cached = 0.0  # start times become relative to boot: still ordered, never wrong by a job
        _boot[proc_root] = cached
    return cached


_TICKS = os.sysconf("SC_CLK_TCK")


def start_time(start_ticks: int, proc_root: str = PROC_ROOT) -> float:
    """A process's start time in Unix seconds from its stat ``starttime`` ticks."""
    return boot_time(proc_root) + start_ticks / _TICKS


# --- what the hooks read, raising OSError as the kernel gives it ------------------------------


def read_cgroup_text(pid: int, proc_root: str = PROC_ROOT) -> str:
    """``/proc/PID/cgroup`` (one bounded read); OSError when it cannot be read."""
    return _read(f"{proc_root}/{pid}/cgroup").decode("utf-8", "replace")


def parse_uids(data: bytes) -> tuple[int, int, int, int]:
    """The real, effective, saved and file-system uids of a ``/proc/PID/status`` text; ValueError
    without a Uid line of four numbers."""
    line = _status_field(data, b"Uid:")
    words = (line or b"").split()
    if len(words) != 4 or not all(w.isdigit() for w in words):
        raise ValueError("no Uid: line of four uids")
    return int(words[0]), int(words[1]), int(words[2]), int(words[3])


def read_uids(pid: int, proc_root: str = PROC_ROOT) -> tuple[int, int, int, int]:
    """:func:`parse_uids` of ``pid``'s status (one bounded read); OSError, or ValueError."""
    return parse_uids(_read(f"{proc_root}/{pid}/status"))


def owner_uid(pid: int, proc_root: str = PROC_ROOT) -> int:
    """The uid owning ``/proc/PID`` (the process's effective uid, or root's while it is not
    dumpable); OSError when it is gone."""
    return os.stat(f"{proc_root}/{pid}").st_uid


def list_pids(proc_root: str = PROC_ROOT) -> list[int]:
    """The pids of ``/proc``'s process directories (each may be gone by the time it is read)."""
    return [int(name) for name in os.listdir(proc_root) if name.isascii() and name.isdigit()]


def read_devices(proc_root: str = PROC_ROOT) -> str | None:
    """``/proc/devices``, the loaded drivers' device majors; None when there is none."""
    try:
        return _read(f"{proc_root}/devices").decode("utf-8", "replace")
    except FileNotFoundError:
        return None


def fd_path(fd: int) -> str:
    """The path that opens what this process's descriptor ``fd`` holds (loading a library through
    the very file that was checked, not a name that could be swapped in between)."""
    return f"{PROC_ROOT}/self/fd/{fd}"
