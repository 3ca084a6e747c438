"""The monitor's sample store: one SQLite file per node, ``<state_dir>/monitor.db`` by default.

Layout (schema version 2; store_file.MIGRATIONS upgrades an older store in place, adding columns
only, when the monitor opens it for writing; readers read a version-1 store as it is). Devices
(GPUs and MIG devices) and processes are interned, so the per-second rows hold numbers only:

- ``device``: UUID → small id; ``process``: one row per (device, pid, start time, job), with
  its owner, name and first/last seen.
- ``gpu_sample`` / ``proc_sample``: raw samples, kept for the raw window.
- ``gpu_minute`` / ``proc_minute``: per-minute rollups of older samples. They keep sample counts,
  sums and maxima (utilisation, memory, power), so a mean over raw and rolled-up data is exact;
  and NVML's energy counter at the minute's first and last sample with its rises in between.
- ``allocation`` (+ ``allocation_device``): jobs and their devices, first and last seen.
- ``violation``: detector findings, one row per finding (updated while it lasts);
  ``problem``: what a cycle could not read.

Indexes serve the report queries: per-device time ranges come from the ``(device, ts)`` and
``(device, minute)`` primary keys, so ``--last 24h`` on 8 GPUs reads 8 × 1440 minute rows plus
the raw window instead of millions of samples; jobs and violations overlapping a period come from
their ``last_seen``/``end_ts`` indexes.

Durability: WAL mode; each cycle is one transaction, so ``kill -9`` of the writer loses at most
the cycle being written. A file that is not SQLite, is damaged where opening reads it, or is not a
gpuslurm store is reported in one line; opened for writing it is renamed aside
(``monitor.db.corrupt-<UTC time>``, with its ``-wal``) and a new store is started, never deleted.
Damage deeper in the file shows up later as :class:`StoreError`; :meth:`Store.check` looks for it.
"""

from __future__ import annotations

import math
import os
import sqlite3
import stat
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from gpuslurm.samples import (
    Allocation,
    Cycle,
    GpuSample,
    ProcSample,
    Violation,
    interval_energy_j,
    plausible_counter_mj,
)
from gpuslurm.state import store_file
from gpuslurm.state.store_job import DeviceSeries, JobRecord, read_job, read_series
from gpuslurm.state.store_stats import GpuStats, read_gpu_stats
from gpuslurm.state.store_values import Checked, StoreError
from gpuslurm.times import TIME_MAX

__all__ = ["DEFAULT_NAME", "GpuStats", "Store", "StoreError", "default_path"]

DEFAULT_NAME = "monitor.db"

def _max2(col: str) -> str:
    """SQL for the larger of a stored and an incoming value where either may be NULL."""
    return f"{col} = max(coalesce({col}, excluded.{col}), coalesce(excluded.{col}, {col}))"


_GPU_ROLLUP = f"""
INSERT INTO gpu_minute (device, minute, n, util_n, util_sum, util_max, mem_max, mem_total,
                        power_n, power_sum, power_max, temp_max)
SELECT device, CAST(ts / 60 AS INTEGER) * 60 AS m, count(*), count(util_pct), total(util_pct),
       max(util_pct), max(mem_used_mib), max(mem_total_mib), count(power_w), total(power_w),
       max(power_w), max(temp_c)
FROM gpu_sample WHERE device IN (SELECT id FROM device) AND ts < ? GROUP BY device, m
ON CONFLICT (device, minute) DO UPDATE SET
  n = n + excluded.n, util_n = util_n + excluded.util_n, util_sum = util_sum + excluded.util_sum,
  power_n = power_n + excluded.power_n, power_sum = power_sum + excluded.power_sum,
  {_max2("util_max")}, {_max2("mem_max")}, {_max2("mem_total")}, {_max2("power_max")},
  {_max2("temp_max")}
"""  # noqa: S608 - built from constants only
_PROC_ROLLUP = f"""
INSERT INTO proc_minute (process, minute, n, util_n, util_sum, util_max, mem_max)
SELECT process, CAST(ts / 60 AS INTEGER) * 60 AS m, count(*), count(sm_util_pct),
       total(sm_util_pct), max(sm_util_pct), max(mem_mib)
FROM proc_sample WHERE ts < ? GROUP BY process, m
ON CONFLICT (process, minute) DO UPDATE SET
  n = n + excluded.n, util_n = util_n + excluded.util_n, util_sum = util_sum + excluded.util_sum,
  {_max2("util_max")}, {_max2("mem_max")}
"""  # noqa: S608 - built from constants only


