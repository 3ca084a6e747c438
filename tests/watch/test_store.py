"""The monitor's SQLite store: round trips, exact rollups, damaged files, crash safety, indexes."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from gpuslurm.samples import Allocation, Cycle, GpuSample, ProcSample, ScanProblem, Violation
from gpuslurm.state.store import Store, StoreError
from gpuslurm.state.store_file import SCHEMA_VERSION

G0, G1 = "GPU-00000000-0000-0000-0000-000000000000", "GPU-11111111-1111-1111-1111-111111111111"
MIG = "MIG-22222222-2222-2222-2222-222222222222"
T0 = 1_699_999_980.0  # a whole minute


def util(i: int, gpu: int) -> float | None:
    if gpu == 1 and i % 7 == 0:
        return None  # unknown: must not count as 0 %
    return float((i * 13 + gpu * 5) % 101)


def cycle(i: int, procs: bool = True) -> Cycle:
    ts = T0 + i
    gpus = tuple(GpuSample(ts, g, util_pct=util(i, n), mem_used_mib=1000.0 + (i % 50) * n,
                           mem_total_mib=81559.0, power_w=300.0 + n, temp_c=40.0)
                 for n, g in enumerate((G0, G1)))
    ps = (ProcSample(ts, G0, 4242, name="python", uid=1000, user="alice", job_id="77",
                     mem_mib=900.0 + i % 3, sm_util_pct=float(i % 10), started=T0 - 5),) if procs else ()
    return Cycle(ts, "node07", gpus, ps, (Allocation("77", "alice", 1000, (G0, G1), T0 - 10),),
                 (ScanProblem(ts, "pid-gone", "4243", "exited"),) if i == 3 else ())


def expected(lo: int, hi: int, gpu: int) -> tuple[int, float, float, float]:
    vals = [util(i, gpu) for i in range(lo, hi + 1)]
    known = [v for v in vals if v is not None]
    mem = max(1000.0 + (i % 50) * gpu for i in range(lo, hi + 1))
    return len(vals), sum(known) / len(known), max(known), mem


@pytest.fixture
def db(tmp_path: Path) -> Path:
    return tmp_path / "state" / "monitor.db"


def filled(db: Path, n: int = 600) -> Store:
    db.parent.mkdir(exist_ok=True)
    store = Store.open(str(db))
    for i in range(n):
        store.write_cycle(cycle(i))
    return store


def check_stats(store: Store, lo: int, hi: int) -> None:
    stats = store.gpu_stats([G0, G1, MIG], T0 + lo, T0 + hi)
    assert set(stats) == {G0, G1}  # no samples for the MIG device: left out
    for n, g in enumerate((G0, G1)):
        count, mean, top, mem = expected(lo, hi, n)
        s = stats[g]
        assert s.samples == count
        assert s.util_mean_pct == pytest.approx(mean, rel=1e-12)
        assert (s.util_max_pct, s.mem_peak_mib) == (top, mem)


def test_stats_are_exact_before_and_after_rollup(db: Path) -> None:
    store = filled(db)
    check_stats(store, 0, 599)
    check_stats(store, 120, 299)  # whole minutes
    store.rollup(now=T0 + 600, raw_window_s=200)  # rows before T0+360 become minute rows
    assert store._conn.execute("SELECT min(ts) FROM gpu_sample").fetchone()[0] == T0 + 360
    assert store._conn.execute("SELECT count(*) FROM gpu_minute").fetchone()[0] == 2 * 6
    check_stats(store, 0, 599)  # raw + rollup: the same exact means
    check_stats(store, 120, 299)
    store.rollup(now=T0 + 10_000, raw_window_s=0)
    assert store._conn.execute("SELECT count(*) FROM gpu_sample").fetchone()[0] == 0
    check_stats(store, 0, 599)
    store.close()


def test_late_samples_merge_into_existing_minutes(db: Path) -> None:
    store = filled(db, 120)
    store.rollup(now=T0 + 1000, raw_window_s=0)
    late = GpuSample(T0 + 30.5, G0, util_pct=100.0, mem_used_mib=99_999.0)
    store.write_cycle(Cycle(T0 + 30.5, "node07", (late,), (), ()))
    store.rollup(now=T0 + 1000, raw_window_s=0)
    [(n, util_n, util_sum, util_max, mem_max)] = store._conn.execute(
        "SELECT n, util_n, util_sum, util_max, mem_max FROM gpu_minute WHERE minute = ? AND device = "
        "(SELECT id FROM device WHERE uuid = ?)", (T0, G0)).fetchall()
    vals = [util(i, 0) for i in range(60)]
    assert (n, util_n, util_max, mem_max) == (61, 61, 100.0, 99_999.0)
    assert util_sum == pytest.approx(sum(v for v in vals if v is not None) + 100.0)


def test_processes_are_interned_and_rolled_up(db: Path) -> None:
    store = filled(db, 180)
    rows = store._conn.execute("SELECT pid, user, job_id, first_seen, last_seen FROM process").fetchall()
    assert rows == [(4242, "alice", "77", T0, T0 + 179)]
    store.rollup(now=T0 + 180, raw_window_s=60)
    mins = store._conn.execute("SELECT minute, n, util_n, util_sum, util_max, mem_max FROM proc_minute "
                               "ORDER BY minute").fetchall()
    assert [m[0] for m in mins] == [T0, T0 + 60]
    assert mins[0][1:] == (60, 60, float(sum(i % 10 for i in range(60))), 9.0, 902.0)
    alloc = store._conn.execute("SELECT job_id, start, last_seen FROM allocation").fetchall()
    assert alloc == [("77", T0 - 10, T0 + 179)]
    assert store._conn.execute("SELECT kind, subject FROM problem").fetchall() == [("pid-gone", "4243")]


def test_retention_forgets_old_minutes(db: Path) -> None:
    store = filled(db, 180)
    store.rollup(now=T0 + 180, raw_window_s=0, keep_s=60)
    assert store.gpu_stats([G0], T0, T0 + 179)[G0].samples == 60  # only the minute from T0+120
    assert store._conn.execute("SELECT count(*) FROM allocation").fetchone()[0] == 1  # seen at T0+179


def test_mig_devices_are_their_own_series(db: Path) -> None:
    db.parent.mkdir()
    with Store.open(str(db)) as store:
        store.write_cycle(Cycle(T0, "n", (GpuSample(T0, G0, MIG, util_pct=40.0, mem_used_mib=5.0),
                                          GpuSample(T0, G0, util_pct=90.0)), (), ()))
        stats = store.gpu_stats([MIG], T0, T0)
        assert list(stats) == [MIG] and stats[MIG].util_mean_pct == 40.0


def test_violations_update_while_they_last_and_filter(db: Path) -> None:
    db.parent.mkdir()
    v = Violation("rogue", "node07", "bob", None, 999, "python", G1, T0, 10.0, "pid 999 on GPU 1")
    with Store.open(str(db)) as store:
        store.write_cycle(cycle(0, procs=False), [v])
        store.write_cycle(cycle(1, procs=False), [v._replace(duration_s=70.0, evidence="longer")])
        store.write_cycle(cycle(2, procs=False), [v._replace(kind="idle", user="alice", job_id="77",
                                                             pid=None, start=T0 + 500)])
        assert store.violations(T0, T0 + 100) == [v._replace(duration_s=70.0, evidence="longer")]
        assert store.violations(T0 + 60, T0 + 61, kind="rogue")[0].user == "bob"  # still going then
        assert store.violations(T0 + 71, T0 + 499) == []
        assert [x.kind for x in store.violations(0, T0 + 1000)] == ["rogue", "idle"]
        assert [x.job_id for x in store.violations(0, T0 + 1000, user="alice")] == ["77"]


def test_readonly_store(db: Path) -> None:
    with pytest.raises(StoreError, match="no such file"):
        Store.open(str(db), readonly=True)
    assert not db.exists()  # a reader never creates one
    writer = filled(db, 5)
    with Store.open(str(db), readonly=True) as reader:  # while the writer holds it (WAL)
        assert reader.schema_version() == SCHEMA_VERSION
        assert reader.gpu_stats([G0], T0, T0 + 4)[G0].samples == 5
        with pytest.raises(StoreError, match="read-only"):
            reader.write_cycle(cycle(9))
        writer.write_cycle(cycle(5))
        assert reader.gpu_stats([G0], T0, T0 + 9)[G0].samples == 6
    writer.close()
    assert writer._conn is not None
    mode = sqlite3.connect(str(db)).execute("PRAGMA journal_mode").fetchone()[0]
    assert mode == "wal"


@pytest.mark.parametrize("content", [b"hello, not a database\n" * 100,
                                     b"SQLite format 3\x00" + b"\xff" * 4000])
def test_damaged_file_is_reported_and_moved_aside(db: Path, content: bytes) -> None:
    db.parent.mkdir()
    db.write_bytes(content)
    with pytest.raises(StoreError) as err:
        Store.open(str(db), readonly=True)
    assert str(err.value).startswith(f"{db}: ") and "\n" not in str(err.value)
    assert db.read_bytes() == content  # a reader never moves anything
    with Store.open(str(db)) as store:
        assert store.moved_aside is not None
        assert Path(store.moved_aside).read_bytes() == content  # kept, never deleted
        assert Path(store.moved_aside).name.startswith("monitor.db.corrupt-")
        store.write_cycle(cycle(0))
        assert store.gpu_stats([G0], T0, T0)[G0].samples == 1


def _plant_non_utf8_schema(db: Path) -> None:
    Store.open(str(db)).close()
    conn = sqlite3.connect(str(db), isolation_level=None)
    conn.execute("PRAGMA writable_schema = 1")
    conn.execute("INSERT INTO sqlite_master VALUES ('table', CAST(X'41ff42' AS TEXT), "
                 "CAST(X'41ff42' AS TEXT), 0, CAST(X'43ff' AS TEXT))")
    conn.close()


def test_schema_text_that_is_not_utf8_is_damage(db: Path) -> None:
    db.parent.mkdir()
    _plant_non_utf8_schema(db)
    with pytest.raises(StoreError, match="not UTF-8") as err:
        Store.open(str(db), readonly=True)
    assert "\n" not in str(err.value)
    with Store.open(str(db)) as store:  # the monitor's open: moved aside, a new store started
        assert store.moved_aside is not None and Path(store.moved_aside).exists()
        store.write_cycle(cycle(0))
    proc = subprocess.run([sys.executable, "-m", "gpuslurm", "hogs", "--db", store.moved_aside],
                          capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 2 and len(proc.stderr.splitlines()) == 1, proc.stderr
    assert "not UTF-8" in proc.stderr


def test_foreign_and_newer_databases(db: Path) -> None:
    db.parent.mkdir()
    conn = sqlite3.connect(str(db))
    conn.execute("CREATE TABLE something (x)")
    conn.commit()
    conn.close()
    with pytest.raises(StoreError, match="not a gpuslurm store"):
        Store.open(str(db), readonly=True)
    with Store.open(str(db)) as store:
        assert store.moved_aside is not None
    with sqlite3.connect(str(db)) as conn:
        conn.execute("INSERT INTO schema_version VALUES (?, 0)", (SCHEMA_VERSION + 1,))
    for readonly in (True, False):
        with pytest.raises(StoreError, match="newer gpuslurm"):
            Store.open(str(db), readonly=readonly)
    assert db.exists()  # not moved: a newer gpuslurm's data is not damage


def test_symlink_and_directory_refused(tmp_path: Path) -> None:
    (tmp_path / "real.db").write_bytes(b"")
    (tmp_path / "monitor.db").symlink_to(tmp_path / "real.db")
    with pytest.raises(StoreError, match="symlink"):
        Store.open(str(tmp_path / "monitor.db"))
    (tmp_path / "dir.db").mkdir()
    with pytest.raises(StoreError, match="not a regular file"):
        Store.open(str(tmp_path / "dir.db"))


def test_failed_cycle_is_rolled_back_whole(db: Path) -> None:
    store = filled(db, 3)
    bad = cycle(3)._replace(problems=(ScanProblem(T0 + 3, "x", None, ""),))  # type: ignore[arg-type]
    with pytest.raises(StoreError):
        store.write_cycle(bad)
    assert store.gpu_stats([G0], T0, T0 + 10)[G0].samples == 3  # nothing of cycle 3 stayed
    store.write_cycle(cycle(3))  # the id caches were reset with the rollback
    assert store.gpu_stats([G0], T0, T0 + 10)[G0].samples == 4


def test_kill_9_loses_at_most_the_current_cycle(db: Path) -> None:
    db.parent.mkdir()
    src = str(Path(__file__).resolve().parents[2] / "src")
    code = textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {src!r}); sys.path.insert(0, {str(Path(__file__).parent)!r})
        from test_store import cycle
        from gpuslurm.state.store import Store
        s = Store.open({str(db)!r})
        i = 0
        while True:
            s.write_cycle(cycle(i))
            print(i, flush=True)
            i += 1
    """)
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    last = -1
    deadline = time.monotonic() + 30
    while last < 200 and time.monotonic() < deadline:
        last = int(proc.stdout.readline())
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    # The writer runs ahead of this reader on a busy machine: the cycles it reported before the
    # kill are every line still in the pipe, not just those read so far.
    for line in proc.stdout:
        if line.strip():
            last = int(line)
    with Store.open(str(db), readonly=True) as store:
        stats = store.gpu_stats([G0, G1], 0, T0 + 1e6)
        n = stats[G0].samples
        assert stats[G1].samples == n  # never half a cycle
        assert last + 1 <= n <= last + 2  # every cycle it reported, at most one more
        procs = store._conn.execute("SELECT count(*) FROM proc_sample").fetchone()[0]
        assert procs == n


