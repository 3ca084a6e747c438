"""Energy in ``gpuslurm jobstats``: NVML's total energy counter stored with each sample and read
back as the rises between samples, checked against hand-computed integrals, across a counter
that restarts (a driver reload, a GPU reset) and through the minute rollup; a store of schema 1
upgraded without losing a row; the replay NVML library serving the counter to the monitor."""

from __future__ import annotations

import json
import math
import sqlite3
import tempfile
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpuslurm.cli.main import main
from gpuslurm.config import parse_config
from gpuslurm.report.jobstats import energy_parts
from gpuslurm.report.jobstats_load import job_stats
from gpuslurm.samples import MAX_GPU_POWER_W, Allocation, Cycle, GpuSample
from gpuslurm.state import store_file
from gpuslurm.state.store import Store
from gpuslurm.state.store_job import SeriesPoint

T0 = 1_700_000_000.0 - 1_700_000_000.0 % 3600
STEP = 10.0
N = 721  # samples: 2 h at 10 s
RESET_AT = 200  # sample 200 reads the counter restarted at 1 J
G0 = "GPU-00000000-aaaa"
COUNTER_W = 250.0  # what the counter rises by; the power readings say 300 W, so the two differ
POWER_W = 300.0


def counter(i: int) -> float:
    """The counter at sample i, mJ: 250 W from 5 MJ, restarting at 1 J at sample RESET_AT."""
    if i < RESET_AT:
        return 5e9 + COUNTER_W * STEP * 1000 * i
    return 1000.0 + COUNTER_W * STEP * 1000 * (i - RESET_AT)


def write(path: Path, rolled: bool = False, with_counter: bool = True,
          reading: Callable[[int], float] = counter) -> Path:
    alloc = (Allocation("7", "alice", 1001, (G0,), T0),)
    with Store.open(str(path)) as store:
        for i in range(N):
            ts = T0 + STEP * i
            g = GpuSample(ts, G0, util_pct=50.0, mem_used_mib=100.0, mem_total_mib=81559.0,
                          power_w=POWER_W, energy_mj=reading(i) if with_counter else None)
            store.write_cycle(Cycle(ts, "n1", (g,), (), alloc))
        if rolled:
            store.rollup(T0 + 7200, raw_window_s=1800)
    return path


def figures(db: Path):  # type: ignore[no-untyped-def]
    return job_stats(parse_config(""), "7", now=T0 + 10_000, db=str(db), caller_uid=0).gpus[0]


def test_the_counter_gives_the_energy_and_power_stands_in_across_its_reset(tmp_path: Path) -> None:
    g = figures(write(tmp_path / "m.db"))
    # 720 intervals: 719 counted by the counter's rise (250 W x 10 s), the one across the reset by
    # the power readings' trapezoid (300 W x 10 s)
    assert g.energy_j == pytest.approx(719 * COUNTER_W * STEP + POWER_W * STEP)
    assert g.energy_source == "counter+power" and g.counter_resets == 1
    assert g.energy_covered_s == pytest.approx(7200)


def test_without_a_counter_the_energy_is_the_power_integral(tmp_path: Path) -> None:
    g = figures(write(tmp_path / "m.db", with_counter=False))
    assert g.energy_j == pytest.approx(720 * POWER_W * STEP)
    assert g.energy_source == "power" and g.counter_resets == 0


def test_the_minute_rollup_keeps_the_counter_s_energy(tmp_path: Path) -> None:
    # rolled: the first 90 minutes are minute rows. Each keeps its samples' rises and its first and
    # last counter; between minute rows the counter's step counts too. The interval across the
    # reset lies inside a minute (sample 200 is at 33 min 20 s): the power readings stand in there
    # as between raw samples, so the minute rows keep the raw samples' energy to the joule.
    g = figures(write(tmp_path / "m.db", rolled=True))
    assert g.energy_j == pytest.approx(719 * COUNTER_W * STEP + POWER_W * STEP)
    assert g.energy_source == "counter"
    raw = figures(write(tmp_path / "raw.db"))
    assert raw.energy_j == pytest.approx(g.energy_j)


JUMP_AT = 301  # inside minute 50 (sample 300 opens it), so the rolled store meets it inside a row


