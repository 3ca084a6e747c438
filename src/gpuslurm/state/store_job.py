"""One job's record in the monitor's store: its allocation, its devices' samples over its
lifetime and the processes seen in it (what ``gpuslurm jobstats`` reads).

Raw samples come back one point each; samples already folded into minute rows come back one
point per minute with its sample count, mean and maximum, so the figures over raw and rolled-up
data agree (a minute row keeps no minimum). Every value goes through the store's checks.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

from gpuslurm.samples import plausible_power_w
from gpuslurm.state.store_values import Checked

MINUTE_S = 60.0
MAX_POINTS = 400_000  # per device: a year of minute rows, or four days of 1 s samples


class SeriesPoint(NamedTuple):
    """One raw sample (``span_s`` 0) or one minute row (``span_s`` 60) of one device."""

    ts: float
    span_s: float
    samples: int
    util_pct: float | None  # raw: the sample; minute: the mean of its samples
    util_max_pct: float | None
    mem_mib: float | None  # raw: the sample; minute: the largest
    mem_total_mib: float | None
    power_w: float | None  # raw: the sample; minute: the mean
    # NVML's energy counter (mJ): raw, the sample's (first and last alike, nothing inside); minute,
    # at its first and last sample and the rises between its samples
    energy_first_mj: float | None = None
    energy_last_mj: float | None = None
    energy_inside_mj: float | None = None


class JobProcess(NamedTuple):
    """A process seen on one of the job's devices and attributed to the job."""

    device: str
    pid: int
    name: str | None
    uid: int | None
    user: str | None
    first_seen: float
    last_seen: float
    mem_max_mib: float | None


class DeviceSeries(NamedTuple):
    uuid: str  # the GPU's UUID, or the MIG device's
    gpu_uuid: str | None  # the physical GPU of a MIG device
    points: tuple[SeriesPoint, ...]
    shared_with: tuple[str, ...]  # other jobs allocated the same device at some time of this one
    node: str | None = None  # set where one record holds several nodes' devices (Prometheus)


class JobRecord(NamedTuple):
    job_id: str
    node: str
    user: str
    uid: int
    account: str | None
    start: float
    last_seen: float
    source: str
    devices: tuple[DeviceSeries, ...]
    processes: tuple[JobProcess, ...]


Read = Callable[[str, tuple[Any, ...]], list[Any]]


def read_job(read: Read, c: Checked, job_id: str, energy: bool = True) -> JobRecord | None:
    """The job's record, or None when the store has never seen it allocated (``energy``: the
    store has the energy columns, schema 2)."""
    rows = read("SELECT user, uid, account, start, last_seen, source FROM allocation WHERE job_id = ?",
                (job_id,))
    if not rows:
        return None
    user, uid, account, start, last, source = rows[0]
    start = c.time(start, "allocation.start")
    last = c.time(last, "allocation.last_seen")
    node_row = read("SELECT value FROM meta WHERE key = 'node'", ())
    node = c.text(node_row[0][0], "meta.node") if node_row else "node"
    devices = []
    for ident, uuid, parent in read(
            "SELECT d.id, d.uuid, d.gpu_uuid FROM allocation_device ad JOIN device d ON d.id = ad.device "
            "WHERE ad.job_id = ? ORDER BY d.uuid", (job_id,)):
        device = c.whole(ident, "device.id")
        others = tuple(c.text(j, "allocation.job_id") for (j,) in read(
            "SELECT a.job_id FROM allocation_device ad JOIN allocation a ON a.job_id = ad.job_id "
            "WHERE ad.device = ? AND a.job_id != ? AND a.start <= ? AND a.last_seen >= ? "
            "ORDER BY a.job_id LIMIT 100", (device, job_id, last, start)))
        devices.append(DeviceSeries(c.text(uuid, "device.uuid"), c.opt_text(parent, "device.gpu_uuid"),
                                    _points(read, c, device, start, last, energy), others))
    procs = []
    for dev, pid, name, puid, puser, first, seen, mem in read(
            "SELECT d.uuid, p.pid, p.name, p.uid, p.user, p.first_seen, p.last_seen, "
            "(SELECT max(v) FROM (SELECT max(mem_mib) AS v FROM proc_sample s WHERE s.process = p.id "
            "  UNION ALL SELECT max(mem_max) FROM proc_minute m WHERE m.process = p.id)) "
            "FROM process p JOIN device d ON d.id = p.device WHERE p.job_id = ? "
            "ORDER BY p.first_seen, p.pid LIMIT 1000", (job_id,)):
        procs.append(JobProcess(
            c.text(dev, "device.uuid"), c.whole(pid, "process.pid"), c.opt_text(name, "process.name"),
            c.opt_whole(puid, "process.uid"), c.opt_text(puser, "process.user"),
            c.time(first, "process.first_seen"), c.time(seen, "process.last_seen"),
            c.opt_number(mem, "proc_sample.mem_mib", 0.0)))
    return JobRecord(job_id, node, c.text(user, "allocation.user"), c.whole(uid, "allocation.uid"),
                     c.opt_text(account, "allocation.account"), start, last,
                     c.text(source, "allocation.source"), tuple(devices), tuple(procs))


