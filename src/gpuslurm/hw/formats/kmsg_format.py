"""The kernel log's record format and the driver's Xid lines in it, and the reader's cursor (pure).

A read of ``/dev/kmsg`` returns one record: ``PRI,SEQ,TS_USEC,FLAGS[,…];MESSAGE`` then optional
dictionary lines that start with a space, each ending in a newline. ``PRI`` is the syslog
priority, ``facility * 8 + level``. The kernel escapes unprintable bytes as ``\\xNN``, but
gpuslurm does not trust that: anyone who can write to ``/dev/kmsg`` chooses the message, so every
field is checked and a record that does not parse is skipped, never fatal.

The NVIDIA driver writes ``NVRM: Xid (PCI:0000:3b:00): 79, pid=…, GPU has fallen off the bus.``
(older drivers leave out ``PCI:``). The bus id has a 4-digit domain and no function; NVML's has
8 digits, upper case, and a function: :func:`kmsg_bus_id` gives NVML's form (function 0, a GPU's).

Only the driver's own record is an Xid: the message *starts* with ``NVRM: Xid (`` and the record's
facility is the kernel's (0). The kernel logs text that ordinary users choose inside its own
records (an overlayfs mount in an unprivileged user namespace logs ``overlayfs: failed to resolve
'<lowerdir>'``; Linux 5.18 on logs ``process '<path>' launched '<path>' with NULL argv``), so
``NVRM: Xid (`` further on in a message is a user's text, never the driver's. Writes to
``/dev/kmsg`` from user space never get facility 0 (the kernel gives them LOG_USER unless they
name another non-zero facility: Documentation/ABI/testing/dev-kmsg), so the facility tells the
driver's printk from an injected line. The text after the code can hold the name of the process
that faulted (``name=…``, chosen by the user): it is kept for logs only, bounded and printable,
and never becomes part of a reason or a command.

The cursor is where the reader stopped: the boot it read (``/proc/sys/kernel/random/boot_id``;
sequence numbers restart at each boot) and the last sequence number it counted.
"""

from __future__ import annotations

import json
import re
from typing import Any, NamedTuple

MAX_SEQ = (1 << 64) - 1
MAX_XID = 65535
MAX_TEXT = 400  # of an Xid's text kept for reasons and logs

MAX_PRI = 255 * 8 + 7  # the kernel keeps the facility in a byte, the level in three bits
KERNEL_FACILITY = 0  # LOG_KERN: printk's records; user-space writes to /dev/kmsg never get it
XID_PREFIX = "NVRM: Xid ("

_HEADER_RE = re.compile(r"([0-9]{1,10}),([0-9]{1,20}),([0-9]{1,20}),[^;]{0,64};")
_XID_RE = re.compile(
    r"NVRM: Xid \((?:PCI:)?([0-9a-fA-F]{4,8}):([0-9a-fA-F]{2}):([0-9a-fA-F]{2})(?:\.([0-7]))?\): "
    r"([0-9]{1,5})\b,?\s*(.*)")
_BOOT_ID_RE = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


class KmsgRecord(NamedTuple):
    seq: int
    ts_usec: int  # since boot (monotonic)
    message: str  # the first line, without the dictionary lines
    pri: int  # facility * 8 + level

    @property
    def facility(self) -> int:
        return self.pri >> 3

    @property
    def level(self) -> int:
        return self.pri & 7


class XidLine(NamedTuple):
    """An Xid the driver logged: on the GPU at ``bus_id`` (NVML's form)."""

    seq: int
    bus_id: str
    code: int
    text: str  # what follows the code (pid, name, the driver's words), bounded and one line


class KmsgCursor(NamedTuple):
    boot_id: str
    seq: int  # the last sequence number counted; -1 when none yet


def parse_record(data: bytes) -> KmsgRecord | None:
    """One ``/dev/kmsg`` record; None when ``data`` does not have the record's shape."""
    text = data.decode("utf-8", "replace")
    match = _HEADER_RE.match(text)
    if match is None:
        return None
    pri, seq, ts = int(match.group(1)), int(match.group(2)), int(match.group(3))
    if seq > MAX_SEQ or pri > MAX_PRI:
        return None
    body = text[match.end():]
    message = body.split("\n", 1)[0]
    return KmsgRecord(seq, ts, message, pri)


def split_records(chunk: bytes) -> list[bytes]:
    """The records in ``chunk``: one per read on ``/dev/kmsg``, several when read from a file.

    A line that starts with a space continues the record before it (a dictionary line).
    """
    records: list[bytes] = []
    for line in chunk.split(b"\n"):
        if not line:
            continue
        if line.startswith(b" ") and records:
            records[-1] += b"\n" + line
        else:
            records.append(line)
    return records


def kmsg_bus_id(domain: str, bus: str, device: str, function: str | None = None) -> str:
    """NVML's form of the kernel log's bus id parts: ``00000000:3B:00.0``."""
    return f"{int(domain, 16):08X}:{int(bus, 16):02X}:{int(device, 16):02X}.{int(function or '0', 16):X}"


def parse_xid(record: KmsgRecord) -> XidLine | None:
    """The Xid in a record, or None when it is not the driver's own Xid line: a kernel record
    (facility 0) whose message starts with ``NVRM: Xid (``."""
    if record.facility != KERNEL_FACILITY or not record.message.startswith(XID_PREFIX):
        return None
    match = _XID_RE.match(record.message)
    if match is None:
        return None
    domain, bus, device, function, code, rest = match.groups()
    if int(code) > MAX_XID:
        return None
    clean = "".join(c if c.isprintable() else "?" for c in rest[:MAX_TEXT]).strip()
    return XidLine(record.seq, kmsg_bus_id(domain, bus, device, function), int(code), clean)


def format_cursor(cursor: KmsgCursor) -> bytes:
    """The cursor file's content."""
    return (json.dumps({"boot_id": cursor.boot_id, "seq": cursor.seq}) + "\n").encode()


def parse_cursor(data: bytes) -> KmsgCursor:
    """A cursor file's content; ValueError naming what is wrong."""
    try:
        doc: Any = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        raise ValueError("not a JSON cursor") from None
    if not isinstance(doc, dict) or set(doc) != {"boot_id", "seq"}:
        raise ValueError("must be an object with boot_id and seq")
    boot, seq = doc["boot_id"], doc["seq"]
    if not isinstance(boot, str) or not _BOOT_ID_RE.fullmatch(boot):
        raise ValueError("boot_id is not a boot id")
    if not isinstance(seq, int) or isinstance(seq, bool) or not -1 <= seq <= MAX_SEQ:
        raise ValueError("seq is not a sequence number")
    return KmsgCursor(boot, seq)


def parse_boot_id(text: str) -> str:
    """``/proc/sys/kernel/random/boot_id``'s content, checked; ValueError when it is not one."""
    boot = text.strip()
    if not _BOOT_ID_RE.fullmatch(boot):
        raise ValueError("not a boot id")
    return boot
