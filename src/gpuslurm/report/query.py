"""Read a report window out of a monitor store (SQLite) into :class:`ReportData`.

The store is opened read-only (``Store.open(readonly=True)``: ``mode=ro``, ``query_only``), so a
report never blocks nor changes the monitor writing next to it. Raw samples and minute rollups are
bucketed in SQL, both through their primary keys: ``gpu_sample``/``gpu_minute`` by
``(device, ts|minute)`` (the ``device IN (…)`` term lets SQLite seek per device), ``proc_sample``
by ``(ts, process)``, ``proc_minute`` by ``(process, minute)`` for the processes the
``process_seen`` index says were alive in the window. Beyond the raw window the resolution is a
minute: a minute row belongs to the bucket its minute starts in.

A bucket's mean utilisation holds for the time its samples cover: samples × the sampling interval
(the median gap between the newest raw samples, else a minute over the most samples a minute row
holds), at most the bucket. That fraction is :attr:`GpuSeries.cover`; the rest of the bucket (the
monitor not yet started, stopped, restarting) is unmeasured, not busy nor idle.

A window edge inside a rolled-up minute moves out to that minute's edge (:func:`minute_edges`):
the report's period is then what its data covers, for samples, processes and jobs alike.
"""

from __future__ import annotations

import itertools
import math
import sqlite3
import time
from typing import Any

from gpuslurm.errors import InputError
from gpuslurm.report.data import (
    GAP_INTERVALS,
    AllocationSpan,
    Gap,
    GpuSeries,
    ProcSeries,
    ReportData,
    bucket_count,
    bucket_start,
    held_until,
)
from gpuslurm.samples import MAX_GPU_POWER_W, plausible_power_sql, plausible_power_sum_sql
from gpuslurm.state.store import Store, StoreError
from gpuslurm.state.store_values import Checked

# the last two columns: the plausible power readings, for the energy (_energy); a reading no GPU
# draws (negative, infinite, beyond samples.MAX_GPU_POWER_W) is left out, as jobstats leaves it out
_POWER_W = plausible_power_sql("power_w")
_POWER_ROW = plausible_power_sum_sql("power_sum", "power_n")
_GPU_RAW = f"""SELECT device, CAST((ts - ?) / ? AS INTEGER) AS b, count(*), count(util_pct), total(util_pct),
count({_POWER_W}), total({_POWER_W})
FROM gpu_sample WHERE device IN (SELECT id FROM device) AND ts >= ? AND ts < ? GROUP BY device, b"""  # noqa: S608 - built from constants only
_GPU_MIN = f"""SELECT device, CAST((minute - ?) / ? AS INTEGER) AS b, sum(n), sum(util_n), total(util_sum),
sum(CASE WHEN {_POWER_ROW} THEN power_n END), total(CASE WHEN {_POWER_ROW} THEN power_sum END)
FROM gpu_minute WHERE device IN (SELECT id FROM device) AND minute >= ? AND minute < ? GROUP BY device, b"""  # noqa: S608 - built from constants only
_PROCS = """SELECT id, device, pid, name, user, uid, job_id FROM process
WHERE last_seen >= ? AND first_seen < ?"""
_PROC_RAW = """SELECT process, CAST((ts - ?) / ? AS INTEGER) AS b, count(*), count(sm_util_pct),
total(sm_util_pct) FROM proc_sample WHERE ts >= ? AND ts < ? GROUP BY process, b"""
_PROC_MIN = """SELECT process, CAST((minute - ?) / ? AS INTEGER) AS b, sum(n), sum(util_n), total(util_sum)
FROM proc_minute WHERE process IN (SELECT id FROM process WHERE last_seen >= ? AND first_seen < ?)
AND minute >= ? AND minute < ? GROUP BY process, b"""
# consecutive raw samples of one device further apart than a bound: the monitor's gaps
_GAPS = """SELECT prev, ts FROM (SELECT ts, lag(ts) OVER (ORDER BY ts) AS prev FROM gpu_sample
WHERE device = ? AND ts >= ? AND ts < ?) WHERE ts - prev > ?"""
_ALLOCS = """SELECT a.job_id, a.user, a.account, a.start, a.last_seen, d.uuid
FROM allocation a JOIN allocation_device ad ON ad.job_id = a.job_id JOIN device d ON d.id = ad.device
WHERE a.last_seen >= ? AND a.start < ? ORDER BY a.start, a.job_id, d.uuid"""

# per (device or process, bucket): [samples, samples with utilisation, utilisation sum]
_Acc = dict[tuple[int, int], list[float]]


