"""The throttle file that ``plugins/job_submit.lua`` reads on the controller, and the shared
violations directory that ``gpuslurm throttle sync`` reads.

Throttle file format (version 1), the contract with the Lua plugin: UTF-8 text, one throttle per
line, seven fields separated by single tabs::

    user  until  mode  value  created  contact  reason

``until`` and ``created`` are Unix seconds (digits only); ``mode`` is reject, cap or priority;
``value`` is the GPU cap, the nice added, or 0. ``contact`` and ``reason`` hold no tab or newline.
Lines starting with ``#`` and blank lines are comments. The first line is a header carrying a
write id that changes on every write, so the plugin can tell from one line that nothing changed.
Any other line is junk: skipped (and reported) by both readers, dropped by the next write, as are
expired throttles.

The file is replaced atomically (a temporary file in the same directory, fsync, rename, fsync of
the directory), mode 0644, by a writer that refuses a symlink at any point of the path and a
directory that others can write. Writers serialise on a lock of the directory itself.
"""

from __future__ import annotations

import errno
import fcntl
import os
import stat
import time
from collections.abc import Callable, Iterable
from typing import NamedTuple

from gpuslurm import times
from gpuslurm.errors import InputError
from gpuslurm.policy.throttle import MAX_DIGITS as MAX_DIGITS  # where callers import them from
from gpuslurm.policy.throttle import MAX_LINE as MAX_LINE
from gpuslurm.policy.throttle import Throttle, parse_throttle_file, violation_from_line, violation_to_line
from gpuslurm.policy.throttle import ThrottleFile as ThrottleFile
from gpuslurm.safedir import NotRegularFileError, open_dir, read_regular, replace_at, why_refused
from gpuslurm.samples import Violation

HEADER_PREFIX = "# gpuslurm-throttle v1 id="
COLUMNS = "# user\tuntil\tmode\tvalue\tcreated\tcontact\treason"
MAX_FILE_BYTES = 16 << 20  # the plugin reads no more (a larger file: nobody throttled, logged)
FILE_MODE = 0o644  # slurmctld runs as SlurmUser, which need not be root
MAX_VIOLATIONS_BYTES = 256 << 20  # one node's file; logrotate keeps it far smaller


class ViolationScan(NamedTuple):
    violations: tuple[Violation, ...]
    problems: tuple[str, ...] = ()  # "<file>:<line>: why", one per unreadable record or file
    exists: bool = True  # False: the directory is missing (no monitor wrote yet, or a wrong path)


class UnsafeThrottlePathError(InputError):
    """The throttle file's path has a symlink, or a directory or file others could change."""


# --- format --------------------------------------------------------------------------------------

def format_throttle_file(throttles: Iterable[Throttle], write_id: str) -> str:
    """The file's text: header, column line, one line per throttle. A time outside
    :data:`gpuslurm.times.TIME_MIN`..``TIME_MAX`` is never written (InputError)."""
    lines = [f"{HEADER_PREFIX}{write_id}", COLUMNS]
    for t in throttles:
        for what, ts in (("until", t.until), ("created", t.created)):
            if not times.in_range(ts):
                raise InputError(f"refusing to write {t.user}'s {what} {ts!r}: outside "
                                 f"{times.RANGE_TEXT}", source="throttle file")
        fields = (t.user, str(int(t.until)), t.mode, str(int(t.value)), str(int(t.created)),
                  _field_text(t.contact), _field_text(t.reason))
        lines.append("\t".join(fields))
    return "\n".join(lines) + "\n"


def _field_text(text: str) -> str:
    return text.replace("\t", " ").replace("\n", " ").replace("\r", " ")


# --- read and write ------------------------------------------------------------------------------

def read_throttle_file(path: str) -> ThrottleFile:
    """The throttle file at ``path``; an empty ThrottleFile (``exists=False``) when there is none."""
    dfd = _open_dir(os.path.dirname(os.path.abspath(path)), create=False)
    if dfd is None:
        return ThrottleFile((), (), exists=False)
    try:
        return _read(dfd, path)
    finally:
        os.close(dfd)


def update_throttle_file(path: str, change: Callable[[ThrottleFile], tuple[Throttle, ...] | None],
                         now: float | None = None) -> tuple[ThrottleFile, tuple[Throttle, ...]]:
    """Read, ``change`` and rewrite the file under the directory's lock; expired throttles and junk
    lines are dropped. ``change`` returning None leaves the file as it is (the plugin then has
    nothing to re-read). Returns what was read and what is in force now.
    """
    when = time.time() if now is None else now
    dfd = _open_dir(os.path.dirname(os.path.abspath(path)), create=True)
    assert dfd is not None
    try:
        fcntl.flock(dfd, fcntl.LOCK_EX)  # released by close
        before = _read(dfd, path)
        wanted = change(before)
        if wanted is None:
            return before, tuple(t for t in before.throttles if t.active(when))
        after = tuple(t for t in wanted if t.active(when))
        write_id = f"{time.time_ns()}-{os.getpid()}"
        _replace(dfd, path, format_throttle_file(after, write_id).encode())
        return before, after
    finally:
        os.close(dfd)


