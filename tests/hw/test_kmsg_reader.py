"""The kernel-log reader: once and only once across restarts, on a file and on the real /dev/kmsg."""

from __future__ import annotations

import errno
import os
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuslurm.hw.formats.kmsg_format import (
    KmsgCursor,
    KmsgRecord,
    format_cursor,
    parse_cursor,
    parse_record,
    parse_xid,
    split_records,
)
from gpuslurm.hw.live.kmsg import CURSOR_FILE, KmsgReader

BOOT = "4c6e53f2-19c9-4d03-a3bb-3747ff60f865"
NOBODY = 65534


def _line(seq: int, code: int = 79, bus: str = "3b") -> bytes:
    return (f"3,{seq},{seq * 1000},-;NVRM: Xid (PCI:0000:{bus}:00): {code}, pid=1, name=x, words\n"
            f" SUBSYSTEM=pci\n").encode()


def _setup(tmp_path: Path, *lines: bytes) -> tuple[Path, Path, Path]:
    log, boot, state = tmp_path / "kmsg", tmp_path / "boot_id", tmp_path / "state"
    log.write_bytes(b"6,1,5,-;Linux version\n" + b"".join(lines))
    boot.write_text(BOOT + "\n")
    return log, boot, state


def _reader(log: Path, boot: Path, state: Path, **kw: object) -> KmsgReader:
    r = KmsgReader(str(state), kmsg=str(log), boot_id=str(boot), **kw)  # type: ignore[arg-type]
    r.open()
    return r


def test_each_line_once_across_restarts(tmp_path: Path) -> None:
    log, boot, state = _setup(tmp_path, _line(2), _line(3, 48, "43"))
    r = _reader(log, boot, state)
    got = r.poll()
    assert [(x.seq, x.code, x.bus_id) for x in got.xids] == [(2, 79, "00000000:3B:00.0"),
                                                              (3, 48, "00000000:43:00.0")]
    assert got.problems == ()
    assert r.poll().xids == ()
    r.commit()
    r.close()
    assert os.stat(state / CURSOR_FILE).st_mode & 0o777 == 0o600
    with log.open("ab") as fh:
        fh.write(_line(4, 94))
    r = _reader(log, boot, state)  # the monitor restarted
    assert [x.seq for x in r.poll().xids] == [4]
    r.close()


def test_uncommitted_lines_are_read_again(tmp_path: Path) -> None:
    log, boot, state = _setup(tmp_path, _line(2))
    r = _reader(log, boot, state)
    assert len(r.poll().xids) == 1
    r.close()  # crashed before acting and committing
    r = _reader(log, boot, state)
    assert len(r.poll().xids) == 1


def test_other_boot_cursor_and_lost_lines(tmp_path: Path) -> None:
    log, boot, state = _setup(tmp_path, _line(20))
    state.mkdir()
    (state / CURSOR_FILE).write_bytes(format_cursor(KmsgCursor("00000000-0000-0000-0000-000000000000", 50)))
    os.chmod(state / CURSOR_FILE, 0o600)
    assert [x.seq for x in _reader(log, boot, state).poll().xids] == [20]  # new boot: all of it
    (state / CURSOR_FILE).write_bytes(format_cursor(KmsgCursor(BOOT, 5)))
    got = _reader(log, boot, state).poll()
    assert [x.seq for x in got.xids] == [20]
    assert got.problems == ("kernel log records 6..19 left the ring before gpuslurm read them",)


def test_corrupt_cursor_is_reported_and_everything_read(tmp_path: Path) -> None:
    log, boot, state = _setup(tmp_path, _line(2))
    state.mkdir()
    (state / CURSOR_FILE).write_bytes(b'{"boot_id": "\xff", "seq": 1e999}')
    os.chmod(state / CURSOR_FILE, 0o600)
    r = KmsgReader(str(state), kmsg=str(log), boot_id=str(boot))
    problems = r.open()
    assert len(problems) == 1 and "ignored" in problems[0]
    assert [x.seq for x in r.poll().xids] == [2]


def test_overrun_is_reported_and_reading_goes_on(tmp_path: Path) -> None:
    log, boot, state = _setup(tmp_path)
    chunks: list[bytes | OSError] = [_line(7), OSError(errno.EPIPE, "Broken pipe"), _line(90)]

    def read(fd: int, n: int) -> bytes:  # /dev/kmsg's behaviour on overrun, which a file cannot show
        if not chunks:
            raise BlockingIOError(errno.EAGAIN, "again")
        item = chunks.pop(0)
        if isinstance(item, OSError):
            raise item
        return item

    got = _reader(log, boot, state, read=read).poll()
    assert [x.seq for x in got.xids] == [7, 90]
    assert got.problems == ("the kernel log overran: records were lost before gpuslurm read them",)