def load_sqlite(path: str, since: float, until: float, step_s: float) -> ReportData:
    """The window ``[since, until)`` of the store at ``path``, in buckets of ``step_s`` seconds.

    Raises InputError (StoreError) for a missing, damaged or foreign file, and when the store
    holds no GPU sample at all or none in the window (naming the period it does hold).
    """
    store = Store.open(path, readonly=True)
    try:
        return _load(store, path, since, until, step_s)
    except sqlite3.Error as exc:
        raise StoreError(" ".join(str(exc).split()), source=path) from None
    finally:
        store.close()


def stored_period(store: Store) -> tuple[float, float] | None:
    """First and last sample time in the store (raw or rolled up), or None when it has none."""
    conn, c = store._conn, store.checked
    row = conn.execute("SELECT min(ts), max(ts) FROM gpu_sample").fetchone()
    mrow = conn.execute("SELECT min(minute), max(minute) + 60 FROM gpu_minute").fetchone()
    lows = [c.time(x, "gpu_sample.ts") for x in (row[0], mrow[0]) if x is not None]
    highs = [c.number(x, "gpu_minute.minute") for x in (row[1], mrow[1]) if x is not None]
    return (min(lows), max(highs)) if lows and highs else None


def minute_edges(store: Store, since: float, until: float) -> tuple[float, float]:
    """``[since, until)`` widened to whole minutes where an edge falls inside a rolled-up minute.

    A minute row holds the whole minute's samples and cannot be cut; taking it whole while jobs
    and processes were cut at the exact edge would count use outside the window against no
    allocation (a job seen only in the minute's first seconds vanished while its use stayed).
    So the window itself moves to the minute's edge, for samples, processes and jobs alike.
    Raw samples never share a minute with a minute row (rollups cut at whole minutes).
    """
    conn = store._conn
    rolled = ("SELECT 1 FROM gpu_minute WHERE device IN (SELECT id FROM device) AND minute = ? "
              "LIMIT 1")
    lo = math.floor(since / 60) * 60
    if lo < since and conn.execute(rolled, (lo,)).fetchone():
        since = float(lo)
    hi = math.floor(until / 60) * 60
    if hi < until and conn.execute(rolled, (hi,)).fetchone():
        until = float(hi + 60)
    return since, until


def _index_labels(devices: dict[int, tuple[str, str]]) -> dict[int, str]:
    """Each device's index as users know it ("3", a MIG device "3.1"): the store numbers devices in
    the order the monitor first wrote them, which is NVML's index order (a cycle lists the GPUs by
    index, each GPU's MIG devices after it)."""
    whole: dict[str, int] = {}
    migs: dict[str, int] = {}
    out: dict[int, str] = {}
    for _, (uuid, parent) in sorted(devices.items()):
        if uuid == parent:
            whole.setdefault(uuid, len(whole))
    for dev, (uuid, parent) in sorted(devices.items()):
        if uuid == parent:
            out[dev] = str(whole[uuid])
        else:
            migs[parent] = migs.get(parent, -1) + 1
            out[dev] = f"{whole[parent]}.{migs[parent]}" if parent in whole else ""
    return out