def write_throttle_file(path: str, throttles: Iterable[Throttle], now: float | None = None) -> str:
    """Replace the file with ``throttles`` (expired ones left out); returns the path."""
    wanted = tuple(throttles)
    update_throttle_file(path, lambda _old: wanted, now)
    return path


def _read(dfd: int, path: str) -> ThrottleFile:
    """The file ``path`` in the checked directory ``dfd``: safedir's ``read_regular`` (never a
    FIFO or device, never through a symlink, at most MAX_FILE_BYTES)."""
    name = os.path.basename(path)
    full = os.path.join(os.path.realpath(os.path.dirname(os.path.abspath(path))), name)
    try:
        data = read_regular(full, MAX_FILE_BYTES, follow=False)
    except FileNotFoundError:
        return ThrottleFile((), (), exists=False)
    except OSError as exc:
        if exc.errno == errno.EFBIG:
            raise InputError(f"larger than {MAX_FILE_BYTES} bytes: not a throttle file",
                             source=path) from None
        why = exc.strerror if isinstance(exc, NotRegularFileError) else why_refused(dfd, name, exc)
        raise UnsafeThrottlePathError(f"refusing to read: {why}", source=path) from None
    return parse_throttle_file(data.decode("utf-8", errors="replace"))


def _replace(dfd: int, path: str, payload: bytes) -> None:
    name = os.path.basename(path)
    try:
        st = os.lstat(name, dir_fd=dfd)
    except FileNotFoundError:
        pass
    else:
        if stat.S_ISLNK(st.st_mode):
            raise UnsafeThrottlePathError("refusing to replace a symlink", source=path)
        if not stat.S_ISREG(st.st_mode):
            raise UnsafeThrottlePathError("refusing to replace: not a regular file", source=path)
    replace_at(dfd, name, payload, FILE_MODE, error=UnsafeThrottlePathError, source=path)


def _open_dir(directory: str, *, create: bool) -> int | None:
    """A descriptor for ``directory``, walked and checked as :func:`gpuslurm.safedir.open_dir` does.

    Symlinks an admin put in the configured path are resolved first (``realpath``); the walk then
    refuses any symlink and any directory not owned by root or us or writable by group or others
    (a sticky ``/tmp`` is allowed above the last one). None when one is missing and not ``create``.
    """
    return open_dir(os.path.realpath(directory), create_mode=0o755 if create else None,
                    error=UnsafeThrottlePathError)


# --- the shared violations directory -----------------------------------------------------------

def violations_file(directory: str, node: str) -> str:
    """``<directory>/<node>.jsonl``: where the monitor of ``node`` appends its violations."""
    if not node or "/" in node or node.startswith("."):
        raise InputError(f"not a node name: {node!r}", source="node")
    return os.path.join(directory, f"{node}.jsonl")


def append_violations(directory: str, node: str, violations: Iterable[Violation]) -> int:
    """Append ``violations`` to the node's file, one line each, in one write; returns the count.

    One ``write`` with ``O_APPEND`` keeps lines of concurrent writers whole.
    """
    lines = [violation_to_line(v) + "\n" for v in violations]
    if not lines:
        return 0
    path = violations_file(directory, node)
    os.makedirs(directory, mode=0o755, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    try:
        os.write(fd, "".join(lines).encode())
    finally:
        os.close(fd)
    return len(lines)


def read_violations(directory: str, since: float | None = None) -> ViolationScan:
    """Every violation in ``<directory>/*.jsonl`` (those that ended before ``since`` left out).

    A missing directory is no violation; a line that does not parse (a torn write, a newer
    version) or an unreadable file is a problem, reported and skipped.
    """
    try:
        names = sorted(n for n in os.listdir(directory) if n.endswith(".jsonl") and not n.startswith("."))
    except FileNotFoundError:
        return ViolationScan((), exists=False)
    except OSError as exc:
        raise InputError(f"cannot list: {exc.strerror}", source=directory) from None
    found: list[Violation] = []
    problems: list[str] = []
    for name in names:
        path = os.path.join(directory, name)
        try:
            data = read_regular(path, MAX_VIOLATIONS_BYTES, follow=False)
        except OSError as exc:
            problems.append(f"{path}: {exc.strerror or exc}")
            continue
        for number, line in enumerate(data.decode("utf-8", errors="replace").splitlines(), start=1):
            if not line.strip():
                continue
            try:
                v = violation_from_line(line)
            except ValueError as exc:
                problems.append(f"{path}:{number}: {exc}")
                continue
            if since is None or v.start + v.duration_s >= since:
                found.append(v)
    return ViolationScan(tuple(found), tuple(problems))
