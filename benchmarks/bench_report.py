#!/usr/bin/env python3
"""Fair-share report speed on a month of 1 Hz samples for 8 GPUs. Targets: 24 h ≤ 1 s, 30 d ≤ 3 s.

Generates ``--days`` days ending now: 8 GPUs sampled every second (30 days: 20.7 M GPU samples),
jobs of 1–8 hours on each GPU (a gap between them), one process per job sampled every second
while it runs, and an allocation per job. Rows go straight into the store's tables with
``executemany`` — not through ``Store.write_cycle``, which interns devices and processes and
updates ``last_seen`` per cycle and would take hours for 2.6 M cycles — but the store is created
by ``Store.open`` and the minute rollups are made by ``Store.rollup`` itself, after each generated
day with the monitor's default raw window (24 h), exactly as the monitor leaves a store.
Then ``load_sqlite`` + ``compute`` + the table are timed for the last 24 h (raw samples) and the
last 30 days (minute rollups beyond the raw window), best of ``--repeat``.

    python benchmarks/bench_report.py [--days 30] [--db PATH] [--keep] [--repeat 3]
"""

from __future__ import annotations

import argparse
import io
import os
import random
import sqlite3
import tempfile
import time

from gpuslurm.config import ShareDetect
from gpuslurm.policy.share import Quotas
from gpuslurm.report.compute import Policy, compute
from gpuslurm.report.data import auto_step
from gpuslurm.report.query import load_sqlite
from gpuslurm.report.render import write_table
from gpuslurm.state.store import Store

GPUS = 8
USERS = ("alice", "bob", "carol", "dave", "erin")
RAW_WINDOW_S = 86400.0


def generate(path: str, days: int, end: float) -> tuple[int, int, float]:
    """Write the store; returns (GPU samples, process samples, seconds)."""
    rng = random.Random(42)
    start = end - days * 86400
    Store.open(path).close()  # the schema, exactly as the monitor creates it
    store = Store.open(path)
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA synchronous = OFF")
    conn.execute("INSERT OR REPLACE INTO meta VALUES ('node', 'bench-node')")
    uuids = [f"GPU-{i:08x}-0000-0000-0000-{i:012x}" for i in range(GPUS)]
    conn.executemany("INSERT INTO device (id, uuid, gpu_uuid) VALUES (?, ?, ?)",
                     [(i + 1, u, u) for i, u in enumerate(uuids)])
    # jobs per GPU: (start, end, user, util level); a job is 1-8 h with 0-2 h gaps
    plan: list[list[tuple[float, float, str, float, int]]] = [[] for _ in range(GPUS)]
    job = 0
    for g in range(GPUS):
        t = start + rng.uniform(0, 3600)
        while t < end:
            length = rng.uniform(3600, 8 * 3600)
            job += 1
            level = rng.choice((0.0, 35.0, 70.0, 95.0))  # some idle allocations, some hogs
            plan[g].append((t, min(t + length, end), rng.choice(USERS), level, job))
            t += length + rng.uniform(0, 7200)
    proc_id = 0
    jobs_rows, alloc_dev, procs = [], [], []
    proc_of: list[list[tuple[float, float, int, float]]] = [[] for _ in range(GPUS)]
    for g in range(GPUS):
        for j0, j1, user, level, jid in plan[g]:
            jobs_rows.append((str(jid), user, 1000 + USERS.index(user), "acct-" + user[0], j0, j1, "map"))
            alloc_dev.append((str(jid), g + 1))
            if level > 0:
                proc_id += 1
                procs.append((proc_id, g + 1, 10_000 + proc_id, j0, 1000 + USERS.index(user), user, str(jid),
                              "python", j0, j1))
                proc_of[g].append((j0, j1, proc_id, level))
    conn.execute("BEGIN")
    conn.executemany("INSERT INTO allocation VALUES (?, ?, ?, ?, ?, ?, ?)", jobs_rows)
    conn.executemany("INSERT INTO allocation_device VALUES (?, ?)", alloc_dev)
    conn.executemany("INSERT INTO process VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", procs)
    conn.execute("COMMIT")

    n_gpu = n_proc = 0
    t_begin = time.perf_counter()
    day0 = start
    while day0 < end:
        day1 = min(day0 + 86400, end)
        gpu_rows, proc_rows = [], []
        for g in range(GPUS):
            running = [(a, b, pid, lvl) for a, b, pid, lvl in proc_of[g] if a < day1 and b > day0]
            ts = int(day0)
            while ts < day1:
                cur = next(((a, b, pid, lvl) for a, b, pid, lvl in running if a <= ts < b), None)
                stop = int(min(day1, cur[1] if cur else min([a for a, *_ in running if a > ts] or [day1])))
                stop = max(stop, ts + 1)
                level = cur[3] if cur else 0.0
                for t in range(ts, stop):
                    util = level + (t % 7) - 3 if level else 0.0
                    gpu_rows.append((g + 1, float(t), util, 1000.0, 81559.0, 300.0, 50.0))
                    if cur:
                        proc_rows.append((float(t), cur[2], 900.0, None))
                ts = stop
        conn.execute("BEGIN")
        conn.executemany("INSERT INTO gpu_sample (device, ts, util_pct, mem_used_mib, mem_total_mib, "
                         "power_w, temp_c) VALUES (?, ?, ?, ?, ?, ?, ?)", gpu_rows)
        conn.executemany("INSERT INTO proc_sample VALUES (?, ?, ?, ?)", proc_rows)
        conn.execute("COMMIT")
        n_gpu += len(gpu_rows)
        n_proc += len(proc_rows)
        store.rollup(day1, RAW_WINDOW_S)  # what the monitor does as time passes
        day0 = day1
        rate = (n_gpu + n_proc) / (time.perf_counter() - t_begin)
        print(f"  {(day1 - start) / 86400:5.1f} days: {n_gpu:,} GPU + {n_proc:,} process samples "
              f"({rate:,.0f} rows/s)", flush=True)
    conn.close()
    store.close()
    return n_gpu, n_proc, time.perf_counter() - t_begin