def _load(store: Store, path: str, since: float, until: float, step_s: float) -> ReportData:
    conn = store._conn
    since, until = minute_edges(store, since, until)
    start = bucket_start(since, step_s)
    n = bucket_count(start, until, step_s)
    minute_lo = math.floor(since / 60) * 60
    c = store.checked
    node_row = conn.execute("SELECT value FROM meta WHERE key = 'node'").fetchone()
    node = c.text(node_row[0], "meta.node") if node_row else "node"
    devices: dict[int, tuple[str, str]] = {}
    for i, u, g in conn.execute("SELECT id, uuid, gpu_uuid FROM device"):
        uuid = c.text(u, "device.uuid")
        devices[c.whole(i, "device.id")] = (uuid, c.opt_text(g, "device.gpu_uuid") or uuid)

    gpu: _Acc = {}
    power: _Acc = {}
    for table, sql, args in (("gpu_sample", _GPU_RAW, (start, step_s, since, until)),
                             ("gpu_minute", _GPU_MIN, (start, step_s, minute_lo, until))):
        rows = conn.execute(sql, args).fetchall()
        _accumulate(c, table, gpu, [r[:5] for r in rows], n)
        _power(c, table, power, rows, n)
    if not gpu:
        period = stored_period(store)
        if period is None:
            raise InputError("the store holds no GPU samples yet (is the monitor running?)", source=path)
        raise InputError(f"no GPU samples between {_iso(since)} and {_iso(until)} "
                         f"(the store holds {_iso(period[0])} to {_iso(period[1])})", source=path)
    gpu_n: dict[tuple[int, int], float] = {k: v[0] for k, v in gpu.items()}
    interval = sampling_interval(store)
    durations = [min(start + (b + 1) * step_s, until) - max(start + b * step_s, since) for b in range(n)]
    labels = _index_labels(devices)
    shown = [(dev, uuid, parent) for dev, (uuid, parent) in sorted(devices.items())
             if any((dev, b) in gpu for b in range(n))]
    energy = _energy(power, shown, durations, interval)
    gpus = tuple(GpuSeries(node, uuid, parent, _means(gpu, dev, n), _cover(gpu, dev, durations, interval),
                           labels[dev], energy.get(uuid, ()))
                 for dev, uuid, parent in shown)

    proc: _Acc = {}
    _accumulate(c, "proc_sample", proc, conn.execute(_PROC_RAW, (start, step_s, since, until)), n)
    _accumulate(c, "proc_minute", proc,
                conn.execute(_PROC_MIN, (start, step_s, since, until, minute_lo, until)), n)
    cells: dict[int, list[tuple[int, list[float]]]] = {}
    for (ident, b), cell in proc.items():
        cells.setdefault(ident, []).append((b, cell))
    procs = []
    for ident, dev, pid, name, user, uid, job in conn.execute(_PROCS, (since, until)).fetchall():
        mine = cells.get(c.whole(ident, "process.id"))
        if not mine:
            continue
        device = c.whole(dev, "process.device")
        if device not in devices:
            c.bad("process.device", dev, "a device id")
        seen, util = _proc_series(mine, gpu_n, device, n)
        procs.append(ProcSeries(node, devices[device][0], c.whole(pid, "process.pid"),
                                c.opt_text(name, "process.name"), c.opt_text(user, "process.user"),
                                c.opt_whole(uid, "process.uid"), c.opt_text(job, "process.job_id"),
                                seen, util))

    spans: dict[str, tuple[Any, ...]] = {}
    devs: dict[str, list[str]] = {}
    for job, user, account, a_start, last, uuid in conn.execute(_ALLOCS, (since, until)):
        job = c.text(job, "allocation.job_id")
        spans[job] = (job, c.text(user, "allocation.user"), c.opt_text(account, "allocation.account"),
                      c.time(a_start, "allocation.start"), c.time(last, "allocation.last_seen"))
        devs.setdefault(job, []).append(c.text(uuid, "device.uuid"))
    allocations = tuple(AllocationSpan(node, j, u, acc, tuple(devs[j]), s, held_until(e, interval))
                        for j, u, acc, s, e in spans.values())
    violations = tuple(store.violations(since, until))
    gaps = _gaps(store, node, [dev for dev, _, _ in shown], since, until, interval)
    return ReportData(f"sqlite:{path}", since, until, start, step_s, gpus, tuple(procs), allocations,
                      violations, gaps)


def _gaps(store: Store, node: str, shown: list[int], since: float, until: float,
          interval: float | None) -> tuple[Gap, ...]:
    """The monitor's gaps inside the window: two raw samples in it of the device sampled last,
    further apart than :data:`GAP_INTERVALS` intervals (one device: every cycle samples them all;
    a seek by the primary key). As from Prometheus, a gap across the window's edge has no sample
    on one side in the window and is not named; minute rollups are not searched."""
    if interval is None or not shown:
        return ()
    conn, c = store._conn, store.checked
    newest = max(shown, key=lambda d: c.number(conn.execute(
        "SELECT coalesce(max(ts), 0) FROM gpu_sample WHERE device = ?", (d,)).fetchone()[0], "gpu_sample.ts"))
    rows = conn.execute(_GAPS, (newest, since, until, GAP_INTERVALS * interval)).fetchall()
    return tuple(Gap(node, c.time(a, "gpu_sample.ts"), c.time(b, "gpu_sample.ts")) for a, b in rows)


def _power(c: Checked, table: str, acc: _Acc, rows: Any, n: int) -> None:
    """Add the power readings of bucketed rows (``_GPU_RAW``/``_GPU_MIN``'s last two columns)."""
    for ident, b, *_, count, watts in rows:
        if not count:
            continue
        b = min(max(c.whole(b, f"{table} time", -2**63, 2**63), 0), n - 1)
        cell = acc.setdefault((c.whole(ident, f"{table} device"), b), [0.0, 0.0])
        cell[0] += c.whole(count, f"{table} power count", 0)
        cell[1] += c.number(watts, f"{table} power", 0.0)


def _energy(power: _Acc, shown: list[tuple[int, str, str]], durations: list[float],
            interval: float | None) -> dict[str, tuple[float | None, ...]]:
    """Each device's energy (J) per bucket: the power sampled times the sampling interval, as the
    GPU-hours are the utilisation sampled times the interval (a bucket the monitor saw in part
    counts that part), and never more than the bucket's time: the readings' mean over at most the
    bucket (samples closer than the interval the store's newest gaps give). With the readings
    bounded in SQL (``_POWER_W``), a bucket's energy lies in 0..MAX_GPU_POWER_W x its duration.
    jobstats counts one job's energy from NVML's energy counter where there is one, a per-sample
    step the report's month of samples cannot afford (benchmarks/bench_report.py); on a GPU that
    has a counter the two agree to the power readings' accuracy. Devices without power readings
    are left out."""
    out: dict[str, tuple[float | None, ...]] = {}
    if interval is None:
        return out
    for dev, uuid, _ in shown:
        cells = [power.get((dev, b)) for b in range(len(durations))]
        if any(cells):
            out[uuid] = tuple(None if x is None else bucket_energy_j(x[0], x[1], interval, dur)
                              for x, dur in zip(cells, durations, strict=True))
    return out