def test_report_queries_use_the_indexes_and_stay_fast(db: Path) -> None:
    db.parent.mkdir()
    store = Store.open(str(db))
    uuids = [f"GPU-{i:08d}-0000-0000-0000-000000000000" for i in range(8)]
    store.write_cycle(Cycle(T0, "n", tuple(GpuSample(T0, u, util_pct=1.0) for u in uuids), (), ()))
    days, now = 30, T0 + 30 * 86400
    # 30 days of minute rows for 8 GPUs, plus the last 2 hours raw at 1 Hz
    conn = store._conn
    conn.execute("BEGIN")
    conn.executemany("INSERT INTO gpu_minute (device, minute, n, util_n, util_sum, util_max, mem_max, "
                     "mem_total, power_n, power_sum, power_max, temp_max) "
                     "VALUES (?, ?, 60, 60, ?, 90.0, 1000.0, 80000.0, 0, 0, NULL, NULL)",
                     ((d + 1, int(T0) + m * 60, 60.0 * (m % 100)) for d in range(8)
                      for m in range(days * 1440 - 120)))
    conn.executemany("INSERT OR REPLACE INTO gpu_sample (device, ts, util_pct, mem_used_mib) "
                     "VALUES (?, ?, 50.0, 2000.0)",
                     ((d + 1, now - 7200 + s) for d in range(8) for s in range(7200)))
    conn.execute("COMMIT")
    plans = [r[3] for sql in ("SELECT * FROM gpu_sample WHERE device = 1 AND ts BETWEEN 0 AND 1",
                              "SELECT * FROM gpu_minute WHERE device = 1 AND minute BETWEEN 0 AND 1",
                              "SELECT * FROM violation WHERE end_ts >= 0 AND start <= 1",
                              "SELECT * FROM allocation WHERE last_seen >= 0 AND start <= 1")
             for r in conn.execute("EXPLAIN QUERY PLAN " + sql)]
    assert all(p.startswith("SEARCH") for p in plans), plans
    began = time.perf_counter()
    stats = store.gpu_stats(uuids, now - 86400, now)
    took = time.perf_counter() - began
    assert len(stats) == 8 and all(s.samples == 7200 + 60 * (1440 - 120) for s in stats.values())
    assert took < 0.5, f"--last 24h over 8 GPUs took {took:.3f} s"
    store.close()


