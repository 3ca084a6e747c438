"""The out-of-service record: round trip, locking writer, refusals, GPU specs; and a property."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpuslurm.errors import InputError
from gpuslurm.hw.model.node import Gpu
from gpuslurm.state.out_of_service import (
    RECORD_FILE,
    OutOfService,
    OutOfServiceStore,
    format_record,
    parse_gpu_spec,
    parse_record,
    resolve_gpu,
)

U3 = "GPU-33333333-3333-3333-3333-333333333333"


def _gpus() -> list[Gpu]:
    # minor ≠ index, as on the real dual-A5000 capture
    return [Gpu(uuid=f"GPU-{i}{i}{i}{i}{i}{i}{i}{i}-{i}{i}{i}{i}-0000-0000-000000000000",
                index=i, minor=(i + 1) % 4, bus_id=f"00000000:{i + 0x18:02X}:00.0",
                name="NVIDIA RTX A5000", memory_mib=24564) for i in range(4)]


def test_round_trip_through_the_store(tmp_path: Path) -> None:
    store = OutOfServiceStore(str(tmp_path / "state"))
    assert store.read() == {}
    rec = OutOfService(U3, "Xid 79 (GPU has fallen off the bus)", 1700000000.5, "monitor", 3, 3)
    with store.update() as records:
        records[U3] = rec
    assert store.read() == {U3: rec}
    assert (os.stat(store.path).st_mode & 0o777) == 0o644  # pick, run by users, reads it
    with store.update() as records:
        del records[U3]
    assert store.read() == {}


def test_corrupt_record_is_bad_input_and_left_alone(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir()
    (state / RECORD_FILE).write_text('{"version": 1, "gpus": [{"uuid": "nope"}]}')
    before = (state / RECORD_FILE).read_bytes()
    store = OutOfServiceStore(str(state))
    with pytest.raises(InputError) as err:
        store.read()
    assert err.value.exit_code == 2 and RECORD_FILE in str(err.value)
    with pytest.raises(InputError), store.update() as records:
        records.clear()
    assert (state / RECORD_FILE).read_bytes() == before


def test_symlinked_record_is_refused(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir()
    (tmp_path / "elsewhere").write_text(format_record({}).decode())
    (state / RECORD_FILE).symlink_to(tmp_path / "elsewhere")
    with pytest.raises(InputError):
        OutOfServiceStore(str(state)).read()


def test_gpu_specs() -> None:
    gpus = _gpus()
    assert resolve_gpu("index:1", gpus).index == 1
    assert resolve_gpu("minor:1", gpus).index == 0  # minor 1 is index 0 here
    assert resolve_gpu(gpus[2].uuid.lower().replace("gpu-", "GPU-"), gpus) is gpus[2]
    with pytest.raises(InputError, match="ambiguous"):
        parse_gpu_spec("1")
    with pytest.raises(InputError, match="no GPU with index 9"):
        resolve_gpu("index:9", gpus)
    for bad in ("", "index:", "index:-1", "gpu3", "GPU-", "minor:1x", "\u2028"):
        with pytest.raises(InputError) as err:
            parse_gpu_spec(bad)
        assert len(str(err.value).splitlines()) == 1


@given(st.binary(max_size=400))
def test_any_record_bytes_parse_or_bad_input(data: bytes) -> None:
    try:
        parse_record(data, "/x/out-of-service.json")
    except InputError as exc:
        assert exc.exit_code == 2 and len(str(exc).splitlines()) == 1


entries = st.builds(
    OutOfService,
    uuid=st.from_regex(r"GPU-[0-9a-f]{8}-[0-9a-f]{4}", fullmatch=True),
    reason=st.text(st.characters(min_codepoint=32, max_codepoint=0x7E), max_size=200).map(str.strip),
    since=st.floats(0, 4e9, allow_nan=False),
    by=st.sampled_from(["admin", "monitor", "prolog", "health"]),
    index=st.none() | st.integers(0, 999), minor=st.none() | st.integers(0, 999))


@given(st.lists(entries, max_size=6))
def test_every_record_round_trips(items: list[OutOfService]) -> None:
    records = {r.uuid: r for r in items}
    assert parse_record(format_record(records), "x") == records
    json.loads(format_record(records))


@given(st.text(max_size=30))
def test_any_spec_parses_or_bad_input(spec: str) -> None:
    try:
        kind, _ = parse_gpu_spec(spec)
    except InputError as exc:
        assert len(str(exc).splitlines()) == 1
    else:
        assert kind in ("uuid", "index", "minor")


@given(st.one_of(st.text(max_size=90),
                 st.from_regex(r"GPU-[0-9A-Za-z-]{1,82}", fullmatch=True),
                 st.from_regex(r"(index|minor|idx):[0-9]{0,8}", fullmatch=True)))
def test_gpu_specs_are_read_as_the_documented_patterns_say(text: str) -> None:
    """The spec reader avoids ``re`` (pick's start-up path); it accepts exactly the documented
    forms, ``GPU-`` + 1..80 of [0-9A-Za-z-] and ``index:N``/``minor:N`` with 1..6 digits."""
    import re

    from gpuslurm.state.out_of_service import parse_gpu_spec

    stripped = text.strip()
    uuid = re.fullmatch(r"GPU-[0-9A-Za-z-]{1,80}", stripped)
    spec = re.fullmatch(r"(index|minor):([0-9]{1,6})", stripped)
    try:
        got = parse_gpu_spec(text)
    except InputError:
        assert not uuid and not spec
        return
    assert got == (("uuid", stripped) if uuid else (spec.group(1), int(spec.group(2))))  # type: ignore[union-attr]
