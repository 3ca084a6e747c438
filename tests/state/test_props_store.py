"""Hostile rows in a real monitor store (the schema intact): every value read back is checked.

A store written by ``Store.write_cycle`` (raw samples, minute rollups, a job, a process, a
current violation) gets one or two of its values replaced through plain SQLite by what SQLite
accepts and the monitor never writes: a blob, text that is not UTF-8, text in a number column,
infinities, numbers far out of range. Then ``hogs`` and ``fairshare-report`` run as real
processes: an exit code the README documents, never 70, one line on stderr when non-zero, no
traceback. In-process, the readers behind them (and behind ``pick``, the epilog and the
monitor's restart) raise nothing but :class:`StoreError`.

Budget: 25 CLI examples (two commands each, about 40 s) and 100 in-process ones (about 10 s).
"""

from __future__ import annotations

import os
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tests.helpers.props_hostile import one_line

from gpuslurm.report.query import load_sqlite
from gpuslurm.samples import Allocation, Cycle, GpuSample, ProcSample, Violation
from gpuslurm.state.store import Store, StoreError

DOCUMENTED = {0, 1, 2, 3, 4}
NOW = time.time()
G0, G1 = "GPU-00000000-aaaa", "GPU-11111111-bbbb"

# every column the readers take a value from (not the keys SQLite itself enforces)
COLUMNS = {
    "violation": ("kind", "node", "user", "job_id", "pid", "process", "gpu_uuid", "start",
                  "duration_s", "end_ts", "evidence", "severity"),
    "gpu_sample": ("device", "ts", "util_pct", "mem_used_mib", "mem_total_mib", "power_w", "temp_c"),
    "gpu_minute": ("device", "minute", "n", "util_n", "util_sum", "util_max", "mem_max"),
    "process": ("device", "pid", "started", "uid", "user", "job_id", "name", "first_seen", "last_seen"),
    "proc_sample": ("ts", "process", "mem_mib", "sm_util_pct"),
    "proc_minute": ("process", "minute", "n", "util_n", "util_sum"),
    "allocation": ("job_id", "user", "uid", "account", "start", "last_seen", "source"),
    "allocation_device": ("device",),
    "device": ("id", "uuid", "gpu_uuid"),
    "meta": ("value",),
}
# what the monitor never writes: (SQL expression, parameters)
HOSTILE = st.one_of(
    st.sampled_from([("CAST(x'ff41fe' AS TEXT)", ()), ("x'00ff'", ()), ("'9e999'", ()),
                     ("?", (float("inf"),)), ("?", (float("-inf"),)), ("?", (1e300,)), ("?", (-1e300,)),
                     ("?", (-5,)), ("?", (2**63 - 1,)), ("?", (-(2**63),)), ("?", ("",)), ("?", ("abc",)),
                     ("?", (2.5,)), ("?", (0,)), ("NULL", ())]),
    st.text(max_size=8).map(lambda t: ("?", (t,))),
    st.floats(allow_nan=False).map(lambda f: ("?", (f,))),
    st.integers(-(2**63), 2**63 - 1).map(lambda i: ("?", (i,))),
    st.binary(max_size=6).map(lambda b: ("?", (b,))),
)
edit = st.tuples(st.sampled_from(sorted(COLUMNS)).flatmap(
    lambda t: st.tuples(st.just(t), st.sampled_from(COLUMNS[t]))), HOSTILE)


def _write_base(path: Path) -> None:
    with Store.open(str(path)) as store:
        for i in range(90):  # 15 minutes of 10 s cycles, the older ones rolled up into minutes
            ts = NOW - 900 + 10 * i
            store.write_cycle(
                Cycle(ts, "n1", (GpuSample(ts, G0, None, 60.0, 100.0, 1000.0, 200.0, 50.0),
                                 GpuSample(ts, G1, None, 5.0, 10.0, 1000.0, 80.0, 40.0)),
                      (ProcSample(ts, G0, 42, None, "python", 1000, "alice", "7", 90.0, 60.0, NOW - 2000),
                       ProcSample(ts, G1, 43, None, "miner", 1001, "bob", None, 5.0, 5.0, NOW - 2000)),
                      (Allocation("7", "alice", 1000, (G0,), NOW - 1000, "acct"),)),
                [Violation("rogue", "n1", "bob", None, 43, "miner", G1, NOW - 900, 10.0 * i + 1, "ev")])
        store.rollup(NOW, raw_window_s=300)


