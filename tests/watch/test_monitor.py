"""The monitor loop: real processes, a real store, signals, kill -9, a corrupt store, drift."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from tests.helpers.watch_helpers import sleeper, stop

from gpuslurm.errors import InputError
from gpuslurm.hw.replay.scenario import ScenarioSampler
from gpuslurm.hw.source import load_node
from gpuslurm.samples import Cycle, Violation
from gpuslurm.state.jobmap import JobMap, MappedDevice, write_map
from gpuslurm.state.store import Store
from gpuslurm.watch.attribute import Attributor
from gpuslurm.watch.monitor import Monitor, next_slot, run

NODE = load_node("dgx-h100")
U = [g.uuid for g in NODE.gpus]


class Site:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.scenario = root / "scenario.json"
        self.db = root / "state" / "monitor.db"
        self.violations = root / "violations"
        self.jobs = root / "run" / "jobs"
        self.config = root / "gpuslurm.toml"
        self.config.write_text(
            f'[paths]\nrun_dir = "{root / "run"}"\nstate_dir = "{root / "state"}"\n'
            f'violations_dir = "{self.violations}"\nsqueue = "{root / "no-squeue"}"\n')
        self.write({})

    def write(self, doc: object) -> None:
        tmp = self.scenario.with_suffix(".tmp")
        tmp.write_text(json.dumps(doc))
        tmp.replace(self.scenario)

    def env(self) -> dict[str, str]:
        return {**os.environ, "GPUSLURM_CONFIG": str(self.config), "GPUSLURM_SCENARIO": str(self.scenario),
                "GPUSLURM_CAPTURE": "dgx-h100"}

    def cmd(self, *args: str) -> list[str]:
        return [sys.executable, "-m", "gpuslurm", "monitor", "--db", str(self.db), *args]

    def rows(self, sql: str) -> list[Any]:
        conn = sqlite3.connect(f"file:{self.db}?mode=ro", uri=True)
        try:
            return conn.execute(sql).fetchall()
        finally:
            conn.close()


@pytest.fixture
def site(tmp_path: Path) -> Site:
    return Site(tmp_path)


@pytest.fixture
def sleepers() -> Iterator[list[subprocess.Popen[bytes]]]:
    procs = [sleeper() for _ in range(3)]
    yield procs
    for p in procs:
        stop(p)


def _monitor(site: Site, store: Any, **kw: Any) -> Monitor:
    sampler = ScenarioSampler(NODE, site.scenario)
    return Monitor(sampler, Attributor(jobs_dir=str(site.jobs)), store, "node07", **kw)


def test_a_cycle_attributes_real_processes_and_records_what_it_cannot_read(
        site: Site, sleepers: list[subprocess.Popen[bytes]]) -> None:
    a, b, c = sleepers
    write_map(JobMap("77", "root", 0, (MappedDevice(U[0], 0),), 50.0), str(site.jobs))
    stop(c)  # exits before the scan: NVML's report of it is stale
    site.write({"gpus": {U[0]: {"util": 95}, U[3]: {"lost": True}},
                "procs": [{"pid": a.pid, "gpu": U[0], "mem_mib": 4000, "sm": 90},
                          {"pid": b.pid, "gpu": U[1], "mem_mib": 10},
                          {"pid": c.pid, "gpu": U[2], "mem_mib": 10}]})
    (site.root / "state").mkdir()
    store = Store.open(str(site.db))
    try:
        cycle = _monitor(site, store).cycle()
    finally:
        store.close()
    assert len(cycle.gpus) == 7 and U[3] not in {g.gpu_uuid for g in cycle.gpus}
    assert [(p.pid, p.gpu_uuid, p.name) for p in cycle.procs] == \
        [(a.pid, U[0], "sleep"), (b.pid, U[1], "sleep")]
    assert [a.job_id for a in cycle.allocations] == ["77"]
    assert {(p.kind, p.subject) for p in cycle.problems} == {("gpu-lost", U[3]), ("pid-gone", str(c.pid))}
    assert sorted(site.rows("SELECT kind, subject FROM problem")) == sorted(
        [("gpu-lost", U[3]), ("pid-gone", str(c.pid))])
    assert site.rows("SELECT count(*) FROM gpu_sample") == [(7,)]
    assert site.rows("SELECT job_id FROM allocation") == [("77",)]


class FlakyStore:
    """A store that refuses the first ``failures`` writes, as a locked or full disk would."""

    def __init__(self, failures: int) -> None:
        self.failures = failures
        self.cycles: list[float] = []

    def write_cycle(self, cycle: Cycle, violations: Any = ()) -> None:
        if self.failures:
            self.failures -= 1
            raise InputError("database is locked", source="monitor.db")
        self.cycles.append(cycle.ts)

    def rollup(self, now: float, raw_window_s: float) -> None:
        pass


def test_cycles_the_store_refuses_are_written_later(site: Site) -> None:
    store = FlakyStore(2)
    warnings: list[str] = []
    times = iter([10.0, 20.0, 30.0, 40.0])
    m = _monitor(site, store, warn=warnings.append, clock=lambda: next(times))
    for _ in range(3):
        m.cycle()
    assert store.cycles == [10.0, 20.0, 30.0] and m.pending == []
    assert len(warnings) == 2 and "database is locked" in warnings[0]


class Rogue:
    """A detector that calls every process rogue, with a fixed start."""

    def feed(self, cycle: Cycle) -> list[Violation]:
        return [Violation("rogue", cycle.node, p.user, p.job_id, p.pid, p.name, p.gpu_uuid, 1.0,
                          cycle.ts - 1.0, "test") for p in cycle.procs]


def test_violations_are_shared_when_new_and_again_each_minute(
        site: Site, sleepers: list[subprocess.Popen[bytes]]) -> None:
    site.write({"start": 0, "procs": [{"pid": sleepers[0].pid, "gpu": U[0]}]})
    published: list[tuple[float, int]] = []
    clock = iter([100.0, 110.0, 165.0, 170.0])
    now = [0.0]

    def tick() -> float:
        now[0] = next(clock)
        return now[0]

    m = _monitor(site, FlakyStore(0), detector=Rogue(), clock=tick,
                 publish=lambda vs: published.append((now[0], len(vs))))
    for _ in range(4):
        m.cycle()
    assert published == [(100.0, 1), (165.0, 1)]


def test_next_slot_keeps_the_grid() -> None:
    assert next_slot(0.0, 10.0, 0.0) == 10.0
    assert next_slot(0.0, 10.0, 3.0) == 10.0
    assert next_slot(0.0, 10.0, 10.0) == 20.0  # strictly after
    assert next_slot(0.0, 10.0, 37.5) == 40.0  # an overrun skips the missed slots


def test_run_does_not_drift_and_stops_between_cycles() -> None:
    starts: list[float] = []
    stop_ev = threading.Event()

    class Slow:
        def cycle(self) -> None:
            starts.append(time.monotonic())
            time.sleep(0.03 if len(starts) % 2 else 0.01)  # uneven cycle lengths
            if len(starts) == 8:
                stop_ev.set()

    count = run(Slow(), 0.1, stop=stop_ev)  # type: ignore[arg-type]
    assert count == 8
    offsets = [(t - starts[0]) - 0.1 * i for i, t in enumerate(starts)]
    assert max(offsets) < 0.08  # each start on its slot (drifting by the cycle time would be ~0.16)


def _wait_lines(proc: subprocess.Popen[str], n: int, timeout: float = 30) -> list[str]:
    lines: list[str] = []
    deadline = time.monotonic() + timeout
    assert proc.stdout is not None
    while len(lines) < n:
        assert time.monotonic() < deadline, f"only {len(lines)} cycles"
        line = proc.stdout.readline()
        assert line, f"monitor exited: {proc.wait()} {proc.stderr.read() if proc.stderr else ''}"
        lines.append(line)
    return lines


def test_sigterm_finishes_the_cycle_and_exits_0(site: Site, sleepers: list[subprocess.Popen[bytes]]) -> None:
    site.write({"procs": [{"pid": sleepers[0].pid, "gpu": U[0]}]})
    proc = subprocess.Popen(site.cmd("--interval", "0.2", "--json"), env=site.env(), text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    _wait_lines(proc, 2)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=20)
    assert proc.returncode == 0, err
    assert all(json.loads(line)["node"] for line in out.splitlines())  # no torn last line
    assert site.rows("SELECT count(DISTINCT ts) FROM gpu_sample")[0][0] >= 2


_SIGTERM_WHILE_LOCKED = """
import os, signal, sys, threading
from gpuslurm.watch.monitor import stop_on_signals
stop = threading.Event()
restore = stop_on_signals(stop)
with stop._cond:  # where the main thread is inside Event.wait(), before it sleeps and after it wakes
    os.kill(os.getpid(), signal.SIGTERM)
    sum(range(100000))  # bytecodes: a Python handler would run here, and call stop.set()
