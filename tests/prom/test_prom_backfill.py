"""Both report sources over exactly the same samples: the cycles a monitor would write to its
SQLite store, and the same cycles as its exporter's samples backfilled into a real Prometheus.

Cycles are 30 s apart and 7 s off the buckets' grid, so no sample lies on a bucket edge (where
SQLite's ``[lo, hi)`` and Prometheus' ``(lo, hi]`` differ by nature); what remains must agree:
one definition of a job's end, one validation of utilisation.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from backfill import PROMETHEUS, PROMTOOL, backfilled

from gpuslurm.errors import InputError
from gpuslurm.report.compute import Policy, compute
from gpuslurm.report.prometheus import load_prometheus
from gpuslurm.report.query import load_sqlite
from gpuslurm.samples import Allocation, Cycle, GpuSample, ProcSample
from gpuslurm.state.store import Store

pytestmark = pytest.mark.skipif(not (os.access(PROMETHEUS, os.X_OK) and os.access(PROMTOOL, os.X_OK)),
                                reason="needs Debian's prometheus package (.ci/run installs it)")

T0 = 1_699_999_200.0 + 7  # 7 s after a whole hour: off every bucket edge
EVERY = 30.0
G0, G1 = "GPU-00000000-aaaa", "GPU-11111111-bbbb"
STEP = 300.0
SINCE, UNTIL = T0 - 7 + 450.0, T0 - 7 + 6900.0  # neither on the 5-minute grid


def _cycles(broken: range = range(0)) -> list[Cycle]:
    """alice's job 1 on G0 seen until 50 min, bob's job 2 on G1 from 10 min to 95 min; a cycle
    every 30 s for 2 h. ``broken``: those cycles say G1 was 170 % busy (a broken exporter)."""
    a = Allocation("1", "alice", 1001, (G0,), T0, "phys")
    b = Allocation("2", "bob", 1002, (G1,), T0 + 600, "chem")
    out = []
    for i in range(240):
        ts = T0 + EVERY * i
        allocs = tuple(x for x, last in ((a, 3000), (b, 5700)) if x.start <= ts <= T0 + last)
        util1 = 170.0 if i in broken else float((i * 7) % 101)
        gpus = (GpuSample(ts, G0, util_pct=float((i * 13) % 101), mem_total_mib=80000.0),
                GpuSample(ts, G1, util_pct=util1, mem_total_mib=80000.0))
        procs = tuple(ProcSample(ts, x.uuids[0], 100 + int(x.job_id), name="python", uid=x.uid,
                                 user=x.user, job_id=x.job_id, mem_mib=1000.0, sm_util_pct=20.0)
                      for x in allocs)
        out.append(Cycle(ts, "n1", gpus, procs, allocs))
    return out


def _store(path: Path, cycles: list[Cycle]) -> str:
    with Store.open(str(path)) as store:
        for c in cycles:
            store.write_cycle(c)
    return str(path)


def test_the_same_job_has_the_same_allocated_time_from_both_sources(tmp_path: Path) -> None:
    cycles = _cycles()
    db = _store(tmp_path / "monitor.db", cycles)
    with backfilled(tmp_path / "prom", ((c, ()) for c in cycles)) as url:
        prom = load_prometheus(f"prometheus:{url}", SINCE, UNTIL, STEP)
        lite = load_sqlite(db, SINCE, UNTIL, STEP)
    ends = {a.job_id: a.end for a in lite.allocations}
    assert ends == {"1": T0 + 3000 + EVERY, "2": T0 + 5700 + EVERY}  # docs/report.md's definition
    assert {a.job_id: a.end for a in prom.allocations} == ends
    policy = Policy(quota_of=lambda user, account: 0.5, account_quotas={})
    rl, rp = compute(lite, "user", policy), compute(prom, "user", policy)
    want = {r.key: r for r in rl.rows}
    assert {r.key for r in rp.rows} == set(want) == {"alice", "bob", "(nobody)"}  # G0 busy after job 1
    for r in rp.rows:
        assert r.allocated_gpu_hours == pytest.approx(want[r.key].allocated_gpu_hours, rel=1e-12), r.key
        assert r.used_gpu_hours == pytest.approx(want[r.key].used_gpu_hours, rel=1e-3), r.key
    assert rp.totals.allocated_gpu_hours == pytest.approx(rl.totals.allocated_gpu_hours, rel=1e-12)


def test_a_utilisation_above_one_is_refused_by_both_sources(tmp_path: Path) -> None:
    """A broken (or forged) exporter says a GPU was 1.7 busy: Prometheus keeps the sample, and
    the report refuses it as the store's reader refuses the same value, naming the series. Both
    check a bucket's mean: 20 cycles (10 min) of it make a whole 5-minute bucket above 100 %."""
    cycles = _cycles(broken=range(100, 120))
    db = _store(tmp_path / "monitor.db", cycles)
    with pytest.raises(InputError) as lite:
        load_sqlite(db, SINCE, UNTIL, STEP)
    with backfilled(tmp_path / "prom", ((c, ()) for c in cycles)) as url, \
            pytest.raises(InputError) as prom:
        load_prometheus(f"prometheus:{url}", SINCE, UNTIL, STEP)
    assert "damaged row" in str(lite.value) and "utilisation" in str(lite.value)
    message = str(prom.value)
    assert "damaged series: gpuslurm_gpu_utilization_ratio{" in message and G1 in message, message
    assert "not a number in 0..100" in message and "\n" not in message
    assert prom.value.exit_code == lite.value.exit_code == 2