@pytest.fixture(scope="module")
def workdir() -> Iterator[Path]:
    with tempfile.TemporaryDirectory() as d:
        root = Path(d)
        _write_base(root / "base.db")
        (root / "gpuslurm.toml").write_text("")
        yield root


def _hostile_copy(workdir: Path, edits: list[tuple[tuple[str, str], tuple[str, tuple[object, ...]]]]) -> Path:
    path = Path(tempfile.mkdtemp(dir=workdir)) / "monitor.db"
    shutil.copy(workdir / "base.db", path)
    conn = sqlite3.connect(path)
    now = time.time()  # the violation stays current for hogs however long the session has run
    conn.execute("UPDATE violation SET start = ?, duration_s = 60, end_ts = ?", (now - 61, now - 1))
    conn.commit()
    for (table, column), (expr, params) in edits:
        try:  # the schema's own constraints (NOT NULL, keys) may refuse a value: that edit is moot
            conn.execute(f"UPDATE {table} SET {column} = {expr}", params)
            conn.commit()
        except sqlite3.Error:
            conn.rollback()
    conn.close()
    return path


def _run(workdir: Path, *args: str) -> None:
    proc = subprocess.run([sys.executable, "-m", "gpuslurm", *args], capture_output=True, text=True,
                          errors="replace", timeout=60, check=False,
                          env={**os.environ, "GPUSLURM_CONFIG": str(workdir / "gpuslurm.toml")})
    assert proc.returncode in DOCUMENTED, (proc.returncode, proc.stderr)
    assert "Traceback" not in proc.stderr and "internal error" not in proc.stderr, proc.stderr
    if proc.returncode:
        assert one_line(proc.stderr), proc.stderr


@settings(max_examples=25, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(st.lists(edit, min_size=1, max_size=2))
def test_hogs_and_report_on_hostile_rows(workdir: Path, edits: list) -> None:  # type: ignore[type-arg]
    path = _hostile_copy(workdir, edits)
    _run(workdir, "hogs", "--db", str(path))
    _run(workdir, "fairshare-report", "--db", str(path), "--last", "1h", "--format", "json")


@settings(max_examples=100, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(st.lists(edit, min_size=1, max_size=2))
def test_every_reader_raises_only_store_error(workdir: Path, edits: list) -> None:  # type: ignore[type-arg]
    from gpuslurm.report.compute import Policy, compute

    path = _hostile_copy(workdir, edits)
    with Store.open(str(path), readonly=True) as store:
        for read in (lambda: store.violations(NOW - 3600, NOW), lambda: store.recent_cycles(3600),
                     lambda: store.gpu_stats([G0, G1], NOW - 3600, NOW)):
            try:
                read()
            except StoreError as exc:
                assert one_line(str(exc)), exc
    try:
        data = load_sqlite(str(path), NOW - 3600, NOW, 60.0)
    except StoreError as exc:
        assert one_line(str(exc)), exc
        return
    except Exception as exc:  # the window may hold no sample at all once a time is damaged
        assert "no GPU samples" in str(exc) or "holds no GPU samples" in str(exc), repr(exc)
        return
    for by in ("user", "process"):
        compute(data, by, Policy(lambda _u, _a: 1.0, {}))


def test_a_blob_user_in_a_violation_is_one_line_exit_2(workdir: Path) -> None:
    """One of the exit-70 rows before: a blob where a user name belongs (sorting str with bytes)."""
    path = _hostile_copy(workdir, [(("violation", "user"), ("x'ff'", ()))])
    proc = subprocess.run([sys.executable, "-m", "gpuslurm", "hogs", "--db", str(path)], capture_output=True,
                          text=True, timeout=60, check=False,
                          env={**os.environ, "GPUSLURM_CONFIG": str(workdir / "gpuslurm.toml")})
    assert proc.returncode == 2 and "violation.user holds bytes" in proc.stderr, proc.stderr