def read_series(read: Read, c: Checked, uuids: list[str], start: float, end: float,
                energy: bool = True) -> dict[str, DeviceSeries]:
    """Each device's points in ``[start, end]`` (whatever job held it), by UUID; devices the store
    never saw are left out."""
    out = {}
    for uuid in dict.fromkeys(uuids):
        row = read("SELECT id, gpu_uuid FROM device WHERE uuid = ?", (uuid,))
        if row:
            ident = c.whole(row[0][0], "device.id")
            out[uuid] = DeviceSeries(uuid, c.opt_text(row[0][1], "device.gpu_uuid"),
                                     _points(read, c, ident, start, end, energy), ())
    return out


def _points(read: Read, c: Checked, device: int, start: float, last: float,
            energy: bool) -> tuple[SeriesPoint, ...]:
    out = []
    cols = "energy_first_mj, energy_last_mj, energy_inside_mj" if energy else "NULL, NULL, NULL"
    for minute, n, util_n, util_sum, util_max, mem, total, power_n, power_sum, e0, e1, inside in read(
            "SELECT minute, n, util_n, util_sum, util_max, mem_max, mem_total, power_n, power_sum, "  # noqa: S608
            f"{cols} FROM gpu_minute WHERE device = ? AND minute + 60 > ? AND minute <= ? ORDER BY minute "
            "LIMIT ?", (device, start, last, MAX_POINTS)):
        util_n = c.whole(util_n, "gpu_minute.util_n")
        power_n = c.whole(power_n, "gpu_minute.power_n")
        out.append(SeriesPoint(
            c.time(minute, "gpu_minute.minute"), MINUTE_S, c.whole(n, "gpu_minute.n"),
            c.pct(c.number(util_sum, "gpu_minute.util_sum", 0.0) / util_n, "the mean of gpu_minute.util_sum")
            if util_n else None,
            c.opt_pct(util_max, "gpu_minute.util_max"), c.opt_number(mem, "gpu_minute.mem_max", 0.0),
            c.opt_number(total, "gpu_minute.mem_total", 0.0),
            _mean_power(power_sum, power_n),
            c.opt_number(e0, "gpu_minute.energy_first_mj", 0.0),
            c.opt_number(e1, "gpu_minute.energy_last_mj", 0.0),
            c.opt_number(inside, "gpu_minute.energy_inside_mj", 0.0)))
    for ts, util, mem, total, power, counter in read(
            f"SELECT ts, util_pct, mem_used_mib, mem_total_mib, power_w, {'energy_mj' if energy else 'NULL'} "  # noqa: S608
            "FROM gpu_sample "
            "WHERE device = ? AND ts BETWEEN ? AND ? ORDER BY ts LIMIT ?",
            (device, start, last, MAX_POINTS)):
        u = c.opt_pct(util, "gpu_sample.util_pct")
        e = c.opt_number(counter, "gpu_sample.energy_mj", 0.0)
        out.append(SeriesPoint(c.time(ts, "gpu_sample.ts"), 0.0, 1, u, u,
                               c.opt_number(mem, "gpu_sample.mem_used_mib", 0.0),
                               c.opt_number(total, "gpu_sample.mem_total_mib", 0.0),
                               _power(power), e, e,
                               None if e is None else 0.0))
    out.sort(key=lambda p: p.ts)
    return tuple(out)


# A power reading no GPU draws (a damaged or forged sample: negative, infinite, text) is a reading
# missing, not a damaged store: the job's other figures stay (gpu_stats leaves it out the same way).
def _power(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return plausible_power_w(float(value))


def _mean_power(total: object, readings: int) -> float | None:
    mean = _power(total)
    return None if mean is None or not readings else plausible_power_w(mean / readings)