def test_recent_cycles_are_bounded_and_resume_keeps_a_rogue_start(tmp_path: Path) -> None:
    """The bounded reader gives back what was written (newest first cut, oldest first order); a
    detector resumed from only the last 2 cycles keeps the stored finding's start."""
    from gpuslurm.config import DetectConfig
    from gpuslurm.policy.detect import Detector, resume

    g = "GPU-00000000-aaaa"
    job = Allocation("7", "alice", 1001, ("GPU-11111111-bbbb",), 50.0, "phys")
    cycles = [Cycle(100.0 + 10 * i, "n1", (GpuSample(100.0 + 10 * i, g, util_pct=30.0, mem_total_mib=8.0),),
                    (ProcSample(100.0 + 10 * i, g, 4242, name="miner", uid=1003, user="carol", mem_mib=5.0,
                                started=99.0),), (job,)) for i in range(6)]
    det = Detector(DetectConfig())
    with Store.open(str(tmp_path / "m.db")) as store:
        for c in cycles:
            store.write_cycle(c, det.feed(c))
        assert store.recent_cycles(1e9) == cycles
        assert store.recent_cycles(1e9, max_cycles=2) == cycles[-2:]
        assert store.recent_cycles(15.0) == cycles[-2:]
        stored = store.violations(cycles[-1].ts, cycles[-1].ts)
        assert [(v.kind, v.start) for v in stored] == [("rogue", 100.0)]
        later = Cycle(170.0, "n1", cycles[0].gpus, (cycles[0].procs[0]._replace(ts=170.0),), (job,))
        fresh = resume(Detector(DetectConfig()), store.recent_cycles(15.0), stored)
        assert [(v.kind, v.start, v.duration_s) for v in fresh.feed(later)] == [("rogue", 100.0, 70.0)]
        blind = resume(Detector(DetectConfig()), store.recent_cycles(15.0))  # without the stored finding
        assert [v.start for v in blind.feed(later)] == [140.0]


