"""The fair-share report's energy (kWh per user and account) from a real store, raw and rolled up:
hand arithmetic, and a broken or forged store (readings no GPU draws: 1e18 W, negative, infinite,
NaN, text) that must neither inflate a user's kWh nor stop the report. The bound is jobstats':
samples.MAX_GPU_POWER_W, through samples.plausible_power_sql."""

from __future__ import annotations

import math
import sqlite3
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpuslurm.report.compute import Policy, compute
from gpuslurm.report.query import bucket_energy_j, load_sqlite
from gpuslurm.samples import (
    MAX_GPU_POWER_W,
    Allocation,
    Cycle,
    GpuSample,
    plausible_power_sql,
    plausible_power_w,
)
from gpuslurm.state.store import Store

T0 = 1_699_999_200.0
END = T0 + 7200
G0 = "GPU-00000000-aaaa"
POLICY = Policy(lambda user, account: 1.0, {}, busy_pct=80.0, idle_pct=5.0)
J_PER_KWH = 3.6e6


def write(path: Path, powers: list[float | None], gaps: list[float] | None = None) -> list[float]:
    """One GPU held by alice's job 1, a sample each gap (a minute) with the given power; the times."""
    alloc = (Allocation("1", "alice", 1001, (G0,), T0, "phys"),)
    ts, times = T0, []
    with Store.open(str(path)) as store:
        for i, watts in enumerate(powers):
            store.write_cycle(Cycle(ts, "n1", (GpuSample(ts, G0, util_pct=50.0, power_w=watts),), (), alloc))
            times.append(ts)
            ts += gaps[i] if gaps else 60.0
    return times


def forge(path: Path, values: dict[float, object]) -> None:
    """Root's store, broken or forged: the power column of the samples at these times."""
    conn = sqlite3.connect(path)
    with conn:
        for ts, value in values.items():
            conn.execute("UPDATE gpu_sample SET power_w = ? WHERE ts = ?", (value, ts))
    conn.close()


HOSTILE: list[object] = [1e18, -50.0, math.inf, -math.inf, math.nan, "abc", b"\x00", MAX_GPU_POWER_W + 1]


@pytest.mark.parametrize("rolled", [False, True])
def test_readings_no_gpu_draws_count_nothing_and_the_rest_count_as_before(tmp_path: Path,
                                                                         rolled: bool) -> None:
    db = tmp_path / "monitor.db"
    times = write(db, [300.0] * 121)
    forge(db, {times[10 + i]: v for i, v in enumerate(HOSTILE)})  # in the first hour
    if rolled:
        with Store.open(str(db)) as store:
            store.rollup(END, raw_window_s=3600)  # the first hour, forged readings too, in minute rows
    for step in (60.0, 3600.0):
        report = compute(load_sqlite(str(db), T0, END, step), "user", POLICY)
        # 120 minutes in [T0, END), 8 of them forged: 112 x 300 W x 60 s, by hand
        expected = 112 * 300.0 * 60 / J_PER_KWH
        assert report.totals.energy_kwh == pytest.approx(expected)
        assert [(r.key, pytest.approx(r.energy_kwh)) for r in report.rows] == [("alice", expected)]


def test_a_minute_row_summed_from_absurd_readings_counts_nothing(tmp_path: Path) -> None:
    db = tmp_path / "monitor.db"
    write(db, [300.0] * 121)
    with Store.open(str(db)) as store:
        store.rollup(END, raw_window_s=3600)
    conn = sqlite3.connect(db)
    with conn:  # a minute row whose sum no one reading makes, one with a negative sum, one of text
        rows = ((T0, 1e18, 1), (T0 + 60, -5.0, 1), (T0 + 120, 600.0, "x"), (T0 + 180, 600.0, 2))
        for minute, total, n in rows:
            conn.execute("UPDATE gpu_minute SET power_sum = ?, power_n = ? WHERE minute = ?",
                         (total, n, minute))
    conn.close()
    report = compute(load_sqlite(str(db), T0, END, 3600.0), "user", POLICY)
    # 120 minute rows less the three dropped: 116 single readings of 300 W and one row of two
    # readings summing 600 W, 60 s each
    assert report.totals.energy_kwh == pytest.approx((116 * 300.0 + 600.0) * 60 / J_PER_KWH)


POWER = st.one_of(st.none(), st.floats(), st.floats(0, MAX_GPU_POWER_W),
                  st.sampled_from([1e18, -1.0, 5000.0]))


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.tuples(POWER, st.floats(0.5, 900.0)), min_size=3, max_size=40), st.booleans(),
       st.sampled_from([60.0, 600.0, 3600.0]))
def test_a_bucket_s_energy_is_never_negative_nor_above_what_a_gpu_draws_in_it(
        tmp_path_factory: pytest.TempPathFactory, readings: list[tuple[float | None, float]], rolled: bool,
        step: float) -> None:
    db = tmp_path_factory.mktemp("energy") / "monitor.db"
    times = write(db, [p for p, _ in readings], [g for _, g in readings])
    if rolled:
        with Store.open(str(db)) as store:
            store.rollup(times[len(times) // 2], raw_window_s=0)
    since, until = T0, times[-1] + 1
    data = load_sqlite(str(db), since, until, step)
    for gpu in data.gpus:
        for b, joules in enumerate(gpu.energy_j):
            lo = max(data.start + b * step, data.since)
            hi = min(data.start + (b + 1) * step, data.until)
            if joules is not None:
                assert 0.0 <= joules <= MAX_GPU_POWER_W * (hi - lo) * (1 + 1e-9)
        total = sum(j for j in gpu.energy_j if j is not None)
        assert 0.0 <= total <= MAX_GPU_POWER_W * (data.until - data.since) * (1 + 1e-9)


@given(st.floats(allow_nan=True), st.floats(allow_nan=True), st.floats(allow_nan=True),
       st.floats(allow_nan=True))
def test_bucket_energy_is_bounded_for_any_numbers(readings: float, watts: float, interval: float,
                                                  span: float) -> None:
    got = bucket_energy_j(readings, watts, interval, span)
    assert got >= 0.0 and (got == 0.0 or got <= MAX_GPU_POWER_W * span)


@given(st.one_of(st.none(), st.floats(), st.integers(-2**63, 2**63 - 1), st.text(max_size=8),
                 st.binary(max_size=8)))
def test_the_sql_bound_is_plausible_power_w(value: object) -> None:
    conn = sqlite3.connect(":memory:")
    conn.execute("CREATE TABLE gpu_sample (power_w REAL)")  # the store's column type
    conn.execute("INSERT INTO gpu_sample VALUES (?)", (value,))
    query = f"SELECT power_w, {plausible_power_sql('power_w')} FROM gpu_sample"
    stored, got = conn.execute(query).fetchone()
    conn.close()
    if isinstance(stored, int | float):
        assert got == plausible_power_w(float(stored))
    else:  # NULL (NaN is stored as NULL), text, a blob: no reading
        assert got is None
