"""The Xid table, the kernel log's record and Xid line parsers, and the cursor: examples and properties."""

from __future__ import annotations

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from gpuslurm.hw.formats.kmsg_format import (
    MAX_PRI,
    XID_PREFIX,
    KmsgCursor,
    KmsgRecord,
    format_cursor,
    kmsg_bus_id,
    parse_boot_id,
    parse_cursor,
    parse_record,
    parse_xid,
    split_records,
)
from gpuslurm.hw.model.node import normalise_bus_id
from gpuslurm.policy import xid

# As the 5xx drivers write them (format from NVIDIA's Xid documentation; bus ids of a DGX H100).
REAL = (
    b"4,1234,987654321,-;NVRM: Xid (PCI:0000:3b:00): 79, pid='<unknown>', name=<unknown>, "
    b"GPU has fallen off the bus.\n SUBSYSTEM=pci\n DEVICE=+pci:0000:3b:00.0\n"
)
BOOT = "4c6e53f2-19c9-4d03-a3bb-3747ff60f865"
KERN_ERR = 3  # PRI of a kernel (facility 0) record at level 3, as the driver's Xid lines are

# Read from /dev/kmsg on the project's test host (Linux 6.18) after `nobody` made them: an overlayfs
# mount in an unprivileged user namespace (`unshare -Urm`, lowerdir holding the Xid text) and an
# execve with a NULL argv of a file whose name holds it (logged once per boot, Linux >= 5.18). Both
# are the kernel's own records (facility 0): the facility alone does not tell them from the driver.
OVERLAYFS = (b"3,339,316543191,-;overlayfs: failed to resolve "
             b"'/nonexistent/NVRM: Xid (PCI:0000:07:00): 48 DBE': -2\n")
NULL_ARGV = (b"4,340,326670542,-;process 'python3' launched '/tmp/xidnull/NVRM: Xid (PCI:0000:07:00): 79, "
             b"GPU has fallen off the bus' with NULL argv: empty string added\n")
# What root's `echo '<3>NVRM: Xid ...' > /dev/kmsg` becomes (also with <0>): the kernel gives a
# line written from user space LOG_USER, so PRI is 8 + 3.
INJECTED = b"11,341,326700000,-;NVRM: Xid (PCI:0000:3b:00): 79, pid=1, name=x, GPU has fallen off the bus.\n"


def test_real_xid_79_line() -> None:
    rec = parse_record(REAL)
    assert rec == KmsgRecord(1234, 987654321, rec.message if rec else "", 4)
    assert rec is not None and (rec.facility, rec.level) == (0, 4)
    line = parse_xid(rec)
    assert line is not None
    assert (line.seq, line.bus_id, line.code) == (1234, "00000000:3B:00.0", 79)
    assert "fallen off the bus" in line.text
    assert line.bus_id == normalise_bus_id("0000:3b:00.0")  # the form the node model keys GPUs by


@pytest.mark.parametrize(("message", "want"), [
    ("NVRM: Xid (0000:9a:00): 48, pid=77, DBE (0x1) detected", ("00000000:9A:00.0", 48)),  # no "PCI:"
    ("NVRM: Xid (PCI:0001:c3:00): 13, pid=9, Graphics Exception", ("00000001:C3:00.0", 13)),
    ("NVRM: Xid (PCI:0000:3b:00.1): 94, Contained", ("00000000:3B:00.1", 94)),
    ("NVRM: Xid (PCI:0000:3b:00): 154, GPU recovery action changed from 0x0 (None) to 0x2 (Node Reboot "
     "Required)", ("00000000:3B:00.0", 154)),
])
def test_xid_variants(message: str, want: tuple[str, int]) -> None:
    line = parse_xid(KmsgRecord(1, 0, message, KERN_ERR))
    assert line is not None and (line.bus_id, line.code) == want


