"""Buckets the monitor sampled only in part, and allocations that start inside a bucket: exact
GPU-hours by hand, and the invariant used + idle ≤ allocated + outside-Slurm (also on the demo)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from tests.helpers.coverage_helpers import check_invariant, write_store

from gpuslurm.report.query import load_sqlite
from gpuslurm.samples import Allocation

T0 = 1_699_999_200.0  # a whole hour
G0, G1 = "GPU-00000000-aaaa", "GPU-11111111-bbbb"
END = T0 + 7200


def totals(path: Path, step: float) -> dict[str, tuple[float, float, float, float]]:
    report = check_invariant(load_sqlite(str(path), T0, END, step))
    return {r.key: (round(r.allocated_gpu_hours, 6), round(r.used_gpu_hours, 6), round(r.idle_gpu_hours, 6),
                    round(r.unmeasured_gpu_hours, 6)) for r in report.rows}


def test_monitor_started_mid_bucket(tmp_path: Path) -> None:
    """Alice's job holds G0 all window; the monitor (10 s cycles) starts at T0 + 30 min.

    Hour 1: half covered at 60 %: used 0.3, idle 0.5 − 0.3 = 0.2, unmeasured 0.5.
    Hour 2: covered at 20 %: used 0.2, idle 0.8. Before coverage weighting: used 0.8, idle 1.2.
    """
    times = [T0 + 1800 + 10 * k for k in range(541)]  # to END inclusive (END: last_seen only)
    path = write_store(tmp_path / "m.db", times, {G0: lambda ts: 60.0 if ts < T0 + 3600 else 20.0},
                       {G0: lambda ts: (100, "alice", "1")},
                       [(Allocation("1", "alice", 1001, (G0,), T0, "phys"), T0, END)])
    assert totals(path, 3600.0) == {"alice": (2.0, 0.5, 1.0, 0.5)}


def test_monitor_stopped_and_restarted_mid_bucket(tmp_path: Path) -> None:
    """As above, every cycle, but the monitor is down from T0 + 20 min to T0 + 1 h 10 min (a
    restart), at 50 % throughout: covered 1 h 10 min of 2 h; used 35/60, idle 35/60, rest unmeasured."""
    times = [T0 + 10 * k for k in range(721) if not T0 + 1200 <= T0 + 10 * k < T0 + 4200]
    path = write_store(tmp_path / "m.db", times, {G0: lambda ts: 50.0}, {G0: lambda ts: (100, "alice", "1")},
                       [(Allocation("1", "alice", 1001, (G0,), T0, "phys"), T0, END)])
    got = totals(path, 3600.0)["alice"]
    assert got == (2.0, round(35 / 60, 6), round(35 / 60, 6), round(50 / 60, 6))


def test_allocation_starting_mid_bucket(tmp_path: Path) -> None:
    """Bob's job gets G1 at T0 + 30 min; G1 is at 0 % before, 50 % with his process after, sampled
    throughout. Hour 1: allocated 0.5, busy 0.25 (all his), idle 0.25 — not 0.5 × (1 − 25 %).
    Hour 2: used 0.5, idle 0.5. Before: idle 0.875, and used + idle 1.625 > 1.5 allocated."""
    times = [T0 + 10 * k for k in range(721)]
    path = write_store(tmp_path / "m.db", times, {G1: lambda ts: 0.0 if ts < T0 + 1800 else 50.0},
                       {G1: lambda ts: (200, "bob", "2") if ts >= T0 + 1800 else None},
                       [(Allocation("2", "bob", 1002, (G1,), T0 + 1800, "chem"), T0 + 1800, END)])
    assert totals(path, 3600.0) == {"bob": (1.5, 0.75, 0.75, 0.0)}
    assert totals(path, 60.0) == {"bob": (1.5, 0.75, 0.75, 0.0)}  # bucket edges on the job's start


def test_rogue_process_is_outside_slurm_use(tmp_path: Path) -> None:
    """Carol's process in no job on G1 (40 %), half the window sampled: no allocation, used 0.4."""
    times = [T0 + 3600 + 10 * k for k in range(361)]
    path = write_store(tmp_path / "m.db", times, {G1: lambda ts: 40.0},
                       {G1: lambda ts: (300, "carol", None)}, [])
    assert totals(path, 600.0) == {"carol": (0.0, 0.4, 0.0, 0.0)}


def test_demo_store_at_30_days(tmp_path: Path) -> None:
    """The demo's store, at --last 30d: every user (alice was 56.29 + 5.62 > 61.15) and the total."""
    out = tmp_path / "demo"
    subprocess.run([sys.executable, "-m", "gpuslurm", "demo", "--out", str(out)], check=True,
                   capture_output=True, env={**os.environ, "NO_COLOR": "1"}, timeout=280)
    from gpuslurm.report.data import auto_step

    until = time.time()
    since = until - 30 * 86400
    report = check_invariant(load_sqlite(str(out / "monitor.db"), since, until, auto_step(since, until)))
    alice = next(r for r in report.rows if r.key == "alice")
    assert alice.used_gpu_hours + alice.idle_gpu_hours <= alice.allocated_gpu_hours + 1e-9
    assert len(report.rows) >= 4


def test_job_ending_mid_bucket_holds_its_last_cycle(tmp_path: Path) -> None:
    """Bob's job is seen by cycles T0 .. T0 + 1790 (10 s apart), its process at 100 % in each.

    Each cycle's sample stands for its 10 s, so the process was busy 1800 s: the job held the GPU
    as long (it was last seen at T0 + 1790, and holds it to the next cycle). Ending the job at its
    last cycle gave it 1790 s and its process 1800 s: used + idle over allocated by one interval
    (the demo's intermittent failure, found at 30 days when a bucket edge fell after a job's end).
    """
    times = [T0 + 10 * k for k in range(360)]  # the GPU sampled to T0 + 3590, the job to T0 + 1790
    last = T0 + 1790
    path = write_store(tmp_path / "m.db", times, {G0: lambda ts: 100.0 if ts <= last else 0.0},
                       {G0: lambda ts: (7, "bob", "2") if ts <= last else None},
                       [(Allocation("2", "bob", 1002, (G0,), T0, "phys"), T0, last)])
    report = check_invariant(load_sqlite(str(path), T0, T0 + 3600, 600.0))
    bob = next(r for r in report.rows if r.key == "bob")
    assert round(bob.allocated_gpu_hours * 3600) == 1800 and round(bob.used_gpu_hours * 3600) == 1800
