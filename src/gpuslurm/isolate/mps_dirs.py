"""A job's MPS directory, ``<run_dir>/mps/<jobid>``, handled through directory descriptors.

Made by root with the user's ``pipe/`` and ``log/`` inside; removed, or set aside, whatever the
job's user wrote into those: no recursion, no whole listing, never a symlink followed. The
daemon's start and stop (:mod:`gpuslurm.isolate.mps`) reach every file through these.
"""

from __future__ import annotations

import errno
import itertools
import os
import stat
import time
from collections.abc import Iterator

from gpuslurm.errors import HardwareError, InputError
from gpuslurm.safedir import DIR_FLAGS, open_dir


def make_user_dirs(base: int, job_id: str, uid: int, gid: int) -> None:
    """Make ``pipe/`` and ``log/`` (0700, ``uid``:``gid``'s) in the job's directory under ``base``."""
    job = os.open(job_id, DIR_FLAGS, dir_fd=base)
    try:
        os.fchmod(job, 0o755)  # whatever the umask: the user must reach pipe/ and log/
        for name in ("pipe", "log"):
            os.mkdir(name, 0o700, dir_fd=job)
            fd = os.open(name, DIR_FLAGS, dir_fd=job)
            try:
                os.fchown(fd, uid, gid)
                os.fchmod(fd, 0o700)
            finally:
                os.close(fd)
    finally:
        os.close(job)


def open_base(path: str, *, create: bool) -> int | None:
    """``<run_dir>/mps`` reached as :func:`gpuslurm.safedir.open_dir` does: every component a
    directory of root (or ours), no symlink, not writable by others (unless sticky, above the
    base); missing ones made 0755. None if missing and not ``create``.
    """
    return open_dir(path, create_mode=0o755 if create else None, error=InputError)


def pipe_owner(base: int, job_id: str) -> int | None:
    """The owner of ``<job>/pipe`` (root made it and gave it to the job's user); None if missing."""
    try:
        job = os.open(job_id, DIR_FLAGS, dir_fd=base)
    except OSError:
        return None
    try:
        st = os.lstat("pipe", dir_fd=job)
    except OSError:
        return None
    finally:
        os.close(job)
    return st.st_uid if stat.S_ISDIR(st.st_mode) and st.st_uid != 0 else None


def exists(base: int, name: str) -> bool:
    """Whether ``name`` is under ``base`` (a symlink counts: lstat)."""
    try:
        os.lstat(name, dir_fd=base)
    except FileNotFoundError:
        return False
    return True


def remove_or_set_aside(base: int, name: str, path: str) -> None:
    """Remove ``name`` under ``base``; when its user's files will not go (still growing), rename
    it out of the way (``.stale-<name>-<ns>``, left for the admin) so the job starts anew."""
    try:
        remove(base, name)
    except OSError as exc:
        try:
            os.rename(name, f".stale-{name}-{time.time_ns()}", src_dir_fd=base, dst_dir_fd=base)
        except OSError as again:  # a full or read-only /run: the node's problem, not a bug
            raise HardwareError(f"{path}: cannot remove the old MPS directory ({exc.strerror or exc}) "
                                f"nor set it aside: {again.strerror}") from None


def remove(base: int, name: str) -> None:
    """Remove ``name`` under ``base`` and everything in it; symlinks inside are removed, never followed.

    Below ``pipe/`` and ``log/`` the tree is the job's user's: deeper than any recursion or
    descriptor limit (``shutil.rmtree`` recursed: RecursionError), wider than memory should hold,
    and still growing while a process of theirs elsewhere adds to it. So no recursion and no whole
    listing: each directory met is emptied by moving its entries up into the top one (two
    descriptors open at a time), and every entry seen counts against :data:`MAX_REMOVE_STEPS`.
    Every failure is an OSError.
    """
    try:
        st = os.lstat(name, dir_fd=base)
    except FileNotFoundError:
        return
    if not stat.S_ISDIR(st.st_mode):
        os.unlink(name, dir_fd=base)
        return
    top = os.open(name, DIR_FLAGS, dir_fd=base)
    try:
        budget = [MAX_REMOVE_STEPS]
        while True:
            seen = False
            for entry in _entries(top, budget):
                seen = True
                _flatten(top, entry, budget)
            if not seen:
                break
    finally:
        os.close(top)
    os.rmdir(name, dir_fd=base)


MAX_REMOVE_STEPS = 200_000  # a daemon's directories hold a handful of pipes and logs


def _entries(fd: int, budget: list[int]) -> Iterator[str]:
    """The names in the directory ``fd``, one at a time, each counted against ``budget``."""
    with os.scandir(fd) as found:
        for item in found:
            budget[0] -= 1
            if budget[0] < 0:
                raise OSError(errno.ENOTEMPTY, f"more than {MAX_REMOVE_STEPS} entries, or still growing")
            yield item.name


def _flatten(top: int, entry: str, budget: list[int]) -> None:
    """Remove ``entry`` of ``top`` if it is not a directory, else move its entries up into ``top``
    and remove it once empty (a race leaves it for the next pass)."""
    try:
        if not stat.S_ISDIR(os.lstat(entry, dir_fd=top).st_mode):
            os.unlink(entry, dir_fd=top)
            return
        sub = os.open(entry, DIR_FLAGS, dir_fd=top)
    except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
        return  # replaced meanwhile: seen again at the next pass
    except OSError as exc:
        if exc.errno != errno.ELOOP:  # a directory swapped for a symlink: the same
            raise
        return
    try:
        for child in _entries(sub, budget):
            for _ in range(8):  # a name the user planted in the top directory: take the next
                try:
                    os.rename(child, f".gpuslurm-rm-{os.getpid()}-{next(_SERIAL)}", src_dir_fd=sub,
                              dst_dir_fd=top)
                    break
                except FileNotFoundError:  # gone meanwhile
                    break
                except OSError as exc:
                    if exc.errno not in (errno.EEXIST, errno.ENOTEMPTY, errno.ENOTDIR, errno.EISDIR):
                        raise
            else:
                raise OSError(errno.EEXIST, "no free name to move an entry to")
    finally:
        os.close(sub)
    try:
        os.rmdir(entry, dir_fd=top)
    except OSError as exc:
        if exc.errno not in (errno.ENOTEMPTY, errno.EEXIST, errno.ENOENT):
            raise


_SERIAL = itertools.count()
