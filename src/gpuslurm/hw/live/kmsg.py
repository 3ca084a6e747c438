"""The kernel log as an Xid source: ``/dev/kmsg`` read without blocking, from a restart-safe cursor.

What a site sees in ``dmesg`` is what this reads: every ``NVRM: Xid`` record of the current boot
after the cursor. The cursor (boot id + the last sequence number counted) is written atomically to
a root-only file by :meth:`KmsgReader.commit`, which the caller runs once it has acted on the
records :meth:`KmsgReader.poll` returned, so a crash in between counts a line again rather than
losing it, and a restart never counts a committed line twice. A new boot restarts the sequence
numbers: a cursor of another boot is ignored and the whole ring is read.

Two ways to lose lines are reported, never hidden: the ring overran while we were reading
(``read`` fails with EPIPE; the kernel moves us to the oldest record it still has) and lines that
left the ring while nothing was reading (the first record after the cursor is further on than the
cursor's next one). A corrupt cursor file is reported too, and reading starts at the ring's start.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Callable
from typing import NamedTuple

from gpuslurm.hw.formats.kmsg_format import (
    KmsgCursor,
    XidLine,
    format_cursor,
    parse_boot_id,
    parse_cursor,
    parse_record,
    parse_xid,
    split_records,
)
from gpuslurm.hw.live import procfs
from gpuslurm.safedir import open_dir, read_private_at, replace_at

KMSG = "/dev/kmsg"
BOOT_ID = procfs.BOOT_ID
CURSOR_FILE = "kmsg-cursor.json"
READ_SIZE = 16384  # larger than the kernel's biggest record (a short buffer fails with EINVAL)
MAX_RECORDS_PER_POLL = 20000  # the rest is read next cycle: a flood cannot stall a cycle


class KmsgPoll(NamedTuple):
    xids: tuple[XidLine, ...]
    problems: tuple[str, ...]  # lines lost, a cursor ignored, a read that failed


class KmsgReader:
    """Reads Xid lines after the cursor kept in ``state_dir``; ``kmsg`` may be a file (tests)."""

    def __init__(self, state_dir: str, *, kmsg: str = KMSG, boot_id: str = BOOT_ID,
                 read: Callable[[int, int], bytes] = os.read) -> None:
        self.state_dir = state_dir
        self.kmsg = kmsg
        self.boot_id_path = boot_id
        self._read = read
        self._fd: int | None = None
        self._boot = ""
        self._done = -1  # last sequence number counted (committed or about to be)
        self._committed = -1
        self._started = False

    def open(self) -> tuple[str, ...]:
        """Open the log and load the cursor; problems worth a line (OSError if the log is unreadable)."""
        problems: list[str] = []
        with open(self.boot_id_path, encoding="ascii", errors="replace") as fh:
            try:
                self._boot = parse_boot_id(fh.read(100))
            except ValueError:
                raise OSError(errno.EINVAL, "not a boot id", self.boot_id_path) from None
        cursor, why = self._load_cursor()
        if why:
            problems.append(why)
        if cursor is not None and cursor.boot_id == self._boot:
            self._done = self._committed = cursor.seq
        self._fd = os.open(self.kmsg, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        return tuple(problems)

    def _load_cursor(self) -> tuple[KmsgCursor | None, str | None]:
        try:
            dfd = open_dir(self.state_dir)
        except OSError as exc:
            return None, f"kernel-log cursor directory {self.state_dir}: {exc.strerror}"
        if dfd is None:
            return None, None
        try:
            data = read_private_at(dfd, CURSOR_FILE, self.state_dir, 4096)
        except OSError as exc:
            return None, f"kernel-log cursor ignored: {exc.strerror}"
        finally:
            os.close(dfd)
        if data is None:
            return None, None
        try:
            return parse_cursor(data), None
        except ValueError as exc:
            return None, f"kernel-log cursor {os.path.join(self.state_dir, CURSOR_FILE)} ignored ({exc}); " \
                         "reading the whole log of this boot"

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def poll(self) -> KmsgPoll:
        """Every new Xid line since the last poll, without blocking; nothing is committed yet."""
        if self._fd is None:
            raise RuntimeError("KmsgReader.poll before open")
        xids: list[XidLine] = []
        problems: list[str] = []
        count = 0
        while count < MAX_RECORDS_PER_POLL:
            try:
                chunk = self._read(self._fd, READ_SIZE)
            except BlockingIOError:
                break
            except OSError as exc:
                if exc.errno == errno.EPIPE:
                    problems.append("the kernel log overran: records were lost before gpuslurm read them")
                    continue
                problems.append(f"cannot read {self.kmsg}: {exc.strerror}")
                break
            if not chunk:
                break
            for raw in split_records(chunk):
                rec = parse_record(raw)
                count += 1
                if rec is None or rec.seq <= self._done:
                    continue
                if not self._started and self._done >= 0 and rec.seq > self._done + 1:
                    problems.append(f"kernel log records {self._done + 1}..{rec.seq - 1} left the ring "
                                    "before gpuslurm read them")
                self._started = True
                self._done = rec.seq
                if (line := parse_xid(rec)) is not None:
                    xids.append(line)
        self._started = True
        return KmsgPoll(tuple(xids), tuple(problems))

    def commit(self) -> None:
        """Write the cursor (atomically, 0600) up to the last record polled; no-op if unchanged."""
        if self._done == self._committed:
            return
        dfd = open_dir(self.state_dir, create_mode=0o755)
        assert dfd is not None
        try:
            replace_at(dfd, CURSOR_FILE, format_cursor(KmsgCursor(self._boot, self._done)), 0o600,
                       source=os.path.join(self.state_dir, CURSOR_FILE))
        finally:
            os.close(dfd)
        self._committed = self._done
