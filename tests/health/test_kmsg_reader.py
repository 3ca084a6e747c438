"""The kernel-log reader: once and only once across restarts, on a file and on the real /dev/kmsg."""

from __future__ import annotations

import errno
import os
import uuid
from pathlib import Path

import pytest

from gpuslurm.hw.kmsg import CURSOR_FILE, KmsgReader
from gpuslurm.hw.kmsg_format import KmsgCursor, format_cursor

BOOT = "4c6e53f2-19c9-4d03-a3bb-3747ff60f865"


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


@pytest.mark.skipif(os.geteuid() != 0 or not os.access("/dev/kmsg", os.W_OK),
                    reason="writing /dev/kmsg needs root")
def test_real_dev_kmsg_once_across_a_restart(tmp_path: Path) -> None:
    tag = uuid.uuid4().hex[:12]
    state = tmp_path / "state"
    r = KmsgReader(str(state))
    r.open()
    r.poll()  # whatever this boot logged before
    r.commit()
    with open("/dev/kmsg", "w") as kmsg:  # the driver's format, as root can write it
        kmsg.write(f"<3>NVRM: Xid (PCI:0000:3b:00): 79, pid='<unknown>', name={tag}, "
                   "GPU has fallen off the bus.\n")
    ours = [x for x in r.poll().xids if tag in x.text]
    assert [(x.code, x.bus_id) for x in ours] == [(79, "00000000:3B:00.0")]
    r.commit()
    r.close()
    again = KmsgReader(str(state))
    again.open()
    assert [x for x in again.poll().xids if tag in x.text] == []
    again.close()