print(stop.wait(10))
restore()
"""


def test_a_sigterm_while_the_main_thread_holds_the_stop_events_lock_stops_the_monitor() -> None:
    """The signal handler used to call ``stop.set()`` itself: coming while the main thread held
    the Event's lock, it waited for itself, and the monitor never exited (systemd's stop then
    ended it with SIGKILL). Here the stop is set by the relay thread, once the lock is free."""
    try:
        proc = subprocess.run([sys.executable, "-c", _SIGTERM_WHILE_LOCKED], capture_output=True,
                              text=True, timeout=30)
    except subprocess.TimeoutExpired:
        pytest.fail("the monitor's signal handler deadlocked on the stop event's lock")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["True"]


def test_stop_on_signals_off_the_main_thread_refuses_and_leaves_no_pipe_open() -> None:
    from gpuslurm.watch.monitor import stop_on_signals

    before = set(os.listdir("/proc/self/fd"))
    failed: list[BaseException] = []

    def attempt() -> None:
        try:
            stop_on_signals(threading.Event())
        except ValueError as exc:  # signal handlers are the main thread's only
            failed.append(exc)

    worker = threading.Thread(target=attempt)
    worker.start()
    worker.join()
    assert failed and set(os.listdir("/proc/self/fd")) == before


def test_kill_9_loses_at_most_the_cycle_under_way(site: Site,
                                                  sleepers: list[subprocess.Popen[bytes]]) -> None:
    site.write({"gpus": {U[0]: {"util": 50}},
                "procs": [{"pid": p.pid, "gpu": U[i], "mem_mib": 100} for i, p in enumerate(sleepers)]})
    proc = subprocess.Popen(site.cmd("--interval", "0.05", "--json"), env=site.env(), text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    printed = [json.loads(line)["ts"] for line in _wait_lines(proc, 15)]
    time.sleep(0.13)  # somewhere in a later cycle, perhaps mid-write
    proc.kill()
    proc.wait()
    assert proc.stdout is not None
    printed += [json.loads(line)["ts"] for line in proc.stdout.read().splitlines() if line.endswith("}")]
    stored = sorted(t for (t,) in site.rows("SELECT DISTINCT ts FROM gpu_sample"))
    assert set(printed) <= set(stored)  # every cycle reported as done is in the store
    assert len(stored) - len(printed) <= 1  # and at most one more made it in unreported
    for ts in stored:  # and each stored cycle is whole: all GPUs and all processes, one transaction
        assert site.rows(f"SELECT count(*) FROM gpu_sample WHERE ts = {ts!r}") == [(8,)]
        assert site.rows(f"SELECT count(*) FROM proc_sample WHERE ts = {ts!r}") == [(3,)]
    with Store.open(str(site.db), readonly=True) as st:
        assert st.check() is None


def test_a_corrupt_store_is_moved_aside_and_the_monitor_goes_on(site: Site) -> None:
    (site.root / "state").mkdir()
    site.db.write_bytes(b"this is not a database" * 100)
    out = subprocess.run(site.cmd("--once"), env=site.env(), capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    aside = [p for p in site.db.parent.iterdir() if ".corrupt-" in p.name]
    assert len(aside) == 1 and aside[0].read_bytes().startswith(b"this is not a database")
    assert f"{site.db} was not a usable store; moved it to {aside[0]}" in out.stderr
    assert site.rows("SELECT count(*) FROM gpu_sample") == [(8,)]


def test_once_prints_a_summary_and_publishes_a_rogue(site: Site,
                                                     sleepers: list[subprocess.Popen[bytes]]) -> None:
    """A process in no job on a GPU: the real detectors find a rogue; it reaches the shared directory."""
    site.write({"procs": [{"pid": sleepers[0].pid, "gpu": U[5], "mem_mib": 900}]})
    out = subprocess.run(site.cmd("--once"), env=site.env(), capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    host = os.uname().nodename.split(".")[0]
    assert out.stdout.startswith(f"{host}: 8 devices, 1 GPU processes (0 in jobs)")
    files = list(site.violations.iterdir())
    assert len(files) == 1
    records = [json.loads(line) for line in files[0].read_text().splitlines()]
    assert [(r["kind"], r["pid"], r["gpu_uuid"]) for r in records] == [("rogue", sleepers[0].pid, U[5])]


def test_the_systemd_unit_verifies_and_keeps_proc_and_nvml_reachable(tmp_path: Path) -> None:
    unit = Path(__file__).resolve().parents[2] / "packaging" / "gpuslurm-monitor.service"
    text = unit.read_text()
    for needed in ("ProtectProc=default", "ProcSubset=all", "PrivateDevices=no",
                   "ReadWritePaths=/var/lib/gpuslurm"):
        assert needed in text
    analyze = "/usr/bin/systemd-analyze"
    if not os.access(analyze, os.X_OK):
        pytest.skip("systemd-analyze is not installed")
    copy = tmp_path / "gpuslurm-monitor.service"
    copy.write_text(text.replace("ExecStart=/usr/local/bin/gpuslurm monitor", "ExecStart=/bin/true monitor"))
    out = subprocess.run([analyze, "verify", str(copy)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and "gpuslurm-monitor" not in out.stderr, out.stderr


def test_ten_restarts_keep_one_rogue_finding_with_its_first_start(
        site: Site, sleepers: list[subprocess.Popen[bytes]]) -> None:
    """The same rogue process across 10 real `gpuslurm monitor --once` runs (each a restart): the
    detector replays the store's recent cycles at start, so the store holds one finding, started
    at the first run's cycle, lasting to the last one's."""
    site.write({"procs": [{"pid": sleepers[0].pid, "gpu": U[5], "mem_mib": 900}]})
    for _ in range(10):
        out = subprocess.run(site.cmd("--once"), env=site.env(), capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        time.sleep(0.05)
    cycles = sorted(t for (t,) in site.rows("SELECT DISTINCT ts FROM gpu_sample"))
    assert len(cycles) == 10
    found = site.rows("SELECT kind, pid, gpu_uuid, start, end_ts FROM violation")
    assert found == [("rogue", sleepers[0].pid, U[5], cycles[0], cycles[-1])]
