"""One device's figures over a period in the monitor's store, raw samples and minute rows
together (``Store.gpu_stats``: what the epilog's summary and ``gpuslurm jobstats`` report)."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

from gpuslurm.samples import plausible_power_sql, plausible_power_sum_sql
from gpuslurm.state.store_values import Checked

Read = Callable[[str, tuple[Any, ...]], list[Any]]


class GpuStats(NamedTuple):
    """One device's figures over a period (raw samples and minute rollups together)."""

    uuid: str
    samples: int
    util_samples: int  # samples where utilisation was known: the weight of util_mean_pct
    util_mean_pct: float | None
    util_max_pct: float | None
    mem_peak_mib: float | None
    # raw samples only (minute rollups keep no minimum or temperature mean): None once rolled up
    util_min_pct: float | None = None
    mem_min_mib: float | None = None
    mem_mean_mib: float | None = None
    temp_mean_c: float | None = None
    temp_max_c: float | None = None  # raw and minute rows
    power_mean_w: float | None = None  # raw and minute rows
    power_max_w: float | None = None  # raw and minute rows
    # power readings left out of power_mean_w and power_max_w: not a number one GPU can draw
    # (samples.plausible_power_w), or a minute row whose sum its readings cannot make
    power_dropped: int = 0


def read_gpu_stats(read: Read, c: Checked, uuids: Sequence[str], since: float,
                   until: float) -> dict[str, GpuStats]:
    """See :meth:`gpuslurm.state.store.Store.gpu_stats`."""
    power_ok = plausible_power_sql("power_w")
    row_ok = plausible_power_sum_sql("power_sum", "power_n")
    ids = {}
    for uuid in dict.fromkeys(uuids):
        row = read("SELECT id FROM device WHERE uuid = ?", (uuid,))
        if row:
            ids[int(row[0][0])] = uuid
    out: dict[str, GpuStats] = {}
    lo = math.floor(since / 60) * 60
    for device, uuid in ids.items():
        raw = read("SELECT count(*), count(util_pct), total(util_pct), max(util_pct), "  # noqa: S608
                   "max(mem_used_mib), min(util_pct), min(mem_used_mib), avg(mem_used_mib), "
                   f"avg(temp_c), max(temp_c), count({power_ok}), total({power_ok}), "
                   f"max({power_ok}), count(power_w) "
                   "FROM gpu_sample WHERE device = ? AND ts BETWEEN ? AND ?",
                   (device, since, until))[0]
        agg = read("SELECT coalesce(sum(n), 0), coalesce(sum(util_n), 0), total(util_sum), "  # noqa: S608
                   f"max(util_max), max(mem_max), max(temp_max), "
                   f"coalesce(sum(CASE WHEN {row_ok} THEN power_n END), 0), "
                   f"total(CASE WHEN {row_ok} THEN power_sum END), "
                   f"max(CASE WHEN {row_ok} THEN {plausible_power_sql('power_max')} END), "
                   "coalesce(sum(CASE WHEN typeof(power_n) = 'integer' AND power_n > 0 "
                   "THEN power_n END), 0) FROM gpu_minute "
                   "WHERE device = ? AND minute BETWEEN ? AND ?", (device, lo, until))[0]
        n = raw[0] + c.whole(agg[0], "gpu_minute.n")
        util_n = raw[1] + c.whole(agg[1], "gpu_minute.util_n")
        power_n = raw[10] + c.whole(agg[6], "gpu_minute.power_n")
        if not n:
            continue
        total = c.number(raw[2], "gpu_sample.util_pct") + c.number(agg[2], "gpu_minute.util_sum")
        mean = c.pct(total / util_n, "the mean of gpu_sample.util_pct") if util_n else None
        rolled = agg[0] > 0  # some samples are only in minute rows: no minimum or mean for them
        power = (c.number(raw[11], "gpu_sample.power_w", 0.0)
                 + c.number(agg[7], "gpu_minute.power_sum", 0.0))
        out[uuid] = GpuStats(
            uuid, n, util_n, mean,
            _max(c.opt_pct(raw[3], "gpu_sample.util_pct"), c.opt_pct(agg[3], "gpu_minute.util_max")),
            _max(c.opt_number(raw[4], "gpu_sample.mem_used_mib", 0.0),
                 c.opt_number(agg[4], "gpu_minute.mem_max", 0.0)),
            util_min_pct=None if rolled else c.opt_pct(raw[5], "gpu_sample.util_pct"),
            mem_min_mib=None if rolled else c.opt_number(raw[6], "gpu_sample.mem_used_mib", 0.0),
            mem_mean_mib=None if rolled else c.opt_number(raw[7], "gpu_sample.mem_used_mib", 0.0),
            temp_mean_c=None if rolled else c.opt_number(raw[8], "gpu_sample.temp_c"),
            temp_max_c=_max(c.opt_number(raw[9], "gpu_sample.temp_c"),
                            c.opt_number(agg[5], "gpu_minute.temp_max")),
            power_mean_w=power / power_n if power_n else None,
            power_max_w=_max(c.opt_number(raw[12], "gpu_sample.power_w", 0.0),
                             c.opt_number(agg[8], "gpu_minute.power_max", 0.0)),
            power_dropped=(raw[13] - raw[10]) + (c.whole(agg[9], "gpu_minute.power_n") - agg[6]))
    return out


def _max(a: float | None, b: float | None) -> float | None:
    return b if a is None else a if b is None else max(a, b)