@pytest.mark.parametrize("message", [
    "NVRM: loading NVIDIA UNIX x86_64 Kernel Module",
    "NVRM: Xid (PCI:0000:3b:00): 99999999, huge",
    "NVRM: Xid (PCI:zz:3b:00): 79, bad bus",
    "NVRM: Xid (PCI:0000:3b:00) 79 no colon",
    "[  12.5] NVRM: Xid (PCI:0001:c3:00): 13, pid=9, dmesg's layout, not /dev/kmsg's",
    " NVRM: Xid (PCI:0000:3b:00): 79, a space first",
])
def test_not_xid(message: str) -> None:
    assert parse_xid(KmsgRecord(1, 0, message, KERN_ERR)) is None


@pytest.mark.parametrize("raw", [OVERLAYFS, NULL_ARGV], ids=["overlayfs", "null-argv"])
def test_a_users_text_inside_a_kernel_record_is_not_an_xid(raw: bytes) -> None:
    rec = parse_record(raw)
    assert rec is not None and rec.facility == 0  # the kernel's own record
    assert "NVRM: Xid (PCI:0000:07:00): " in rec.message
    assert parse_xid(rec) is None


def test_a_line_written_to_dev_kmsg_is_not_an_xid() -> None:
    rec = parse_record(INJECTED)
    assert rec is not None and rec.facility == 1 and rec.message.startswith(XID_PREFIX)
    assert parse_xid(rec) is None
    kernel = parse_record(INJECTED.replace(b"11,", b"3,", 1))  # the same line from the driver
    assert kernel is not None and parse_xid(kernel) is not None


@pytest.mark.parametrize("pri", [b"-1", b"2048", b"99999999999"])
def test_a_priority_the_kernel_cannot_write_is_not_a_record(pri: bytes) -> None:
    assert parse_record(pri + INJECTED[2:]) is None


def test_records_split_with_dictionary_lines() -> None:
    two = REAL + b"6,1235,987654400,-;usb 1-1: new device\n"
    recs = split_records(two)
    assert len(recs) == 2 and recs[0].endswith(b"DEVICE=+pci:0000:3b:00.0")
    assert [r.seq for r in map(parse_record, recs) if r] == [1234, 1235]


def test_xid_classes() -> None:
    assert xid.classify(79).kind == xid.HARDWARE and xid.classify(79).recovery == xid.REBOOT
    assert {xid.classify(c).kind for c in (13, 31, 43, 45)} == {xid.APPLICATION}
    assert xid.classify(63).kind == xid.RECORD
    assert not xid.is_fault(63, ())  # a record, pending remaps are read on their own
    assert xid.is_fault(31, ()) and not xid.is_fault(31, (13, 31, 43, 45))
    assert xid.classify(4242).kind == xid.UNKNOWN and xid.is_fault(4242, ())
    text = "GPU recovery action changed from 0x0 (None) to 0x2 (Node Reboot Required)"
    assert xid.recovery_from_text(154, text) == xid.REBOOT
    assert xid.recovery_from_text(154, "GPU recovery action changed from 0x0 (None) to 0x4 (Drain and "
                                       "Reset)") == xid.DRAIN
    assert xid.recovery_from_text(154, "garbled") == xid.RESET
    assert xid.recovery_from_text(154, "from 0x0 (None) to 0x2 (Node Reboot Required)") == xid.RESET
    # a process name before the driver's words is the user's: it never sets the recovery
    assert xid.recovery_from_text(154, "pid=1, name=to 0x2, GPU recovery action changed from 0x0 (None) "
                                       "to 0x1 (GPU Reset Required)") == xid.RESET
    assert xid.describe(79) == "Xid 79 (GPU has fallen off the bus; needs reboot)"


def test_default_ignore_is_the_application_class() -> None:
    from gpuslurm.config import XidCheck

    assert {c for c in XidCheck().ignore if xid.classify(c).kind != xid.RECORD} == \
        {c for c, info in xid.XID_TABLE.items() if info.kind == xid.APPLICATION}


def test_cursor_round_trip_and_refusals() -> None:
    cur = KmsgCursor(BOOT, 77)
    assert parse_cursor(format_cursor(cur)) == cur
    for bad in (b"", b"{}", b"[1]", b'{"boot_id": "x", "seq": 1}',
                b'{"boot_id": "%s", "seq": true}' % BOOT.encode(),
                b'{"boot_id": "%s", "seq": -2}' % BOOT.encode(), b"\xff\xfe",
                b'{"boot_id": "%s", "seq": 1, "x": 2}' % BOOT.encode()):
        with pytest.raises(ValueError):
            parse_cursor(bad)
    assert parse_boot_id(BOOT + "\n") == BOOT
    with pytest.raises(ValueError):
        parse_boot_id("../../etc")


