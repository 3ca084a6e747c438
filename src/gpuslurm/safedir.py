"""Reach a directory as root without letting another user redirect the path.

Each component is opened relative to its parent's descriptor with ``O_NOFOLLOW``, so a symlink
anywhere is refused rather than followed, and each is checked before the next one is opened
through it: owned by root or by us, and not writable by group or others unless sticky (``/tmp``:
others cannot rename or remove our entries). The last directory is where callers create files,
so it never gets the sticky exception. Imports only ``os`` and ``stat``: the hooks use it on every
job.
"""

from __future__ import annotations

import errno
import os
import stat
import struct

from gpuslurm.errors import InputError

DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class UnsafePathError(InputError):
    """A path gpuslurm writes as root is a symlink, not ours, or writable by others."""


def open_dir(path: str, *, create_mode: int | None = None, private: bool = False,
             error: type[InputError] = UnsafePathError) -> int | None:
    """A descriptor for the directory ``path`` (made absolute, never resolved), checked at each step.

    ``create_mode``: missing directories are made with exactly this mode; None returns None when
    one is missing. ``private``: the last directory must be ours (not merely root's), is made 0700
    and narrowed to 0700 if others could read it. Refusals raise ``error`` naming the component.
    """
    parts = [p for p in os.path.abspath(path).split("/") if p]
    if private and not parts:
        raise error("refusing to make the root directory private", source="/")
    fd = os.open("/", DIR_FLAGS)
    try:
        _check(os.fstat(fd), "/", final=not parts, private=False, error=error)
        here = ""
        for i, name in enumerate(parts):
            final = i == len(parts) - 1
            here += "/" + name
            mode = 0o700 if final and private else create_mode
            child, created = _open_or_make(fd, name, here, mode, error)
            if child is None:
                return None
            os.close(fd)
            fd = child
            st = os.fstat(fd)
            _check(st, here, final=final, private=private and final, error=error)
            if created and mode is not None and stat.S_IMODE(st.st_mode) != mode:
                os.fchmod(fd, mode)  # mkdir's mode went through the umask
            elif final and private and st.st_mode & 0o077:
                os.fchmod(fd, 0o700)
        result, fd = fd, -1
        return result
    finally:
        if fd >= 0:
            os.close(fd)


def check_private(st: os.stat_result, source: str, what: str,
                  error: type[InputError] = UnsafePathError) -> None:
    """Refuse ``st`` unless it is ours and not writable by group or others."""
    if st.st_uid != os.geteuid():
        raise error(f"refusing to use: {what} owned by uid {st.st_uid}, not {os.geteuid()}",
                    source=source)
    if st.st_mode & 0o022:
        raise error(f"refusing to use: {what} writable by group or others "
                    f"(mode {stat.S_IMODE(st.st_mode):04o})", source=source)


def why_refused(dfd: int, name: str, exc: OSError) -> str:
    """Why opening ``name`` under ``dfd`` failed, in words: a symlink says so rather than ELOOP."""
    try:
        st = os.lstat(name, dir_fd=dfd)
    except OSError:
        return exc.strerror or str(exc)
    if stat.S_ISLNK(st.st_mode):
        return "is a symlink"
    if not stat.S_ISDIR(st.st_mode) and not stat.S_ISREG(st.st_mode):
        return "not a regular file or directory"
    return exc.strerror or str(exc)


def _open_or_make(fd: int, name: str, here: str, mode: int | None,
                  error: type[InputError]) -> tuple[int | None, bool]:
    """(descriptor of ``name`` under ``fd``, whether we made it); (None, False) if missing."""
    created = False
    try:
        return os.open(name, DIR_FLAGS, dir_fd=fd), created
    except FileNotFoundError:
        if mode is None:
            return None, created
    except OSError as exc:
        raise error(f"refusing to use: {why_refused(fd, name, exc)}", source=here) from None
    try:
        os.mkdir(name, mode, dir_fd=fd)
        created = True
    except FileExistsError:  # another process made it meanwhile; it is checked like any other
        pass
    try:
        return os.open(name, DIR_FLAGS, dir_fd=fd), created
    except OSError as exc:
        raise error(f"refusing to use: {why_refused(fd, name, exc)}", source=here) from None


def _check(st: os.stat_result, here: str, *, final: bool, private: bool,
           error: type[InputError]) -> None:
    if private:
        check_private(st, here, "directory", error)
        return
    if st.st_uid not in (0, os.geteuid()):
        raise error(f"refusing to use: owned by uid {st.st_uid}", source=here)
    if st.st_mode & 0o022 and (final or not st.st_mode & stat.S_ISVTX):
        raise error(f"refusing to use: writable by group or others "
                    f"(mode {stat.S_IMODE(st.st_mode):04o})", source=here)