# A minute row's energy (schema 2): the counter at its first and last sample, and the energy between
# its samples: each interval's counter rise, or where the counter fell (restarted) or jumped beyond
# any GPU, the power readings' trapezoid (samples.interval_energy_j, the bound jobstats applies to
# raw samples too). Run before the samples are deleted.
_GPU_ENERGY_ROLLUP = """
WITH s AS (
  SELECT device, ts, CAST(ts / 60 AS INTEGER) * 60 AS m,
         gpuslurm_interval_mj(lag(energy_mj) OVER w, energy_mj, lag(power_w) OVER w, power_w,
                              ts - lag(ts) OVER w) AS rise,
         CAST(lag(ts) OVER w / 60 AS INTEGER) * 60 AS before
  FROM gpu_sample WHERE device IN (SELECT id FROM device) AND ts < ? AND energy_mj IS NOT NULL
  WINDOW w AS (PARTITION BY device ORDER BY ts)),
e AS (SELECT device, m, min(ts) AS t0, max(ts) AS t1,
             total(CASE WHEN before = m THEN rise END) AS inside FROM s GROUP BY device, m)
UPDATE gpu_minute SET energy_inside_mj = e.inside,
  energy_first_mj = (SELECT energy_mj FROM gpu_sample g WHERE g.device = e.device AND g.ts = e.t0),
  energy_last_mj = (SELECT energy_mj FROM gpu_sample g WHERE g.device = e.device AND g.ts = e.t1)
FROM e WHERE gpu_minute.device = e.device AND gpu_minute.minute = e.m
"""


def _interval_mj(e0: object, e1: object, p0: object, p1: object, dt: object) -> float | None:
    """SQLite's side of samples.interval_energy_j, in mJ (a stored value of another type: NULL)."""
    def num(v: object) -> float | None:
        return float(v) if isinstance(v, int | float) and not isinstance(v, bool) else None

    span = num(dt)
    got = None if span is None else interval_energy_j(num(e0), num(e1), num(p0), num(p1), span)
    return None if got is None else got[0] * 1000.0


def default_path(state_dir: str) -> str:
    return os.path.join(state_dir, DEFAULT_NAME)