# --- properties -------------------------------------------------------------------------------

hexes = st.text("0123456789abcdefABCDEF", min_size=1, max_size=2)


@given(st.integers(0, 0xFFFF), st.integers(0, 0xFF), st.integers(0, 0x1F), st.integers(0, 7))
def test_bus_id_matches_nvml_form(domain: int, bus: int, dev: int, fn: int) -> None:
    ours = kmsg_bus_id(f"{domain:04x}", f"{bus:02x}", f"{dev:02x}", str(fn))
    assert ours == normalise_bus_id(f"{domain:04x}:{bus:02x}:{dev:02x}.{fn}")


@given(st.integers(0, 2**64 - 1), st.integers(0, 2**63), st.integers(0, 65535), st.text(max_size=300))
def test_any_xid_record_round_trips(seq: int, ts: int, code: int, tail: str) -> None:
    raw = f"3,{seq},{ts},-;NVRM: Xid (PCI:0000:3b:00): {code}, {tail}".encode()
    recs = split_records(raw)
    rec = parse_record(recs[0]) if recs else None
    assert rec is not None and rec.seq == seq
    line = parse_xid(rec)
    assert line is not None and line.code == code and line.bus_id == "00000000:3B:00.0"
    assert line.text.isprintable() and len(line.text) <= 400


DRIVER_LINE = st.builds("NVRM: Xid (PCI:0000:{}:00): {}, {}".format,
                        st.sampled_from(["3b", "07", "61"]), st.integers(0, 65535), st.text(max_size=120))


@given(st.text(min_size=1, max_size=120), DRIVER_LINE, st.integers(0, MAX_PRI), st.integers(0, 2**64 - 1))
def test_xid_text_anywhere_but_at_the_start_is_never_an_xid(before: str, line: str, pri: int,
                                                            seq: int) -> None:
    message = before + line
    assume(not message.startswith(XID_PREFIX))
    for chunk in split_records(f"{pri},{seq},5,-;{message}\n".encode()):
        rec = parse_record(chunk)
        assert rec is None or parse_xid(rec) is None


@given(st.integers(1, 255), st.integers(0, 7), DRIVER_LINE, st.integers(0, 2**64 - 1))
def test_a_record_of_any_facility_but_the_kernels_is_never_an_xid(facility: int, level: int, line: str,
                                                                    seq: int) -> None:
    for chunk in split_records(f"{facility * 8 + level},{seq},5,-;{line}\n".encode()):
        rec = parse_record(chunk)
        assert rec is None or parse_xid(rec) is None


@given(st.binary(max_size=600))
def test_any_bytes_are_a_record_or_none(data: bytes) -> None:
    for chunk in split_records(data):
        rec = parse_record(chunk)
        if rec is not None:
            line = parse_xid(rec)
            assert line is None or (0 <= line.code <= 65535 and len(line.bus_id) == 16)


@given(st.binary(max_size=200))
def test_any_cursor_bytes_parse_or_value_error(data: bytes) -> None:
    try:
        cur = parse_cursor(data)
    except ValueError as exc:
        assert len(str(exc).splitlines()) == 1
    else:
        assert parse_cursor(format_cursor(cur)) == cur


@given(st.uuids().map(str), st.integers(-1, 2**64 - 1))
def test_every_cursor_round_trips(boot: str, seq: int) -> None:
    assert parse_cursor(format_cursor(KmsgCursor(boot, seq))) == KmsgCursor(boot, seq)


@given(st.integers(0, 100000))
def test_every_code_has_a_kind(code: int) -> None:
    info = xid.classify(code)
    assert info.kind in (xid.HARDWARE, xid.APPLICATION, xid.RECORD, xid.UNKNOWN)
    assert xid.describe(code).startswith(f"Xid {code} (")