# -- POSIX access ACLs: one more reader of a file that stays ours ---------------------------------
# Written as the kernel's own xattr form (include/uapi/linux/posix_acl_xattr.h): pylibacl would
# need libacl's headers and a C build on every node, for one fixed ACL of five entries.
ACL_XATTR = "system.posix_acl_access"
ACL_VERSION = 2
ACL_USER_OBJ, ACL_USER, ACL_GROUP_OBJ, ACL_MASK, ACL_OTHER = 0x01, 0x02, 0x04, 0x10, 0x20
ACL_UNDEFINED_ID = 0xFFFFFFFF
_ACL_HEADER = struct.Struct("<I")
_ACL_ENTRY = struct.Struct("<HHI")


def reader_acl(mode: int, reader: int) -> bytes:
    """The access ACL (``system.posix_acl_access``'s bytes) of a file with permission bits ``mode``
    that the uid ``reader`` may also read: the owner, group and others keep ``mode``'s bits, the
    reader gets read alone, and the mask (which the kernel shows as the group bits) is read plus
    the group's bits. ValueError for a uid the kernel has no room for."""
    if not 0 <= reader < ACL_UNDEFINED_ID:
        raise ValueError(f"not a uid: {reader}")
    group = (mode >> 3) & 0o7
    entries = ((ACL_USER_OBJ, (mode >> 6) & 0o7, ACL_UNDEFINED_ID), (ACL_USER, 0o4, reader),
               (ACL_GROUP_OBJ, group, ACL_UNDEFINED_ID), (ACL_MASK, group | 0o4, ACL_UNDEFINED_ID),
               (ACL_OTHER, mode & 0o7, ACL_UNDEFINED_ID))  # the order the kernel requires
    return _ACL_HEADER.pack(ACL_VERSION) + b"".join(_ACL_ENTRY.pack(*e) for e in entries)


def acl_entries(data: bytes) -> list[tuple[int, int, int]]:
    """The (tag, perm, id) entries of an access ACL in xattr form; ValueError for other bytes."""
    if len(data) < _ACL_HEADER.size or (len(data) - _ACL_HEADER.size) % _ACL_ENTRY.size:
        raise ValueError("not a POSIX ACL: its length")
    if _ACL_HEADER.unpack_from(data)[0] != ACL_VERSION:
        raise ValueError("not a POSIX ACL: its version")
    return list(_ACL_ENTRY.iter_unpack(data[_ACL_HEADER.size:]))


def replace_at(dfd: int, name: str, payload: bytes, mode: int, *,
               error: type[InputError] = UnsafePathError, source: str | None = None,
               owner: int | None = None, group: int | None = None,
               reader: int | None = None) -> None:
    """Replace ``name`` in the directory ``dfd`` with ``payload``, atomically, with exactly ``mode``
    (and, as root, owned by the uid ``owner`` and the gid ``group``: given only once written).
    ``reader``: the uid also gets read access through a POSIX access ACL (:func:`reader_acl`), set
    before the rename, so the file stays ours; a file system without ACLs raises OSError
    (ENOTSUP/EOPNOTSUPP).

    The data goes to a temporary name created exclusively without following symlinks, is synced,
    and is renamed over ``name`` (a rename replaces a symlink at ``name``, never writes through it),
    so readers see the old file or the new one. A regular file of ours left at the temporary name
    by a crash is removed; anything else there is refused with ``error``. ``OSError`` from the
    write itself (disk full, read-only file system) is the caller's to word.
    """
    tmp = f".{name}.{os.getpid()}.tmp"
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    for attempt in range(2):
        try:
            fd = os.open(tmp, flags, 0o600, dir_fd=dfd)
            break
        except FileExistsError:
            st = os.lstat(tmp, dir_fd=dfd)
            if attempt or not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid():
                kind = "a symlink" if stat.S_ISLNK(st.st_mode) else "something"
                raise error(f"refusing to write: {kind} is already at the temporary name",
                            source=source or tmp) from None
            os.unlink(tmp, dir_fd=dfd)
    try:
        with os.fdopen(fd, "wb") as fh:
            os.fchmod(fh.fileno(), mode)  # exactly this, whatever the umask
            if reader is not None:  # after the chmod, which would rewrite the ACL's mask
                os.setxattr(fh.fileno(), ACL_XATTR, reader_acl(mode, reader))
            fh.write(payload)
            fh.flush()
            os.fsync(fh.fileno())
            if owner is not None or group is not None:
                os.fchown(fh.fileno(), -1 if owner is None else owner, -1 if group is None else group)
        os.replace(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd)
    except BaseException:
        try:
            os.unlink(tmp, dir_fd=dfd)
        except OSError:
            pass
        raise
    os.fsync(dfd)