def test_gpu_stats_min_means_temperature_and_power(db: Path) -> None:
    """Issue 12 §4: min/mean utilisation and memory, mean/max temperature and power, from raw
    samples (minimum and means are None once a part of the period exists only as minute rows)."""
    with filled(db, 120) as store:
        s = store.gpu_stats([G1], T0 + 10, T0 + 69)[G1]
        utils = [v for i in range(10, 70) if (v := util(i, 1)) is not None]
        mems = [1000.0 + (i % 50) for i in range(10, 70)]
        assert s.util_min_pct == min(utils)
        assert (s.mem_min_mib, s.mem_mean_mib) == (min(mems), pytest.approx(sum(mems) / len(mems)))
        assert (s.temp_mean_c, s.temp_max_c) == (40.0, 40.0)
        assert (s.power_mean_w, s.power_max_w) == (301.0, 301.0)
        store.rollup(T0 + 3600, raw_window_s=60)  # everything older than T0+3540 becomes minute rows
        rolled = store.gpu_stats([G1], T0, T0 + 119)[G1]
        assert rolled.util_min_pct is None and rolled.temp_mean_c is None
        assert (rolled.temp_max_c, rolled.power_max_w) == (40.0, 301.0)
        assert rolled.power_mean_w == pytest.approx(301.0)