def bucket_energy_j(readings: float, watts_sum: float, interval_s: float, span_s: float) -> float:
    """A bucket's energy from ``readings`` power readings summing ``watts_sum``, each standing for
    ``interval_s``, over at most ``span_s``: in 0..MAX_GPU_POWER_W x ``span_s`` for any input."""
    if not (readings > 0 and span_s > 0 and interval_s > 0
            and math.isfinite(watts_sum + interval_s + span_s)):
        return 0.0
    mean_w = min(max(watts_sum / readings, 0.0), MAX_GPU_POWER_W)
    return mean_w * min(readings * interval_s, span_s)


def _accumulate(c: Checked, table: str, acc: _Acc, rows: Any, n: int) -> None:
    """Add bucketed rows of ``table`` to ``acc``; a bucket whose mean is not a percentage means
    the table holds something else (text, infinity, a number far beyond 100)."""
    for ident, b, count, util_n, util_sum in rows:
        b = min(max(c.whole(b, f"{table} time", -2**63, 2**63), 0), n - 1)  # before ``since``: bucket 0
        key = (c.whole(ident, f"{table} device/process"), b)
        got = (c.whole(count, f"{table} sample count"), c.whole(util_n, f"{table} utilisation count"),
               c.number(util_sum, f"{table} utilisation"))
        cell = acc.setdefault(key, [0.0, 0.0, 0.0])
        for i, v in enumerate(got):
            cell[i] += v
        if cell[1]:
            c.pct(cell[2] / cell[1], f"{table} mean utilisation")


def sampling_interval(store: Store) -> float | None:
    """The monitor's sampling interval in seconds, from what it stored; None when it cannot tell."""
    conn, c = store._conn, store.checked
    newest: tuple[float, int] | None = None
    for (ident,) in conn.execute("SELECT id FROM device").fetchall():  # a seek per device, no scan
        last = conn.execute("SELECT max(ts) FROM gpu_sample WHERE device = ?", (ident,)).fetchone()[0]
        if last is not None and (newest is None or c.time(last, "gpu_sample.ts") > newest[0]):
            newest = (float(last), c.whole(ident, "device.id"))
    if newest is not None:
        ts = [c.time(t, "gpu_sample.ts") for (t,) in conn.execute(
            "SELECT ts FROM gpu_sample WHERE device = ? ORDER BY ts DESC LIMIT 101", (newest[1],))]
        gaps = sorted(a - b for a, b in itertools.pairwise(ts) if a > b)
        if gaps:
            return gaps[len(gaps) // 2]
    most = c.opt_whole(conn.execute("SELECT max(n) FROM gpu_minute").fetchone()[0], "gpu_minute.n")
    return 60.0 / most if most else None


def _cover(acc: _Acc, ident: int, durations: list[float], interval: float | None) -> tuple[float, ...]:
    """Per bucket, the fraction its samples cover (the samples with a utilisation, if any have one)."""
    out: list[float] = []
    for b, dur in enumerate(durations):
        cell = acc.get((ident, b))
        if cell is None or dur <= 0:
            out.append(0.0)
        elif interval is None:
            out.append(1.0)
        else:
            out.append(min((cell[1] or cell[0]) * interval / dur, 1.0))
    return tuple(out)


def _means(acc: _Acc, ident: int, n: int) -> tuple[float | None, ...]:
    out: list[float | None] = []
    for b in range(n):
        cell = acc.get((ident, b))
        out.append(cell[2] / cell[1] if cell is not None and cell[1] else None)
    return tuple(out)


def _proc_series(cells: list[tuple[int, list[float]]], gpu_n: dict[tuple[int, int], float], dev: int,
                 n: int) -> tuple[tuple[float, ...], tuple[float | None, ...]]:
    """A process's presence (its samples over its device's, per bucket) and mean SM utilisation.

    Built from its own buckets only: most processes live for a small part of a long window.
    """
    seen = [0.0] * n
    util: list[float | None] = [None] * n
    for b, (count, util_n, util_sum) in cells:
        if not count:
            continue
        samples = gpu_n.get((dev, b))
        seen[b] = min(count / samples, 1.0) if samples else 1.0
        if util_n:
            util[b] = util_sum / util_n
    return tuple(seen), tuple(util)


def _iso(ts: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S %Z", time.localtime(ts))