def jumped(i: int) -> float:
    """A broken or forged capture's counter: from sample JUMP_AT on, 1e18 mJ above the true one
    (10^15 J in 10 s: 10^14 W); then rising at 250 W again."""
    return counter(i) + (1e18 if i >= JUMP_AT else 0.0)


@pytest.mark.parametrize("rolled", [False, True])
def test_a_counter_that_jumps_beyond_any_gpu_counts_the_power_for_that_interval(
        tmp_path: Path, rolled: bool) -> None:
    g = figures(write(tmp_path / "m.db", rolled=rolled, reading=jumped))
    # by hand: 720 intervals; the reset's (199 -> 200) and the jump's (300 -> 301) count the power
    # readings' trapezoid, 300 W x 10 s each; the other 718 the counter's 250 W x 10 s. Before the
    # bound the jump alone counted 10^15 J.
    assert g.energy_j == pytest.approx(718 * COUNTER_W * STEP + 2 * POWER_W * STEP)
    assert g.energy_j < MAX_GPU_POWER_W * 7200
    if not rolled:
        assert g.energy_source == "counter+power" and g.counter_resets == 2


@pytest.mark.parametrize("bad", [math.nan, -5e9, math.inf, 2.0**70])
def test_a_counter_reading_that_is_no_counter_s_is_not_stored(tmp_path: Path, bad: float) -> None:
    # a NaN, negative, infinite or beyond-64-bit reading from a broken capture: stored as none, so the
    # store stays readable (a negative one made every later read of the job a damaged-row error) and
    # the power stands in on both sides of it
    g = figures(write(tmp_path / "m.db", reading=lambda i: bad if i == JUMP_AT else counter(i)))
    assert g.energy_j == pytest.approx(717 * COUNTER_W * STEP + 3 * POWER_W * STEP)


_counters = st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.none(),
                      st.floats(min_value=0, max_value=2.0**64))
_powers = st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.none(),
                    st.floats(min_value=0, max_value=1e6))


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.floats(min_value=0.001, max_value=300), _counters, _powers),
                min_size=1, max_size=40))
def test_raw_energy_is_never_negative_nor_above_any_gpu_s_power_over_the_time(
        steps: list[tuple[float, float | None, float | None]]) -> None:
    pts, ts = [], T0
    for dt, mj, w in steps:
        ts += dt
        pts.append(SeriesPoint(ts, 0.0, 1, 50.0, 50.0, 1.0, 2.0, w, mj, mj, None if mj is None else 0.0))
    parts, resets = energy_parts(pts, max_gap=1e9)
    assert resets >= 0
    for part in parts:
        assert 0 <= part.joules <= MAX_GPU_POWER_W * part.span_s * (1 + 1e-9)
    total = sum(part.joules for part in parts)
    assert 0 <= total <= MAX_GPU_POWER_W * (pts[-1].ts - pts[0].ts) * (1 + 1e-9)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.sampled_from([1.0, 10.0, 30.0, 59.0]),
                          st.floats(min_value=0, max_value=2.0**64),
                          st.floats(min_value=0, max_value=1e7)), min_size=2, max_size=60),
       st.booleans())
def test_stored_energy_is_bounded_through_the_minute_rollup(
        steps: list[tuple[float, float, float]], rolled: bool) -> None:
    # any counter and power readings, raw or folded into minute rows: never negative, never more than
    # any GPU draws over the time (twice it at most: a step out of a minute row is bounded by the
    # longest its two readings can lie apart, which overlaps the row's own minute)
    with tempfile.TemporaryDirectory() as tmp:
        path = str(Path(tmp) / "m.db")
        alloc = (Allocation("7", "alice", 1001, (G0,), T0),)
        ts = T0
        with Store.open(path) as store:
            for dt, mj, w in steps:
                ts += dt
                store.write_cycle(Cycle(ts, "n1", (GpuSample(ts, G0, util_pct=50.0, power_w=w,
                                                              energy_mj=mj),), (), alloc))
            if rolled:
                store.rollup(ts + 1, raw_window_s=0)
        g = figures(Path(path))
    span = ts - (T0 + steps[0][0])
    assert g.energy_j is None or 0 <= g.energy_j <= 2 * MAX_GPU_POWER_W * (span + 60) * (1 + 1e-9)