def time_report(path: str, since: float, until: float, repeat: int) -> tuple[float, float, object]:
    policy = Policy(Quotas(ShareDetect(users=(("alice", 0.2),))).of, {}, 80.0, 5.0)
    best_load = best_total = float("inf")
    report = None
    for _ in range(repeat):
        t0 = time.perf_counter()
        data = load_sqlite(path, since, until, auto_step(since, until))
        t1 = time.perf_counter()
        report = compute(data, "user", policy)
        write_table(report, io.StringIO())
        t2 = time.perf_counter()
        best_load, best_total = min(best_load, t1 - t0), min(best_total, t2 - t0)
    return best_load, best_total, report


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--days", type=int, default=30)
    ap.add_argument("--db", help="where to write the store (default: a temporary directory)")
    ap.add_argument("--keep", action="store_true", help="keep the generated store")
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="bench-report-")
    path = args.db or os.path.join(tmp, "monitor.db")
    end = float(int(time.time()) // 60 * 60)
    print(f"generating {args.days} days × {GPUS} GPUs at 1 Hz into {path}")
    n_gpu, n_proc, secs = generate(path, args.days, end)
    print(f"ingest: {n_gpu:,} GPU samples + {n_proc:,} process samples in {secs:.1f} s "
          f"= {(n_gpu + n_proc) / secs:,.0f} rows/s (incl. daily rollups); "
          f"store {os.path.getsize(path) / 2**20:.0f} MiB")
    windows = (("--last 24h", 86400.0, 1.0), (f"--last {args.days}d", args.days * 86400.0, 3.0))
    for label, span, target in windows:
        load, total, report = time_report(path, end - span, end, args.repeat)
        verdict = "met" if total <= target else "NOT met"
        t = report.totals  # type: ignore[attr-defined]
        print(f"{label:>12}: load {load * 1000:7.1f} ms, load+compute+table {total * 1000:7.1f} ms "
              f"(target {target:.0f} s: {verdict}); used {t.used_gpu_hours:.1f} of "
              f"{t.capacity_gpu_hours:.1f} GPU-h, {len(report.rows)} rows")  # type: ignore[attr-defined]
    if not args.keep and not args.db:
        for f in os.listdir(tmp):
            os.unlink(os.path.join(tmp, f))
        os.rmdir(tmp)


if __name__ == "__main__":
    main()
