"""The PBS throttle's decisions (pure): GPUs in a select, reject / cap / priority, fail-open reads."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpuslurm.pbs.throttle import (
    MIN_PRIORITY,
    decide,
    job_gpus,
    read_throttles,
    select_gpus,
    throttle_for,
)
from gpuslurm.policy.throttle import Throttle, parse_throttle_file

NOW = 1_800_000_000
LINE = "alice\t{until}\t{mode}\t{value}\t1700000000\thelp@example.org\trogue processes\n"


def _file(mode: str = "reject", value: int = 0, until: int = NOW + 3600) -> str:
    return LINE.format(until=until, mode=mode, value=value)


@pytest.mark.parametrize(("select", "gpus"), [
    ("1:ncpus=4:ngpus=2", 2),
    ("2:ncpus=4:ngpus=2+ngpus=1", 5),
    ("1:ncpus=4", 0),
    ("ncpus=1:NGPUS=3", 3),
    ("3:ngpus=x", None),
    ("1:ngpus=", None),
    ("1:ngpus", None),
    ("", 0),
])
def test_select_gpus(select: str, gpus: int | None) -> None:
    assert select_gpus(select) == gpus


def test_job_gpus_takes_the_larger_count() -> None:
    assert job_gpus("1:ncpus=1", 4) == 4
    assert job_gpus("2:ngpus=2", 1) == 4
    assert job_gpus(None, None) == 0
    assert job_gpus("1:ngpus=?", 9) is None


@given(st.text(max_size=80))
def test_select_gpus_never_raises(text: str) -> None:
    found = select_gpus(text)
    assert found is None or found >= 0


def test_reject_refuses_gpu_jobs_only() -> None:
    t = throttle_for(parse_throttle_file(_file()), "alice", NOW)
    assert t is not None
    refused = decide(t, 1)
    assert refused.action == "reject"
    assert "alice" in refused.message and "help@example.org" in refused.message
    assert "rogue processes" in refused.message and len(refused.message.splitlines()) == 1
    assert decide(t, 0).action == "pass"
    assert decide(t, None).action == "reject"  # asks for GPUs, how many unreadable


def test_cap_refuses_above_the_cap_and_unreadable_counts() -> None:
    t = throttle_for(parse_throttle_file(_file("cap", 2)), "alice", NOW)
    assert decide(t, 2).action == "pass"
    over = decide(t, 3)
    assert over.action == "reject" and "limited to 2 GPU(s)" in over.message and "asks for 3" in over.message
    assert decide(t, None).action == "reject"


def test_priority_lowers_within_pbs_range() -> None:
    t = throttle_for(parse_throttle_file(_file("priority", 10000)), "alice", NOW)
    d = decide(t, 1, priority=0)
    assert (d.action, d.priority) == ("priority", MIN_PRIORITY)
    small = Throttle("alice", NOW + 10, "priority", 100)
    assert decide(small, 1, priority=50).priority == -50
    assert decide(small, 1, priority=MIN_PRIORITY).action == "pass"  # already lowest


def test_expired_other_users_and_junk_pass() -> None:
    assert throttle_for(parse_throttle_file(_file(until=NOW - 1)), "alice", NOW) is None
    assert throttle_for(parse_throttle_file(_file()), "bob", NOW) is None
    junk = _file() + "alice\tnot-a-time\treject\t0\t1\t\t\n"  # a junk line naming alice: she passes
    assert throttle_for(parse_throttle_file(junk), "alice", NOW) is None
    assert decide(None, 8).action == "pass"


def test_read_throttles_missing_fifo_and_bounded(tmp_path: Path) -> None:
    assert read_throttles(str(tmp_path / "absent")).throttles == ()
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(OSError):
        read_throttles(str(fifo))  # never blocks: the hook fails open on it
    big = tmp_path / "big"
    big.write_bytes(b"#" * ((16 << 20) + 1))
    with pytest.raises(OSError):
        read_throttles(str(big))
    good = tmp_path / "good"
    good.write_text(_file())
    assert [t.user for t in read_throttles(str(good)).throttles] == ["alice"]
