"""The sample store's file: its schema, and opening it as root safely.

Opening for writing creates the file with its mode and group before SQLite does, tightens the
mode, group and owner of an existing store and its ``-wal``/``-shm`` (never through a symlink),
tells a usable gpuslurm store from one that is not, moves an unusable one aside and creates the
schema. :class:`gpuslurm.state.store.Store` holds the connection and the queries; its module
docstring describes the layout.
"""

from __future__ import annotations

import errno
import os
import sqlite3
import stat
import time
from pathlib import Path

from gpuslurm.state.store_values import StoreError

SCHEMA_VERSION = 2
# What each later version adds to the one before: columns only, so an upgrade keeps every row.
MIGRATIONS = {
    # 2: NVML's total energy counter per sample; per minute row, the counter at its first and
    # last sample and the rises between its samples (a fall, a counter reset, counts nothing)
    2: ("ALTER TABLE gpu_sample ADD COLUMN energy_mj REAL",
        "ALTER TABLE gpu_minute ADD COLUMN energy_first_mj REAL",
        "ALTER TABLE gpu_minute ADD COLUMN energy_last_mj REAL",
        "ALTER TABLE gpu_minute ADD COLUMN energy_inside_mj REAL"),
}
SQLITE_MAGIC = b"SQLite format 3\x00"
# The store names every user's processes, jobs and findings: root's alone unless a group is named
# ([monitor] db_group). SQLite gives the -wal and -shm it creates the main file's mode and owner.
PRIVATE_MODE = 0o600
GROUP_MODE = 0o640

SCHEMA = """
CREATE TABLE schema_version (version INTEGER NOT NULL, applied REAL NOT NULL);
CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL) WITHOUT ROWID;
CREATE TABLE device (id INTEGER PRIMARY KEY, uuid TEXT NOT NULL UNIQUE, gpu_uuid TEXT);
CREATE TABLE gpu_sample (
  device INTEGER NOT NULL, ts REAL NOT NULL, util_pct REAL, mem_used_mib REAL, mem_total_mib REAL,
  power_w REAL, temp_c REAL, energy_mj REAL, PRIMARY KEY (device, ts)) WITHOUT ROWID;
CREATE TABLE gpu_minute (
  device INTEGER NOT NULL, minute INTEGER NOT NULL, n INTEGER NOT NULL,
  util_n INTEGER NOT NULL, util_sum REAL NOT NULL, util_max REAL, mem_max REAL, mem_total REAL,
  power_n INTEGER NOT NULL, power_sum REAL NOT NULL, power_max REAL, temp_max REAL,
  energy_first_mj REAL, energy_last_mj REAL, energy_inside_mj REAL,
  PRIMARY KEY (device, minute)) WITHOUT ROWID;
CREATE TABLE process (
  id INTEGER PRIMARY KEY, device INTEGER NOT NULL, pid INTEGER NOT NULL, started REAL,
  uid INTEGER, user TEXT, job_id TEXT, name TEXT, first_seen REAL NOT NULL, last_seen REAL NOT NULL);
CREATE INDEX process_key ON process (device, pid);
CREATE INDEX process_job ON process (job_id) WHERE job_id IS NOT NULL;
CREATE INDEX process_seen ON process (last_seen);
CREATE TABLE proc_sample (
  ts REAL NOT NULL, process INTEGER NOT NULL, mem_mib REAL, sm_util_pct REAL,
  PRIMARY KEY (ts, process)) WITHOUT ROWID;
CREATE TABLE proc_minute (
  process INTEGER NOT NULL, minute INTEGER NOT NULL, n INTEGER NOT NULL,
  util_n INTEGER NOT NULL, util_sum REAL NOT NULL, util_max REAL, mem_max REAL,
  PRIMARY KEY (process, minute)) WITHOUT ROWID;
CREATE TABLE allocation (
  job_id TEXT PRIMARY KEY, user TEXT NOT NULL, uid INTEGER NOT NULL, account TEXT,
  start REAL NOT NULL, last_seen REAL NOT NULL, source TEXT NOT NULL) WITHOUT ROWID;
CREATE INDEX allocation_seen ON allocation (last_seen, start);
CREATE INDEX allocation_user ON allocation (user, last_seen);
CREATE TABLE allocation_device (
  job_id TEXT NOT NULL, device INTEGER NOT NULL, PRIMARY KEY (job_id, device)) WITHOUT ROWID;
CREATE TABLE problem (ts REAL NOT NULL, kind TEXT NOT NULL, subject TEXT NOT NULL, detail TEXT NOT NULL);
CREATE INDEX problem_ts ON problem (ts);
CREATE TABLE violation (
  key TEXT PRIMARY KEY, kind TEXT NOT NULL, node TEXT NOT NULL, user TEXT, job_id TEXT, pid INTEGER,
  process TEXT, gpu_uuid TEXT, start REAL NOT NULL, duration_s REAL NOT NULL, end_ts REAL NOT NULL,
  evidence TEXT NOT NULL, severity TEXT NOT NULL) WITHOUT ROWID;
CREATE INDEX violation_end ON violation (end_ts, start);
CREATE INDEX violation_user ON violation (user, end_ts);
"""


def one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__


def connect(p: Path, *, readonly: bool, timeout_s: float) -> sqlite3.Connection:
    if readonly:  # mode=ro: never creates, never writes (the URI quotes odd characters in the path)
        uri = p.absolute().as_uri() + "?mode=ro"
        conn = sqlite3.connect(uri, uri=True, timeout=timeout_s, isolation_level=None)
        conn.execute("PRAGMA query_only = ON")
    else:
        conn = sqlite3.connect(str(p), timeout=timeout_s, isolation_level=None)
    return conn


