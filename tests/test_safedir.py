"""The shared walk that reaches a directory without following symlinks: real directories, real
owners (chown needs root), real umask."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuslurm.errors import InputError
from gpuslurm.safedir import (
    ACL_XATTR,
    UnsafePathError,
    acl_entries,
    check_private,
    open_dir,
    reader_acl,
    replace_at,
    why_refused,
)

NOBODY = 65534
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="chown to another user needs root")


class OddError(InputError):
    """A caller's own error class."""


def mode(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def open_fds() -> set[str]:
    return set(os.listdir("/proc/self/fd"))


@pytest.fixture
def umask_077() -> Iterator[None]:
    old = os.umask(0o077)
    try:
        yield
    finally:
        os.umask(old)


def refused(path: Path, *, create_mode: int | None = None, private: bool = False) -> UnsafePathError:
    before = open_fds()
    with pytest.raises(UnsafePathError) as info:
        open_dir(str(path), create_mode=create_mode, private=private)
    assert open_fds() == before  # a refusal leaks no descriptor
    return info.value


def test_the_descriptor_is_the_directory(tmp_path: Path) -> None:
    (tmp_path / "a" / "b").mkdir(parents=True)
    (tmp_path / "a" / "b" / "marker").write_text("x")
    fd = open_dir(str(tmp_path / "a" / "b"))
    assert fd is not None
    try:
        st = os.fstat(fd)
        want = os.stat(tmp_path / "a" / "b")
        assert (st.st_dev, st.st_ino) == (want.st_dev, want.st_ino)
        assert os.listdir(fd) == ["marker"]
        assert not os.get_inheritable(fd)  # never handed to a command the hook runs
    finally:
        os.close(fd)


def test_relative_paths_are_made_absolute(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "rel").mkdir()
    monkeypatch.chdir(tmp_path)
    fd = open_dir("rel")
    assert fd is not None
    try:
        assert os.fstat(fd).st_ino == os.stat(tmp_path / "rel").st_ino
    finally:
        os.close(fd)


def test_missing_without_create_is_none_and_makes_nothing(tmp_path: Path) -> None:
    assert open_dir(str(tmp_path / "x" / "y")) is None
    assert open_dir(str(tmp_path / "x" / "y"), private=True) is None
    assert not (tmp_path / "x").exists()


def test_created_with_exactly_the_mode_whatever_the_umask(tmp_path: Path, umask_077: None) -> None:
    fd = open_dir(str(tmp_path / "a" / "b" / "c"), create_mode=0o751)
    assert fd is not None
    os.close(fd)
    assert [mode(tmp_path / p) for p in ("a", "a/b", "a/b/c")] == [0o751] * 3
    fd = open_dir(str(tmp_path / "p" / "q"), create_mode=0o755, private=True)
    assert fd is not None
    os.close(fd)
    assert (mode(tmp_path / "p"), mode(tmp_path / "p" / "q")) == (0o755, 0o700)


def test_an_existing_directory_keeps_its_mode(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    os.chmod(tmp_path / "a", 0o711)
    fd = open_dir(str(tmp_path / "a" / "b"), create_mode=0o755)
    assert fd is not None
    os.close(fd)
    assert mode(tmp_path / "a") == 0o711


def test_private_final_is_narrowed(tmp_path: Path) -> None:
    (tmp_path / "jobs").mkdir()
    os.chmod(tmp_path / "jobs", 0o755)
    fd = open_dir(str(tmp_path / "jobs"), private=True)
    assert fd is not None
    os.close(fd)
    assert mode(tmp_path / "jobs") == 0o700
    fd = open_dir(str(tmp_path / "jobs"))  # without the policy nothing is narrowed
    assert fd is not None
    os.close(fd)


@pytest.mark.parametrize("create_mode", [None, 0o755])
def test_a_symlinked_component_is_refused_not_followed(tmp_path: Path, create_mode: int | None) -> None:
    real = tmp_path / "real"
    real.mkdir()
    (tmp_path / "link").symlink_to(real)
    err = refused(tmp_path / "link", create_mode=create_mode)
    assert (err.source, err.message) == (str(tmp_path / "link"), "refusing to use: is a symlink")
    err = refused(tmp_path / "link" / "sub", create_mode=create_mode)
    assert err.source == str(tmp_path / "link")
    assert os.listdir(real) == []  # nothing was made through the link


def test_a_symlink_to_a_missing_target_is_refused_not_created(tmp_path: Path) -> None:
    (tmp_path / "dangling").symlink_to(tmp_path / "target")
    err = refused(tmp_path / "dangling", create_mode=0o755)
    assert "symlink" in err.message
    assert not (tmp_path / "target").exists()


def test_a_file_or_fifo_as_a_component_is_refused(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("x")
    os.mkfifo(tmp_path / "fifo")
    assert refused(tmp_path / "file" / "sub", create_mode=0o755).message == \
        "refusing to use: Not a directory"
    assert refused(tmp_path / "fifo", create_mode=0o755).message == \
        "refusing to use: not a regular file or directory"


@pytest.mark.parametrize("bits", [0o020, 0o002])
def test_writable_by_group_or_others_is_refused(tmp_path: Path, bits: int) -> None:
    (tmp_path / "shared" / "base").mkdir(parents=True)
    os.chmod(tmp_path / "shared", 0o755 | bits)
    err = refused(tmp_path / "shared" / "base")
    assert err.source == str(tmp_path / "shared")
    assert err.message == f"refusing to use: writable by group or others (mode {0o755 | bits:04o})"
    os.chmod(tmp_path / "shared", 0o755)
    os.chmod(tmp_path / "shared" / "base", 0o755 | bits)
    assert refused(tmp_path / "shared" / "base").source == str(tmp_path / "shared" / "base")


def test_sticky_is_allowed_above_the_last_directory_only(tmp_path: Path) -> None:
    (tmp_path / "tmp" / "base").mkdir(parents=True)
    os.chmod(tmp_path / "tmp", 0o1777)
    fd = open_dir(str(tmp_path / "tmp" / "base"))
    assert fd is not None
    os.close(fd)
    err = refused(tmp_path / "tmp")  # others could plant entries where the caller creates its own
    assert "writable by group or others (mode 1777)" in err.message
    refused(tmp_path / "tmp", private=True)


@needs_root
def test_a_directory_of_another_user_is_refused(tmp_path: Path) -> None:
    (tmp_path / "theirs" / "base").mkdir(parents=True)
    os.chown(tmp_path / "theirs", NOBODY, NOBODY)
    err = refused(tmp_path / "theirs" / "base", create_mode=0o755)
    assert (err.source, err.message) == (str(tmp_path / "theirs"), "refusing to use: owned by uid 65534")
    os.chown(tmp_path / "theirs", 0, 0)
    os.chown(tmp_path / "theirs" / "base", NOBODY, NOBODY)
    assert refused(tmp_path / "theirs" / "base").message == "refusing to use: owned by uid 65534"
    assert refused(tmp_path / "theirs" / "base", private=True).message == \
        "refusing to use: directory owned by uid 65534, not 0"
    assert mode(tmp_path / "theirs" / "base") == 0o755  # a refused directory is not narrowed


def test_the_callers_error_class_is_raised(tmp_path: Path) -> None:
    (tmp_path / "link").symlink_to(tmp_path)
    with pytest.raises(OddError, match="symlink"):
        open_dir(str(tmp_path / "link"), error=OddError)


def test_the_root_directory_is_never_made_private() -> None:
    before = mode(Path("/"))
    with pytest.raises(UnsafePathError, match="root directory"):
        open_dir("/", private=True)
    assert mode(Path("/")) == before
    fd = open_dir("/")
    assert fd is not None
    os.close(fd)


def test_check_private_and_why_refused_on_files(tmp_path: Path) -> None:
    path = tmp_path / "f"
    path.write_text("x")
    os.chmod(path, 0o600)
    check_private(os.stat(path), str(path), "file")
    os.chmod(path, 0o620)
    with pytest.raises(UnsafePathError, match=r"file writable by group or others \(mode 0620\)"):
        check_private(os.stat(path), str(path), "file")
    (tmp_path / "l").symlink_to(path)
    dfd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        with pytest.raises(OSError) as info:
            os.open("l", os.O_RDONLY | os.O_NOFOLLOW, dir_fd=dfd)
        assert why_refused(dfd, "l", info.value) == "is a symlink"
        assert why_refused(dfd, "gone", FileNotFoundError(2, "No such file or directory")) == \
            "No such file or directory"
    finally:
        os.close(dfd)


def test_replace_file_sets_the_mode_and_replaces_a_symlink_without_following_it(tmp_path: Path) -> None:
    from gpuslurm.safedir import replace_file

    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    target = tmp_path / "gres.conf"
    target.symlink_to(victim)
    old = os.umask(0o077)
    try:
        replace_file(str(target), b"new\n", 0o644)
    finally:
        os.umask(old)
    assert not target.is_symlink() and target.read_text() == "new\n"
    assert stat.S_IMODE(target.stat().st_mode) == 0o644 and victim.read_text() == "precious\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["gres.conf", "victim"]  # no temporary left


def test_replace_at_removes_its_own_stale_temporary_but_refuses_a_planted_one(tmp_path: Path) -> None:
    from gpuslurm.safedir import replace_at

    tmp = tmp_path / f".map.json.{os.getpid()}.tmp"
    tmp.write_text("left by a crash")
    dfd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        replace_at(dfd, "map.json", b"{}", 0o600)
        assert (tmp_path / "map.json").read_text() == "{}" and not tmp.exists()
        tmp.symlink_to(tmp_path / "elsewhere")
        with pytest.raises(UnsafePathError, match="a symlink is already at the temporary name"):
            replace_at(dfd, "map.json", b"[]", 0o600)
    finally:
        os.close(dfd)
    assert (tmp_path / "map.json").read_text() == "{}" and not (tmp_path / "elsewhere").exists()


def test_read_regular_refuses_what_could_block_or_never_end(tmp_path: Path) -> None:
    from gpuslurm.safedir import NotRegularFileError, read_regular

    f = tmp_path / "f"
    f.write_bytes(b"abc")
    assert read_regular(str(f)) == b"abc"
    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "d").mkdir()
    for path, word in ((tmp_path / "fifo", "FIFO"), (tmp_path / "d", "directory"),
                       (Path("/dev/zero"), "character device"), (Path("/dev/urandom"), "character device")):
        with pytest.raises(NotRegularFileError, match=word):
            read_regular(str(path))
    assert read_regular("/dev/null") == b""  # the classic empty config
    (tmp_path / "link").symlink_to(f)
    assert read_regular(str(tmp_path / "link")) == b"abc"
    with pytest.raises(OSError):
        read_regular(str(tmp_path / "link"), follow=False)
    with pytest.raises(OSError, match="larger than 2 bytes"):
        read_regular(str(f), 2)


# -- the reader's ACL: the file stays ours, one more uid reads it ----------------------------------

@given(st.integers(0, 0o777), st.integers(0, 0xFFFFFFFE))
def test_a_reader_acl_s_bytes_are_the_five_entries_the_kernel_orders(bits: int, reader: int) -> None:
    entries = acl_entries(reader_acl(bits, reader))
    group = (bits >> 3) & 0o7
    assert entries == [(0x01, bits >> 6, 0xFFFFFFFF), (0x02, 0o4, reader), (0x04, group, 0xFFFFFFFF),
                       (0x10, group | 0o4, 0xFFFFFFFF), (0x20, bits & 0o7, 0xFFFFFFFF)]


@pytest.mark.parametrize("reader", [-1, 0xFFFFFFFF, 2**32])
def test_a_reader_acl_refuses_what_is_not_a_uid(reader: int) -> None:
    with pytest.raises(ValueError, match="not a uid"):
        reader_acl(0o400, reader)


@pytest.mark.parametrize("data", [b"", b"\x02\x00\x00", b"\x02\x00\x00\x00\x01", b"\x01\x00\x00\x00"])
def test_acl_entries_refuses_other_bytes(data: bytes) -> None:
    with pytest.raises(ValueError, match="not a POSIX ACL"):
        acl_entries(data)


@settings(max_examples=40, deadline=None)
@given(st.sampled_from([0o400, 0o440, 0o600, 0o640, 0o644]), st.integers(1, 0xFFFFFFFE))
def test_the_kernel_takes_a_reader_acl_as_written(bits: int, reader: int) -> None:
    # the kernel's own check (posix_acl_valid): an entry out of order or a bad tag is EINVAL
    import tempfile

    with tempfile.TemporaryDirectory(dir="/tmp") as d:
        dfd = os.open(d, os.O_RDONLY | os.O_DIRECTORY)
        try:
            replace_at(dfd, "f", b"x", bits, reader=reader)
        finally:
            os.close(dfd)
        path = os.path.join(d, "f")
        assert os.getxattr(path, ACL_XATTR) == reader_acl(bits, reader)
        # the mask is what the kernel shows as the group's bits; the owner and others keep theirs
        assert stat.S_IMODE(os.stat(path).st_mode) == bits | 0o040


@needs_root
def test_the_reader_reads_root_s_file_and_can_neither_widen_nor_grow_it() -> None:
    import tempfile

    with tempfile.TemporaryDirectory(dir="/tmp") as d:  # 0700 under pytest's: nobody cannot reach
        os.chmod(d, 0o755)
        dfd = os.open(d, os.O_RDONLY | os.O_DIRECTORY)
        try:
            replace_at(dfd, "figures.json", b"{}\n", 0o400, reader=NOBODY)
        finally:
            os.close(dfd)
        _reader_tries(os.path.join(d, "figures.json"))


def _reader_tries(path: str) -> None:
    import subprocess

    assert os.stat(path).st_uid == 0
    tries = {"read": "print(open(p).read(), end='')",
             "chmod": "os.chmod(p, 0o600)", "append": "open(p, 'a')", "truncate": "os.truncate(p, 0)",
             "rewrite": "open(p, 'r+')", "utime": "os.utime(p, (0, 2**31))"}
    got = {}
    for what, code in tries.items():
        done = subprocess.run(["/usr/bin/python3", "-c", f"import os; p = {path!r}\n{code}"], user=NOBODY,
                              group=NOBODY, extra_groups=[], capture_output=True, text=True, timeout=60,
                              cwd="/", check=False)
        got[what] = done.stdout if done.returncode == 0 else done.stderr.splitlines()[-1].split(":")[0]
    assert got == {"read": "{}\n", "chmod": "PermissionError", "append": "PermissionError",
                   "truncate": "PermissionError", "rewrite": "PermissionError", "utime": "PermissionError"}
    other = subprocess.run(["/usr/bin/cat", path], user=1002, group=1002, extra_groups=[],
                           capture_output=True, timeout=60, check=False)
    assert other.returncode != 0 and b"Permission denied" in other.stderr
