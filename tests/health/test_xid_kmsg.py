"""The Xid table, the kernel log's record and Xid line parsers, and the cursor: examples and properties."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpuslurm.hw.kmsg_format import (
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
from gpuslurm.hw.model import normalise_bus_id
from gpuslurm.policy import xid

# As the 5xx drivers write them (format from NVIDIA's Xid documentation; bus ids of a DGX H100).
REAL = (
    b"4,1234,987654321,-;NVRM: Xid (PCI:0000:3b:00): 79, pid='<unknown>', name=<unknown>, "
    b"GPU has fallen off the bus.\n SUBSYSTEM=pci\n DEVICE=+pci:0000:3b:00.0\n"
)
BOOT = "4c6e53f2-19c9-4d03-a3bb-3747ff60f865"


def test_real_xid_79_line() -> None:
    rec = parse_record(REAL)
    assert rec == KmsgRecord(1234, 987654321, rec.message if rec else "")
    assert rec is not None
    line = parse_xid(rec)
    assert line is not None
    assert (line.seq, line.bus_id, line.code) == (1234, "00000000:3B:00.0", 79)
    assert "fallen off the bus" in line.text
    assert line.bus_id == normalise_bus_id("0000:3b:00.0")  # the form the node model keys GPUs by


@pytest.mark.parametrize(("message", "want"), [
    ("NVRM: Xid (0000:9a:00): 48, pid=77, DBE (0x1) detected", ("00000000:9A:00.0", 48)),  # no "PCI:"
    ("[  12.5] NVRM: Xid (PCI:0001:c3:00): 13, pid=9, Graphics Exception", ("00000001:C3:00.0", 13)),
    ("NVRM: Xid (PCI:0000:3b:00.1): 94, Contained", ("00000000:3B:00.1", 94)),
    ("NVRM: Xid (PCI:0000:3b:00): 154, GPU recovery action changed from 0x0 (None) to 0x2 (Node Reboot "
     "Required)", ("00000000:3B:00.0", 154)),
])
def test_xid_variants(message: str, want: tuple[str, int]) -> None:
    line = parse_xid(KmsgRecord(1, 0, message))
    assert line is not None and (line.bus_id, line.code) == want


@pytest.mark.parametrize("message", [
    "NVRM: loading NVIDIA UNIX x86_64 Kernel Module",
    "NVRM: Xid (PCI:0000:3b:00): 99999999, huge",
    "NVRM: Xid (PCI:zz:3b:00): 79, bad bus",
    "NVRM: Xid (PCI:0000:3b:00) 79 no colon",
])
def test_not_xid(message: str) -> None:
    assert parse_xid(KmsgRecord(1, 0, message)) is None


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
    assert xid.recovery_from_text(154, "to 0x4 (Drain and Reset)") == xid.DRAIN
    assert xid.recovery_from_text(154, "garbled") == xid.RESET
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