def replace_file(path: str, payload: bytes, mode: int) -> None:
    """:func:`replace_at` for a path an admin or user named (its directory is opened as given)."""
    dfd = os.open(os.path.dirname(os.path.abspath(path)), os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        replace_at(dfd, os.path.basename(path), payload, mode, source=path)
    finally:
        os.close(dfd)


MAX_READ_BYTES = 64 << 20  # no input gpuslurm reads (bundle, config, layout) comes near this


class NotRegularFileError(OSError):
    """A FIFO, directory or device where gpuslurm expects a file (``strerror`` says which)."""


def read_regular(path: str, limit: int = MAX_READ_BYTES, *, follow: bool = True) -> bytes:
    """The bytes of the regular file ``path``, refusing anything that could block or never end.

    A FIFO would block the open (and a hook with it), a device can stream forever: the type is
    checked before the open, the open is non-blocking, and the descriptor is checked again (the
    path may be swapped between the two). ``follow=False`` refuses a symlink as the last
    component. More than ``limit`` bytes is an error. ``/dev/null`` (Linux's 1:3) reads as empty.
    Raises OSError; ``strerror`` is one phrase.
    """
    st = os.stat(path, follow_symlinks=follow)
    if _is_null(st):
        return b""  # `GPUSLURM_CONFIG=/dev/null`: the classic empty file, and it never blocks
    kind = _kind(st.st_mode)
    if kind:
        raise NotRegularFileError(errno.EINVAL, f"is {kind}, not a regular file", path)
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | (0 if follow else os.O_NOFOLLOW)
    fd = os.open(path, flags)
    with os.fdopen(fd, "rb") as fh:
        st = os.fstat(fd)
        kind = _kind(st.st_mode)
        if kind:
            raise NotRegularFileError(errno.EINVAL, f"is {kind}, not a regular file", path)
        data = fh.read(limit + 1)
    if len(data) > limit:
        raise OSError(errno.EFBIG, f"is larger than {limit} bytes", path)
    return data


def read_regular_text(path: str, limit: int = MAX_READ_BYTES, *, follow: bool = True) -> str:
    """:func:`read_regular` decoded as UTF-8; ValueError (a UnicodeDecodeError) when it is not."""
    return read_regular(path, limit, follow=follow).decode("utf-8")


def _is_null(st: os.stat_result) -> bool:
    return stat.S_ISCHR(st.st_mode) and (os.major(st.st_rdev), os.minor(st.st_rdev)) == (1, 3)


def _kind(mode: int) -> str:
    if stat.S_ISREG(mode):
        return ""
    for test, name in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"),
                       (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device")):
        if test(mode):
            return name
    return "not a file"


# -- private files: the job maps, the hooks' cache and summaries ----------------------------------

def write_private_file(base: str, final: str, payload: bytes) -> str:
    """Write ``<base>/<final>`` atomically, mode 0600, through a directory checked component by
    component; a symlink or odd file at the name is refused, never followed. Returns the path.
    """
    dfd = open_dir(base, create_mode=0o755, private=True)  # ancestors 0755: per-job dirs sit beside
    assert dfd is not None
    try:
        _refuse_odd_entry(dfd, final, base)
        replace_at(dfd, final, payload, 0o600, source=os.path.join(base, final))
    finally:
        os.close(dfd)
    return os.path.join(base, final)


def read_private_file(base: str, name: str, limit: int) -> bytes | None:
    """The content of ``<base>/<name>``, reached and checked as :func:`write_private_file` writes
    it (a regular file of ours, not writable by others); None when it or ``base`` is missing.
    """
    dfd = open_dir(base, private=True)
    if dfd is None:
        return None
    try:
        return read_private_at(dfd, name, base, limit)
    finally:
        os.close(dfd)


def read_private_at(dfd: int, name: str, base: str, limit: int) -> bytes | None:
    """``name`` in the directory ``dfd`` (``base``) if it is a regular, private file of at most
    ``limit`` bytes; None when it is missing. A symlink, FIFO or other file is refused."""
    path = os.path.join(base, name)
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dfd)
    except FileNotFoundError:
        return None
    except OSError as exc:  # ELOOP: a symlink
        raise UnsafePathError(f"refusing to read: {why_refused(dfd, name, exc)}", source=path) from None
    with os.fdopen(fd, "rb") as fh:
        st = os.fstat(fh.fileno())
        if not stat.S_ISREG(st.st_mode):
            raise UnsafePathError("refusing to read: not a regular file", source=path)
        check_private(st, path, "file")
        data = fh.read(limit + 1)
    if len(data) > limit:
        raise InputError(f"larger than {limit} bytes: not a file gpuslurm wrote", source=path)
    return data


def _refuse_odd_entry(dfd: int, name: str, base: str) -> None:
    """Refuse to replace anything but a regular file of ours: something else means tampering."""
    try:
        st = os.lstat(name, dir_fd=dfd)
    except FileNotFoundError:
        return
    path = os.path.join(base, name)
    if stat.S_ISLNK(st.st_mode):
        raise UnsafePathError("refusing to replace a symlink", source=path)
    if not stat.S_ISREG(st.st_mode):
        raise UnsafePathError("refusing to replace: not a regular file", source=path)
    check_private(st, path, "file")