def try_connect(p: Path, readonly: bool, timeout_s: float) -> tuple[sqlite3.Connection | None, str | None]:
    """Open an existing file and see whether it is a usable store: (connection, None) or (None, why)."""
    try:
        with open(p, "rb") as fh:
            head = fh.read(len(SQLITE_MAGIC))
    except OSError as exc:
        return None, f"cannot read: {exc.strerror}"
    if not head:
        return (None, "empty file, not a gpuslurm store") if readonly else (None, None)
    if head != SQLITE_MAGIC:
        return None, "not an SQLite database"
    conn = None
    try:
        conn = connect(p, readonly=readonly, timeout_s=timeout_s)
        # Every schema entry is decoded here, so text that is not UTF-8 fails now, not in a query.
        schema = conn.execute("SELECT type, name, tbl_name, sql FROM sqlite_master").fetchall()
        tables = {r[1] for r in schema if r[0] == "table"}
        if not tables and not readonly:
            return conn, None  # a valid, empty database: the writer creates the schema
        if "schema_version" not in tables:
            why = "not a gpuslurm store (no schema_version table)"
        else:
            version = conn.execute("SELECT max(version) FROM schema_version").fetchone()[0]
            if not isinstance(version, int):
                why = "not a gpuslurm store (no schema version recorded)"
            elif version > SCHEMA_VERSION:
                why = f"written by a newer gpuslurm (schema {version}, this one knows {SCHEMA_VERSION})"
            else:
                return conn, None
    except sqlite3.Error as exc:
        why = f"damaged SQLite file: {one_line(exc)}"
    except UnicodeDecodeError as exc:
        why = f"damaged SQLite file: its schema holds text that is not UTF-8 (byte {exc.start})"
    if conn is not None:
        conn.close()
    return None, why


def create(p: Path, mode: int, group: int | None) -> None:
    """Create an empty store file with ``mode`` (and ``group``) before SQLite opens it."""
    try:
        fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode)
    except FileExistsError:
        return  # an empty file that was there: restrict has seen to it
    except OSError as exc:
        raise StoreError(f"cannot create: {exc.strerror}", source=str(p)) from None
    try:
        if group is not None:
            os.fchown(fd, -1, group)
        os.fchmod(fd, mode)  # whatever the umask took away or left
    finally:
        os.close(fd)


def restrict(p: Path, mode: int, group: int | None) -> list[str]:
    """Give the store and its -wal/-shm ``mode`` (and ``group``); what was changed, in words."""
    changed = []
    for f in (str(p), f"{p}-wal", f"{p}-shm"):
        try:
            fd = os.open(f, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        except FileNotFoundError:
            continue
        except OSError as exc:
            why = "a symlink" if exc.errno == errno.ELOOP else exc.strerror
            raise StoreError(f"refusing to use: {why}", source=f) from None
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise StoreError("refusing to use: not a regular file", source=f)
            if st.st_uid != os.geteuid():
                # a file another user made (in a directory they can write) stays theirs whatever
                # mode root gives it: they would read every job through it, or chmod it back
                raise StoreError(f"refusing to use: owned by uid {st.st_uid}, not {os.geteuid()}",
                                 source=f)
            old = stat.S_IMODE(st.st_mode)
            if group is not None and st.st_gid != group:
                os.fchown(fd, -1, group)
                changed.append(f"{f}: group {st.st_gid} -> {group}")
            if old != mode:
                os.fchmod(fd, mode)
                changed.append(f"{f}: mode {old:04o} -> {mode:04o}")
        except OSError as exc:
            raise StoreError(f"cannot restrict its permissions: {exc.strerror}", source=f) from None
        finally:
            os.close(fd)
    return changed


def move_aside(p: Path) -> str:
    """Rename an unusable store (and its WAL files, which belong to it) out of the way."""
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    aside = p.with_name(f"{p.name}.corrupt-{stamp}")
    n = 1
    while aside.exists():
        n += 1
        aside = p.with_name(f"{p.name}.corrupt-{stamp}.{n}")
    os.rename(p, aside)
    for suffix in ("-wal", "-shm"):
        try:
            os.rename(f"{p}{suffix}", f"{aside}{suffix}")
        except FileNotFoundError:
            pass
    return str(aside)


def upgrade(conn: sqlite3.Connection) -> None:
    """Bring an older store to SCHEMA_VERSION in one transaction (columns added, no row lost)."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        version = int(conn.execute("SELECT max(version) FROM schema_version").fetchone()[0])
        for step in range(version + 1, SCHEMA_VERSION + 1):
            for statement in MIGRATIONS[step]:
                conn.execute(statement)
            conn.execute("INSERT INTO schema_version VALUES (?, ?)", (step, time.time()))
        conn.execute("COMMIT")
    except BaseException:
        conn.execute("ROLLBACK")
        raise


def prepare_writer(conn: sqlite3.Connection, path: str) -> None:
    try:
        conn.execute("PRAGMA journal_mode = WAL")
        # NORMAL in WAL mode: a committed cycle survives a killed process; only a power loss can
        # drop the last commits, and the file stays consistent either way
        conn.execute("PRAGMA synchronous = NORMAL")
        tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        if "schema_version" not in tables:
            conn.execute("BEGIN IMMEDIATE")
            for statement in SCHEMA.split(";"):
                if statement.strip():
                    conn.execute(statement)
            conn.execute("INSERT INTO schema_version VALUES (?, ?)", (SCHEMA_VERSION, time.time()))
            conn.execute("COMMIT")
        else:
            upgrade(conn)
    except sqlite3.Error as exc:
        conn.close()
        raise StoreError(one_line(exc), source=path) from None