def test_gpu_stats_leave_power_no_gpu_draws_out_and_count_it(db: Path) -> None:
    """A forged or damaged power reading (1e18 W, infinite, negative, text in the column) once made
    the epilog's power_mean_w absurd, or, failing the store's checks, cost the job every figure.
    Each is left out of the power mean and maximum and counted; the other figures stay."""
    with filled(db, 120) as store:
        conn = sqlite3.connect(str(db))
        with conn:
            dev = conn.execute("SELECT id FROM device WHERE uuid = ?", (G1,)).fetchone()[0]
            for i, forged in ((20, 1e18), (21, float("inf")), (22, -5.0), (23, "300 W")):
                conn.execute("UPDATE gpu_sample SET power_w = ? WHERE device = ? AND ts = ?",
                             (forged, dev, T0 + i))
        conn.close()
        s = store.gpu_stats([G1], T0 + 10, T0 + 69)[G1]
        assert (s.power_mean_w, s.power_max_w, s.power_dropped) == (301.0, 301.0, 4)
        assert s.samples == 60 and s.temp_max_c == 40.0
        # rolled up: the minute whose sum holds them is left out whole (its 60 readings)
        store.rollup(T0 + 3600, raw_window_s=60)
        rolled = store.gpu_stats([G1], T0, T0 + 119)[G1]
        assert (rolled.power_mean_w, rolled.power_max_w, rolled.power_dropped) == (301.0, 301.0, 60)
        assert rolled.samples == 120