class Store:
    """An open store; use :meth:`open`. Not shared between threads."""

    def __init__(self, conn: sqlite3.Connection, path: str, readonly: bool,
                 moved_aside: str | None = None) -> None:
        self._conn = conn
        self.path = path
        self.readonly = readonly
        self.moved_aside = moved_aside  # where an unusable file was moved when opening for writing
        self.tightened: list[str] = []  # files whose mode or group opening for writing corrected
        self._devices: dict[str, int] = {}
        self._procs: dict[tuple[int, int, float | None, str | None], int] = {}
        self._node: str | None = None
        self.checked = Checked(path)  # every value read back goes through it (store_values.py)

    @classmethod
    def open(cls, path: str, readonly: bool = False, timeout_s: float = 5.0,
             group: int | None = None) -> Store:
        """Open (for writing: create or upgrade) the store at ``path``; see the module docstring.

        Opened for writing, the store and its ``-wal``/``-shm`` are made root-only (0600), or
        0640 for ``group`` (a gid) when one is given, before SQLite reads them: created so, and
        tightened when they were not (:attr:`tightened` says what changed).
        """
        p = Path(path)
        mode = store_file.PRIVATE_MODE if group is None else store_file.GROUP_MODE
        try:
            st = os.lstat(p)
        except FileNotFoundError:
            st = None
        if st is None and readonly:
            raise StoreError("no such file: no monitor store here", source=path)
        if st is not None and not stat.S_ISREG(st.st_mode):
            what = "a symlink" if stat.S_ISLNK(st.st_mode) else "not a regular file"
            raise StoreError(f"refusing to use: {what}", source=path)
        moved = None
        conn = None
        tightened: list[str] = []
        if st is not None and not readonly:
            tightened = store_file.restrict(p, mode, group)
        if st is not None:
            conn, why = store_file.try_connect(p, readonly, timeout_s)
            if why is not None:
                if readonly or why.startswith("written by a newer"):
                    raise StoreError(why, source=path)
                moved = store_file.move_aside(p)
        if conn is None:
            store_file.create(p, mode, group)
            conn = store_file.connect(p, readonly=False, timeout_s=timeout_s)
        if not readonly:
            store_file.prepare_writer(conn, path)
        store = cls(conn, path, readonly, moved)
        store.tightened = tightened
        return store

    def close(self) -> None:
        self._conn.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def check(self) -> str | None:
        """A full ``quick_check`` (reads the whole file): None when sound, else SQLite's first complaint."""
        rows = self._read("PRAGMA quick_check(1)", ())
        return None if rows and rows[0][0] == "ok" else str(rows[0][0] if rows else "no answer")

    # ---- writing

    def write_cycle(self, cycle: Cycle, violations: Iterable[Violation] = ()) -> None:
        """Record one monitor cycle (and the detectors' findings) in one transaction."""
        self._write(self._cycle_rows, cycle, tuple(violations))

    def rollup(self, now: float, raw_window_s: float, keep_s: float | None = None) -> None:
        """Fold raw samples older than ``raw_window_s`` into minute rows; drop all but ``keep_s``."""
        cutoff = math.floor((now - raw_window_s) / 60) * 60  # whole minutes only: no bucket is split
        self._write(self._rollup_rows, cutoff, None if keep_s is None else now - keep_s)

    def _write(self, fn: Callable[..., None], *args: object) -> None:
        if self.readonly:
            raise StoreError("opened read-only", source=self.path)
        conn = self._conn
        try:
            conn.execute("BEGIN IMMEDIATE")
            try:
                fn(conn, *args)
                conn.execute("COMMIT")
            except BaseException:
                conn.execute("ROLLBACK")
                # ids handed out inside the rolled-back transaction do not exist any more
                self._devices.clear()
                self._procs.clear()
                self._node = None
                raise
        except sqlite3.Error as exc:
            raise StoreError(store_file.one_line(exc), source=self.path) from None

    def _cycle_rows(self, conn: sqlite3.Connection, cycle: Cycle, violations: tuple[Violation, ...]) -> None:
        if cycle.node != self._node:
            conn.execute("INSERT OR REPLACE INTO meta (key, value) VALUES ('node', ?)", (cycle.node,))
            self._node = cycle.node
        conn.executemany(
            "INSERT OR REPLACE INTO gpu_sample VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            [(self._device(conn, g.mig_uuid or g.gpu_uuid, g.gpu_uuid), g.ts, g.util_pct,
              g.mem_used_mib, g.mem_total_mib, g.power_w, g.temp_c, plausible_counter_mj(g.energy_mj))
             for g in cycle.gpus])
        ids = [self._process(conn, p) for p in cycle.procs]
        conn.executemany("INSERT OR REPLACE INTO proc_sample VALUES (?, ?, ?, ?)",
                         [(p.ts, i, p.mem_mib, p.sm_util_pct) for p, i in zip(cycle.procs, ids, strict=True)])
        for chunk in range(0, len(ids), 500):
            part = ids[chunk:chunk + 500]
            conn.execute(f"UPDATE process SET last_seen = max(last_seen, ?) WHERE id IN "  # noqa: S608
                         f"({','.join('?' * len(part))})", (cycle.ts, *part))
        for a in cycle.allocations:
            self._allocation(conn, a, cycle.ts)
        conn.executemany("INSERT INTO problem VALUES (?, ?, ?, ?)",
                         [(p.ts, p.kind, p.subject, p.detail) for p in cycle.problems])
        conn.executemany(
            "INSERT INTO violation VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) "
            "ON CONFLICT (key) DO UPDATE SET duration_s = excluded.duration_s, end_ts = excluded.end_ts, "
            "evidence = excluded.evidence, severity = excluded.severity",
            [(_violation_key(v), *v[:8], v.duration_s, v.start + v.duration_s, v.evidence, v.severity)
             for v in violations])

    def _device(self, conn: sqlite3.Connection, uuid: str, gpu_uuid: str | None) -> int:
        found = self._devices.get(uuid)
        if found is not None:
            return found
        conn.execute("INSERT INTO device (uuid, gpu_uuid) VALUES (?, ?) ON CONFLICT (uuid) DO UPDATE "
                     "SET gpu_uuid = coalesce(device.gpu_uuid, excluded.gpu_uuid)", (uuid, gpu_uuid))
        ident = int(conn.execute("SELECT id FROM device WHERE uuid = ?", (uuid,)).fetchone()[0])
        if gpu_uuid is not None:  # a MIG device first named by an allocation learns its parent later
            self._devices[uuid] = ident
        return ident

    def _process(self, conn: sqlite3.Connection, p: ProcSample) -> int:
        device = self._device(conn, p.mig_uuid or p.gpu_uuid, p.gpu_uuid)
        key = (device, p.pid, p.started, p.job_id)
        found = self._procs.get(key)
        if found is not None:
            return found
        row = conn.execute("SELECT id FROM process WHERE device = ? AND pid = ? AND started IS ? "
                           "AND job_id IS ? ORDER BY id DESC LIMIT 1", key).fetchone()
        if row is None:
            row = conn.execute(
                "INSERT INTO process (device, pid, started, uid, user, job_id, name, first_seen, last_seen) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?) RETURNING id",
                (*key[:3], p.uid, p.user, p.job_id, p.name, p.ts, p.ts)).fetchone()
        if len(self._procs) > 100_000:  # processes come and go: do not grow without bound
            self._procs.clear()
        self._procs[key] = int(row[0])
        return int(row[0])

    def _allocation(self, conn: sqlite3.Connection, a: Allocation, ts: float) -> None:
        conn.execute(
            "INSERT INTO allocation VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT (job_id) DO UPDATE SET "
            "last_seen = max(last_seen, excluded.last_seen), account = coalesce(excluded.account, account)",
            (a.job_id, a.user, a.uid, a.account, a.start, ts, a.source))
        conn.executemany("INSERT OR IGNORE INTO allocation_device VALUES (?, ?)",
                         [(a.job_id, self._device(conn, u, u if u.startswith("GPU-") else None))
                          for u in a.uuids])

    def _rollup_rows(self, conn: sqlite3.Connection, cutoff: float, forget_before: float | None) -> None:
        conn.execute(_GPU_ROLLUP, (cutoff,))
        conn.create_function("gpuslurm_interval_mj", 5, _interval_mj, deterministic=True)
        conn.execute(_GPU_ENERGY_ROLLUP, (cutoff,))
        conn.execute("DELETE FROM gpu_sample WHERE device IN (SELECT id FROM device) AND ts < ?", (cutoff,))
        conn.execute(_PROC_ROLLUP, (cutoff,))
        conn.execute("DELETE FROM proc_sample WHERE ts < ?", (cutoff,))
        if forget_before is None:
            return
        t = (forget_before,)
        conn.execute("DELETE FROM gpu_minute WHERE device IN (SELECT id FROM device) AND minute < ?", t)
        conn.execute("DELETE FROM proc_minute WHERE process IN "
                     "(SELECT id FROM process WHERE last_seen < ?)", t)
        conn.execute("DELETE FROM proc_minute WHERE minute < ?", t)
        conn.execute("DELETE FROM process WHERE last_seen < ?", t)
        conn.execute("DELETE FROM allocation_device WHERE job_id IN "
                     "(SELECT job_id FROM allocation WHERE last_seen < ?)", t)
        conn.execute("DELETE FROM allocation WHERE last_seen < ?", t)
        conn.execute("DELETE FROM problem WHERE ts < ?", t)
        conn.execute("DELETE FROM violation WHERE end_ts < ?", t)

    # ---- reading

    def gpu_stats(self, uuids: Sequence[str], since: float, until: float) -> dict[str, GpuStats]:
        """Per device: samples, utilisation (mean/max/min), memory (peak/min/mean), temperature
        (mean/max) and power (mean/max) in ``[since, until]``.

        Beyond the raw window the resolution is one minute: a minute row counts whole when it
        overlaps the period. Devices without samples are left out. Power readings no GPU draws (a
        damaged or forged sample: negative, infinite, 1e18 W) are left out of the power figures and
        counted in ``power_dropped``, as the report and jobstats leave them out: the other figures
        stay, and the mean and maximum stay within 0..MAX_GPU_POWER_W.
        """
        return read_gpu_stats(self._read, self.checked, uuids, since, until)

    def job(self, job_id: str) -> JobRecord | None:
        """The job's allocation, its devices' samples over its lifetime and its processes
        (:mod:`gpuslurm.state.store_job`); None when this store never saw the job."""
        return read_job(self._read, self.checked, job_id, energy=self.schema_version() >= 2)

    def device_series(self, uuids: list[str], since: float, until: float) -> dict[str, DeviceSeries]:
        """Each device's samples in ``[since, until]`` as jobstats reads them (raw and minute rows)."""
        return read_series(self._read, self.checked, uuids, since, until,
                           energy=self.schema_version() >= 2)

    def violations(self, since: float, until: float, kind: str | None = None,
                   user: str | None = None, job_id: str | None = None) -> list[Violation]:
        """Findings whose time span overlaps ``[since, until]``, oldest first."""
        sql = ("SELECT kind, node, user, job_id, pid, process, gpu_uuid, start, duration_s, evidence, "
               "severity FROM violation WHERE end_ts >= ? AND start <= ?")
        args: list[Any] = [since, until]
        for col, value in (("kind", kind), ("user", user), ("job_id", job_id)):
            if value is not None:
                sql += f" AND {col} = ?"
                args.append(value)
        return [self._violation(row) for row in self._read(sql + " ORDER BY start, key", tuple(args))]

    def _violation(self, row: Sequence[Any]) -> Violation:
        c = self.checked
        kind, node, user, job, pid, process, gpu, start, duration, evidence, severity = row
        start = c.time(start, "violation.start")
        return Violation(c.text(kind, "violation.kind"), c.text(node, "violation.node"),
                         c.opt_text(user, "violation.user"), c.opt_text(job, "violation.job_id"),
                         c.opt_whole(pid, "violation.pid"), c.opt_text(process, "violation.process"),
                         c.opt_text(gpu, "violation.gpu_uuid"), start,
                         c.number(duration, "violation.duration_s", 0.0, TIME_MAX - start),
                         c.text(evidence, "violation.evidence"), c.text(severity, "violation.severity"))

    def recent_cycles(self, span_s: float, max_cycles: int = 20_000) -> list[Cycle]:
        """The newest raw cycles, oldest first: those within ``span_s`` of the newest, at most
        ``max_cycles`` of them (what a detector needs to pick up after a restart; bounded).

        Problems are not read back; a cycle is rebuilt from its GPU samples, the processes seen in
        it and the jobs that were allocated at its time."""
        c = self.checked
        newest = c.opt_time(self._read("SELECT max(ts) FROM gpu_sample", ())[0][0], "gpu_sample.ts")
        if newest is None or max_cycles <= 0:
            return []
        times = [c.time(t, "gpu_sample.ts") for (t,) in self._read(
            "SELECT DISTINCT ts FROM gpu_sample WHERE ts >= ? ORDER BY ts DESC LIMIT ?",
            (newest - span_s, max_cycles))]
        if not times:
            return []
        lo, hi = times[-1], times[0]
        node_row = self._read("SELECT value FROM meta WHERE key = 'node'", ())
        node = c.text(node_row[0][0], "meta.node") if node_row else "node"
        devices = {c.whole(i, "device.id"): (c.text(u, "device.uuid"), c.opt_text(g, "device.gpu_uuid"))
                   for i, u, g in self._read("SELECT id, uuid, gpu_uuid FROM device", ())}

        def names(ident: object, where: str) -> tuple[str, str | None]:
            found = devices.get(c.whole(ident, where))
            if found is None:
                c.bad(where, ident, "a device id")
            uuid, parent = found
            return (parent, uuid) if parent is not None and parent != uuid else (uuid, None)

        gpus: dict[float, list[GpuSample]] = {}
        for dev, ts, util, mem, total, power, temp in self._read(
                "SELECT device, ts, util_pct, mem_used_mib, mem_total_mib, power_w, temp_c FROM gpu_sample "
                "WHERE device IN (SELECT id FROM device) AND ts BETWEEN ? AND ? ORDER BY ts, device",
                (lo, hi)):
            gpu, mig = names(dev, "gpu_sample.device")
            t = c.time(ts, "gpu_sample.ts")
            gpus.setdefault(t, []).append(GpuSample(
                t, gpu, mig, c.opt_pct(util, "gpu_sample.util_pct"),
                c.opt_number(mem, "gpu_sample.mem_used_mib", 0.0),
                c.opt_number(total, "gpu_sample.mem_total_mib", 0.0),
                c.opt_number(power, "gpu_sample.power_w", 0.0), c.opt_number(temp, "gpu_sample.temp_c")))
        procs: dict[float, list[ProcSample]] = {}
        for ts, dev, pid, started, uid, user, job, name, mem, sm in self._read(
                "SELECT s.ts, p.device, p.pid, p.started, p.uid, p.user, p.job_id, p.name, s.mem_mib, "
                "s.sm_util_pct FROM proc_sample s JOIN process p ON p.id = s.process "
                "WHERE s.ts BETWEEN ? AND ? ORDER BY s.ts, p.id", (lo, hi)):
            gpu, mig = names(dev, "process.device")
            t = c.time(ts, "proc_sample.ts")
            procs.setdefault(t, []).append(ProcSample(
                t, gpu, c.whole(pid, "process.pid"), mig, c.opt_text(name, "process.name"),
                c.opt_whole(uid, "process.uid"), c.opt_text(user, "process.user"),
                c.opt_text(job, "process.job_id"), c.opt_number(mem, "proc_sample.mem_mib", 0.0),
                c.opt_pct(sm, "proc_sample.sm_util_pct"), c.opt_time(started, "process.started")))
        jobs: dict[str, list[Any]] = {}
        for job, user, uid, account, start, last, source, uuid in self._read(
                "SELECT a.job_id, a.user, a.uid, a.account, a.start, a.last_seen, a.source, d.uuid "
                "FROM allocation a JOIN allocation_device ad ON ad.job_id = a.job_id "
                "JOIN device d ON d.id = ad.device WHERE a.last_seen >= ? AND a.start <= ? "
                "ORDER BY a.job_id, d.uuid", (lo, hi)):
            entry = jobs.setdefault(c.text(job, "allocation.job_id"), [
                c.text(user, "allocation.user"), c.whole(uid, "allocation.uid"),
                c.opt_text(account, "allocation.account"), c.time(start, "allocation.start"),
                c.time(last, "allocation.last_seen"), c.text(source, "allocation.source"), []])
            entry[6].append(c.text(uuid, "device.uuid"))
        allocs = [(j[3], j[4], Allocation(job, j[0], j[1], tuple(j[6]), j[3], j[2], j[5]))
                  for job, j in jobs.items()]
        return [Cycle(ts, node, tuple(gpus.get(ts, ())), tuple(procs.get(ts, ())),
                      tuple(a for start, last, a in allocs if start <= ts <= last))
                for ts in reversed(times)]

    def schema_version(self) -> int:
        return int(self._read("SELECT max(version) FROM schema_version", ())[0][0])

    def _read(self, sql: str, args: tuple[Any, ...]) -> list[Any]:
        try:
            return self._conn.execute(sql, args).fetchall()
        except sqlite3.Error as exc:
            raise StoreError(store_file.one_line(exc), source=self.path) from None


def _violation_key(v: Violation) -> str:
    # NULLs are distinct in SQLite's UNIQUE, so the identity of a finding is spelled out in text
    return "|".join(str(x) for x in (v.kind, v.node, v.gpu_uuid, v.pid, v.job_id, v.user, repr(v.start)))