def _records_since(fd: int) -> list[KmsgRecord]:
    """The records logged since ``fd`` (an O_NONBLOCK descriptor of /dev/kmsg) last read."""
    out = []
    while True:
        try:
            chunk = os.read(fd, 16384)
        except BlockingIOError:
            return out
        except OSError as exc:  # EPIPE: the ring overran; go on from the oldest record left
            if exc.errno != errno.EPIPE:
                raise
            continue
        out += [r for r in map(parse_record, split_records(chunk)) if r is not None]


@pytest.fixture
def kmsg_tail() -> Iterator[int]:
    """/dev/kmsg opened and read to its end: what it reads next was logged during the test."""
    if not os.access("/dev/kmsg", os.R_OK):
        pytest.skip("reading /dev/kmsg needs root (or CAP_SYSLOG)")
    fd = os.open("/dev/kmsg", os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    os.lseek(fd, 0, os.SEEK_END)
    yield fd
    os.close(fd)


@pytest.mark.skipif(os.geteuid() != 0 or not os.access("/dev/kmsg", os.W_OK),
                    reason="writing /dev/kmsg needs root")
def test_real_dev_kmsg_a_line_written_to_it_is_never_an_xid_and_is_counted_once(
        tmp_path: Path, kmsg_tail: int) -> None:
    """Root writes the driver's exact line to /dev/kmsg (with <3> and with <0>, the kernel's own
    facility): the kernel files both as LOG_USER, so neither is an Xid; the cursor passes them once."""
    tag = uuid.uuid4().hex[:12]
    state = tmp_path / "state"
    r = KmsgReader(str(state))
    r.open()
    r.poll()  # whatever this boot logged before
    r.commit()
    with open("/dev/kmsg", "w") as kmsg:
        for pri in ("<3>", "<0>"):
            kmsg.write(f"{pri}NVRM: Xid (PCI:0000:3b:00): 79, pid='<unknown>', name={tag}, "
                       "GPU has fallen off the bus.\n")
            kmsg.flush()
    ours = [rec for rec in _records_since(kmsg_tail) if tag in rec.message]
    assert len(ours) == 2 and all(rec.facility == 1 for rec in ours)  # LOG_USER, whatever was asked
    assert [x for x in r.poll().xids if tag in x.text] == []
    r.commit()
    r.close()
    cursor = parse_cursor((state / CURSOR_FILE).read_bytes())
    assert cursor.seq >= max(rec.seq for rec in ours)  # a restart starts after them


@pytest.mark.skipif(os.geteuid() != 0 or not os.access("/usr/bin/unshare", os.X_OK),
                    reason="runs unshare as nobody, which needs root to start")
def test_real_overlayfs_record_of_an_ordinary_user_is_not_an_xid(tmp_path: Path, kmsg_tail: int) -> None:
    """The attack itself: ``nobody`` mounts an overlay in its own user namespace with a lowerdir
    holding the driver's Xid text. The kernel logs it in its own record (facility 0); the real
    reader on the real /dev/kmsg finds no Xid in it."""
    tag = uuid.uuid4().hex[:12]
    r = KmsgReader(str(tmp_path / "state"))
    r.open()
    r.poll()
    lower = rf"/nonexistent-{tag}/NVRM\: Xid (PCI\:0000\:07\:00)\: 48 DBE"
    proc = subprocess.run(["/usr/bin/unshare", "-Urm", "/usr/bin/mount", "-t", "overlay", "overlay",
                           "-o", f"lowerdir={lower}", "/tmp"],
                          user=NOBODY, group=NOBODY, extra_groups=[], env={"PATH": "/usr/bin:/bin"},
                          cwd="/", capture_output=True, text=True, timeout=30)
    ours = [rec for rec in _records_since(kmsg_tail) if tag in rec.message]
    if not ours:
        pytest.skip(f"the kernel logged nothing for nobody's overlay mount (rc {proc.returncode}: "
                    f"{proc.stderr.strip()[:200]})")
    (rec,) = ours
    assert rec.facility == 0 and f"'/nonexistent-{tag}/NVRM: Xid (PCI:0000:07:00): 48 DBE'" in rec.message
    assert parse_xid(rec) is None
    assert [x for x in r.poll().xids if x.bus_id == "00000000:07:00.0"] == []
    r.close()