def _v1_schema() -> str:
    """Schema 1: today's without the columns version 2 added."""
    text = store_file.SCHEMA.replace(", energy_mj REAL", "")
    return text.replace("\n  energy_first_mj REAL, energy_last_mj REAL, energy_inside_mj REAL,", "")


def test_a_schema_1_store_is_upgraded_without_losing_a_row(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    conn = sqlite3.connect(path, isolation_level=None)
    conn.executescript(_v1_schema())
    conn.execute("INSERT INTO schema_version VALUES (1, 0)")
    conn.execute("INSERT INTO device (id, uuid, gpu_uuid) VALUES (1, ?, ?)", (G0, G0))
    conn.execute("INSERT INTO allocation VALUES ('7', 'alice', 1001, NULL, ?, ?, 'map')", (T0, T0 + 20))
    conn.execute("INSERT INTO allocation_device VALUES ('7', 1)")
    conn.executemany("INSERT INTO gpu_sample VALUES (1, ?, 50, 100, 81559, 300, 40)",
                     [(T0,), (T0 + 10,), (T0 + 20,)])
    conn.close()
    assert "energy_mj" not in _columns(path, "gpu_sample")
    # read-only, as a user's jobstats opens it: schema 1 is read as it is (power only)
    assert figures(path).energy_j == pytest.approx(300 * 20)
    with Store.open(str(path)) as store:  # the monitor opens it for writing: upgraded
        assert store.schema_version() == 2
        store.write_cycle(Cycle(T0 + 30, "n1", (GpuSample(T0 + 30, G0, util_pct=50.0, power_w=300.0,
                                                          energy_mj=1e6),), (),
                                (Allocation("7", "alice", 1001, (G0,), T0),)))
    assert {"energy_mj"} <= _columns(path, "gpu_sample")
    assert {"energy_first_mj", "energy_last_mj", "energy_inside_mj"} <= _columns(path, "gpu_minute")
    with sqlite3.connect(path) as conn:
        rows = conn.execute("SELECT ts, power_w, energy_mj FROM gpu_sample ORDER BY ts").fetchall()
    assert rows == [(T0, 300.0, None), (T0 + 10, 300.0, None), (T0 + 20, 300.0, None), (T0 + 30, 300.0, 1e6)]
    assert figures(path).energy_j == pytest.approx(300 * 30)


def _columns(path: Path, table: str) -> set[str]:
    return {r[1] for r in sqlite3.connect(path).execute(f"PRAGMA table_info({table})")}


@pytest.mark.parametrize("rolled", [False, True])
def test_the_fair_share_report_gives_the_job_s_user_the_power_it_drew(
        tmp_path: Path, rolled: bool, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUSLURM_CONFIG", str(tmp_path / "none.toml"))
    (tmp_path / "none.toml").write_text("")
    db = write(tmp_path / "m.db", rolled=rolled)
    # the report's energy is the power sampled times the interval: 720 samples in [T0, T0 + 2 h) at
    # 300 W for 10 s each (jobstats counts the counter's 250 W; the report cannot afford the steps)
    expected = 720 * POWER_W * STEP / 3.6e6
    window = ["--since", f"@{int(T0)}", "--until", f"@{int(T0 + 7200)}"]
    capsys.readouterr()
    assert main(["fairshare-report", "--db", str(db), *window, "--by", "user", "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["totals"]["energy_kwh"] == pytest.approx(expected, abs=1e-4)
    [alice] = doc["rows"]
    assert alice["key"] == "alice" and alice["energy_kwh"] == pytest.approx(expected, abs=1e-4)
    assert main(["fairshare-report", "--db", str(db), *window]) == 0
    table = capsys.readouterr().out
    head = next(line for line in table.splitlines() if "VIOLATIONS" in line)
    row = next(line for line in table.splitlines() if line.startswith("alice"))
    assert f"Energy {expected:.2f} kWh" in table
    assert head.split()[9] == "kWh" and row.split()[5] == f"{expected:.2f}"  # after IDLE GPU-h
