"""Pure throttle state: durations, times, add/remove/expire, merging, violations → throttles."""

from __future__ import annotations

from datetime import datetime

import pytest

from gpuslurm.errors import InputError
from gpuslurm.policy.throttle import (
    SyncPolicy,
    Throttle,
    active_throttles,
    add_throttle,
    apply_sync,
    check_mode,
    check_user,
    clean_text,
    make_throttle,
    parse_duration,
    parse_until,
    remove_throttle,
    stricter,
    throttles_from_violations,
    violation_from_line,
    violation_to_line,
)
from gpuslurm.samples import Violation

NOW = 1_900_000_000


@pytest.mark.parametrize(("text", "seconds"), [
    ("90s", 90), ("30m", 1800), ("2h", 7200), ("1d", 86400), ("1w", 604800), ("1h30m", 5400),
    ("2H", 7200), (" 1d 2h ", 93600), ("1.5h", 5400),  # one duration parser: fractions too
])
def test_durations(text: str, seconds: int) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "2", "2y", "h", "-1h", "0s", "1h junk", "400d", "0.1s"])
def test_bad_durations_are_input_errors(text: str) -> None:
    with pytest.raises(InputError) as err:
        parse_duration(text)
    assert err.value.exit_code == 2 and "\n" not in str(err.value)


def test_until_forms() -> None:
    assert parse_until("@1900003600", NOW) == 1_900_003_600
    iso = datetime.fromtimestamp(NOW + 7200).strftime("%Y-%m-%dT%H:%M:%S")
    assert parse_until(iso, NOW) == NOW + 7200
    assert parse_until("2030-03-18T00:00:00+00:00", NOW) == 1_900_022_400  # an explicit offset
    # HH:MM is its next occurrence: one minute ago means tomorrow
    past = datetime.fromtimestamp(NOW - 60).strftime("%H:%M")
    assert 0 < parse_until(past, NOW) - NOW <= 86400


@pytest.mark.parametrize("text", ["yesterday", "@1899999999", "2020-01-01", "@9999999999", "25:00"])
def test_bad_or_past_until_is_an_input_error(text: str) -> None:
    with pytest.raises(InputError):
        parse_until(text, NOW)


@pytest.mark.parametrize("name", ["alice", "a.b-c_d", "svc$", "jdoe@ad.example.org", "_x"])
def test_user_names_accepted(name: str) -> None:
    assert check_user(name) == name


@pytest.mark.parametrize("name", ["", "a b", "a\tb", "#x", "-rf", "x" * 300, "ünï"])
def test_user_names_refused(name: str) -> None:
    with pytest.raises(InputError):
        check_user(name)


def test_modes_and_values() -> None:
    assert check_mode("reject", None, cap_default=1, nice_default=100) == 0
    assert check_mode("cap", None, cap_default=2, nice_default=100) == 2
    assert check_mode("priority", 7, cap_default=2, nice_default=100) == 7
    for mode, value in (("bogus", None), ("cap", 0), ("priority", 0), ("priority", 2**31), ("reject", 3)):
        with pytest.raises(InputError):
            check_mode(mode, value, cap_default=1, nice_default=1)


def test_texts_become_one_short_line() -> None:
    assert clean_text("a\tb\nc\x00d  e") == "a b c d e"
    assert len(clean_text("x" * 1000)) == 200
    t = make_throttle("alice", NOW + 5, "reject", 0, created=NOW, reason="two\nlines\tand tab")
    assert t.reason == "two lines and tab"


def test_add_replaces_remove_reports_and_expired_go() -> None:
    a = Throttle("alice", NOW + 100)
    b = Throttle("bob", NOW + 100, "cap", 2)
    old = Throttle("old", NOW - 1)
    state = add_throttle([a, old], b, NOW)
    assert [t.user for t in state] == ["alice", "bob"]
    state = add_throttle(state, a._replace(until=NOW + 5, mode="priority", value=9), NOW)
    assert state[0].until == NOW + 5 and state[0].mode == "priority"  # an explicit add wins
    kept, removed = remove_throttle(state, "alice", NOW)
    assert removed and [t.user for t in kept] == ["bob"]
    assert remove_throttle(kept, "alice", NOW) == (kept, False)
    assert active_throttles([a], NOW + 100) == ()  # `until` is exclusive


def test_stricter_never_softens_or_shortens() -> None:
    manual = Throttle("a", NOW + 1000, "reject", 0, NOW - 10, "admin", "manual")
    auto = Throttle("a", NOW + 50, "cap", 1, NOW, "", "auto")
    merged = stricter(manual, auto)
    assert (merged.mode, merged.until, merged.reason) == ("reject", NOW + 1000, "manual")
    longer = stricter(auto, Throttle("a", NOW + 5000, "cap", 3, NOW))
    assert (longer.mode, longer.value, longer.until) == ("cap", 1, NOW + 5000)
    assert stricter(auto, Throttle("a", NOW + 10, "reject")).mode == "reject"


def _v(user: str | None, kind: str = "rogue", start: float = NOW - 300, dur: float = 60,
       pid: int | None = 4242) -> Violation:
    return Violation(kind=kind, node="gpu01", user=user, job_id="17", pid=pid, process="python",
                     gpu_uuid="GPU-0a1b", start=start, duration_s=dur, evidence="pid 4242 on GPU-0a1b")


def test_violations_become_throttles_per_policy() -> None:
    policy = SyncPolicy(kinds=("rogue",), duration_s=3600, mode="reject")
    vs = [_v("alice"), _v("alice", start=NOW - 100, dur=10), _v("bob", kind="idle"), _v(None),
          _v("carol", start=NOW - 10_000, dur=10), _v("bad name")]
    out = throttles_from_violations(vs, policy, NOW)
    assert [t.user for t in out] == ["alice"]  # bob: kind not configured; carol: long over
    assert out[0].until == NOW - 90 + 3600  # from the latest sighting
    assert "GPU-0a1b" in out[0].reason and "pid 4242" in out[0].reason and "gpu01" in out[0].reason


def test_sync_merges_and_reports_only_changes() -> None:
    policy = SyncPolicy(duration_s=3600)
    proposed = throttles_from_violations([_v("alice")], policy, NOW)
    state, changed = apply_sync([], proposed, NOW)
    assert [t.user for t in changed] == ["alice"]
    again, changed2 = apply_sync(state, proposed, NOW)
    assert changed2 == () and again == state  # idempotent: a second sync changes nothing


def test_violation_lines_round_trip_and_bad_ones_raise() -> None:
    v = _v("alice")
    line = violation_to_line(v)
    assert "\n" not in line and violation_from_line(line) == v
    assert violation_from_line(line.replace('"v":1', '"v":1,"future_key":3')) == v
    for bad in ("", "[]", '{"v":2}', line.replace('"v":1', '"v":9'), line.replace('"start"', '"x"'),
                line[: len(line) // 2]):
        with pytest.raises(ValueError):
            violation_from_line(bad)
