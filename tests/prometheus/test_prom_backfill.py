"""Both report sources over exactly the same samples: the cycles a monitor would write to its
SQLite store, and the same cycles as its exporter's samples backfilled into a real Prometheus.

Cycles are 30 s apart and 7 s off the buckets' grid, so no sample lies on a bucket edge (where
SQLite's ``[lo, hi)`` and Prometheus' ``(lo, hi]`` differ by nature); what remains must agree:
one definition of a job's end, one validation of utilisation.
"""

from __future__ import annotations

import math
import os
import re
from pathlib import Path

import pytest
from tests.helpers.prom_backfill import PROMETHEUS, PROMTOOL, backfilled

from gpuslurm.errors import InputError
from gpuslurm.report import prometheus as promsrc
from gpuslurm.report.compute import Policy, compute
from gpuslurm.report.prometheus import PrometheusError, load_prometheus
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


def _cycles(broken: range = range(0), bad: float = 170.0) -> list[Cycle]:
    """alice's job 1 on G0 seen until 50 min, bob's job 2 on G1 from 10 min to 95 min; a cycle
    every 30 s for 2 h. ``broken``: those cycles say G1 was ``bad`` % busy (a broken exporter)."""
    a = Allocation("1", "alice", 1001, (G0,), T0, "phys")
    b = Allocation("2", "bob", 1002, (G1,), T0 + 600, "chem")
    out = []
    for i in range(240):
        ts = T0 + EVERY * i
        allocs = tuple(x for x, last in ((a, 3000), (b, 5700)) if x.start <= ts <= T0 + last)
        util1 = bad if i in broken else float((i * 7) % 101)
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


@pytest.mark.parametrize("per_process", [False, True], ids=["devices", "and processes"])
def test_a_nan_utilisation_is_refused_not_dropped(tmp_path: Path, per_process: bool) -> None:
    """A forged exporter's samples say NaN for G1's utilisation over 10 minutes (and, with
    per-process series, NaN for its process' SM share): Prometheus keeps NaN, and a mean over it
    is NaN. Were it dropped as a gap, G1 would just look idle there; it is refused as damaged,
    naming the series, exit 2, as the store refuses a value out of its range."""
    cycles = _cycles(broken=range(100, 120), bad=math.nan)
    if per_process:
        cycles = [c._replace(gpus=(c.gpus[0], c.gpus[1]._replace(util_pct=10.0)),
                             procs=tuple(p._replace(sm_util_pct=math.nan) if p.gpu_uuid == G1
                                         and 100 <= i < 120 else p for p in c.procs))
                  for i, c in enumerate(cycles)]
    with backfilled(tmp_path / "prom", ((c, ()) for c in cycles), per_process=per_process) as url, \
            pytest.raises(InputError) as exc:
        load_prometheus(f"prometheus:{url}", SINCE, UNTIL, STEP)
    message = str(exc.value)
    name = "gpuslurm_process_sm_utilization_ratio" if per_process else "gpuslurm_gpu_utilization_ratio"
    assert f"damaged series: {name}{{" in message and G1 in message, message
    assert "holds float nan, not a number in 0..100" in message and "\n" not in message
    assert exc.value.exit_code == 2


NODES = ["n1", "n2.x", "n(3)|n1"]  # regular-expression characters in names: each is only itself


def _cluster() -> list[Cycle]:
    return [c._replace(node=node) for node in NODES for c in _cycles()]


def test_requests_cover_a_few_nodes_over_a_chunk_each_and_give_the_same_data(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The window split into chunks of one bucket and the cluster into groups of one node (as 16
    nodes x 10 days are at 30 s scrapes) gives exactly what one request per query gives."""
    with backfilled(tmp_path / "prom", ((c, ()) for c in _cluster())) as url:
        whole = load_prometheus(f"prometheus:{url}", SINCE, UNTIL, STEP)
        asked: list[dict[str, str]] = []
        real = promsrc.PrometheusClient._get

        def counting(self: promsrc.PrometheusClient, endpoint: str, params: dict[str, str],
                     want: str) -> list[dict[str, object]]:
            asked.append(params)
            return real(self, endpoint, params, want)

        monkeypatch.setattr(promsrc, "NODES_PER_QUERY", 1)
        monkeypatch.setattr(promsrc, "SAMPLES_PER_QUERY", 1)  # a chunk: one bucket
        monkeypatch.setattr(promsrc.PrometheusClient, "_get", counting)
        split = load_prometheus(f"prometheus:{url}", SINCE, UNTIL, STEP)
        for node in NODES:  # a group's matcher selects its node's two GPUs, not n1's too
            matcher = promsrc._node_matcher([node])
            got = promsrc.PrometheusClient(url).instant(
                f"gpuslurm_gpu_memory_total_bytes{{{matcher}}}", T0 + 600)
            assert {r["metric"]["node"] for r in got} == {node} and len(got) == 2, (node, got)
    assert split == whole
    assert {g.node for g in whole.gpus} == set(NODES) and len(whole.allocations) == 2 * len(NODES)
    bucketed = [p for p in asked if "count_over_time(gpuslurm_gpu_memory_total_bytes" in p["query"]]
    assert len(bucketed) == len(NODES) * whole.buckets  # one node, one bucket each
    for p in asked:
        if "gpuslurm_violation" not in p["query"]:  # findings: one query over the window (rare series)
            selectors = re.findall(r"gpuslurm_[\w:]+\{([^}]*)\}", p["query"])
            assert selectors and all(s.count('node=~"') == 1 for s in selectors), p["query"]
            if "step" in p:
                assert float(p["end"]) - float(p["start"]) < STEP


def test_a_prometheus_that_refuses_for_its_sample_limit_is_named(tmp_path: Path) -> None:
    """A shared Prometheus with a low --query.max-samples: one line naming the limit and what to
    do, never "unreachable" (before: the bare API error)."""
    with backfilled(tmp_path / "prom", ((c, ()) for c in _cluster()), "--query.max-samples=50") as url, \
            pytest.raises(PrometheusError) as exc:
        load_prometheus(f"prometheus:{url}", SINCE, UNTIL, STEP)
    message = str(exc.value)
    assert "prometheus refused a query over " in message and "too many samples (its --query.max-samples); " \
        "use a larger --step or a shorter window" in message, message
    assert "\n" not in message and exc.value.exit_code == 2


def test_without_per_process_series_use_outside_jobs_still_names_its_user(tmp_path: Path) -> None:
    """The default exporter (no series per process): carol's process in no job on G1 after bob's
    job ended (a bucket later) is her use outside jobs, as in the store; the jobs' use is their
    users'."""
    carol = ProcSample(0.0, G1, 666, name="miner", uid=1003, user="carol", mem_mib=10.0)
    cycles = [c._replace(procs=(*c.procs, carol._replace(ts=c.ts))) if c.ts > T0 + 6000 else c
              for c in _cycles()]
    db = _store(tmp_path / "monitor.db", cycles)
    with backfilled(tmp_path / "prom", ((c, ()) for c in cycles), per_process=False) as url:
        prom = load_prometheus(f"prometheus:{url}", SINCE, UNTIL, STEP)
    policy = Policy(quota_of=lambda user, account: 0.5, account_quotas={})
    rl, rp = compute(load_sqlite(db, SINCE, UNTIL, STEP), "user", policy), compute(prom, "user", policy)
    want = {r.key: r for r in rl.rows}
    assert {r.key for r in rp.rows} == set(want) and "carol" in want
    for r in rp.rows:
        assert r.allocated_gpu_hours == pytest.approx(want[r.key].allocated_gpu_hours, rel=1e-12), r.key
        # the store's processes report an SM utilisation (their own busy time, the rest to the
        # job), the counts do not (by how long each was seen): the same user's use, split
        # otherwise in the buckets where a job starts or ends, at most those two buckets apart
        assert abs(r.used_gpu_hours - want[r.key].used_gpu_hours) <= 2 * STEP / 3600, r.key
        assert abs(r.outside_gpu_hours - want[r.key].outside_gpu_hours) <= 2 * STEP / 3600, r.key
    assert rp.totals.used_gpu_hours == pytest.approx(rl.totals.used_gpu_hours, rel=1e-9)
    mine = {r.key: r for r in rp.rows}["carol"]
    assert mine.used_gpu_hours == pytest.approx(want["carol"].used_gpu_hours, rel=1e-3)
    assert mine.outside_gpu_hours == pytest.approx(want["carol"].outside_gpu_hours, rel=1e-3)
    assert want["carol"].used_gpu_hours > 0.1
    # no series per process: one per device, job and user, PID 0
    assert {(p.device, p.user, p.job_id, p.pid) for p in prom.procs} == \
        {(G0, "alice", "1", 0), (G1, "bob", "2", 0), (G1, "carol", None, 0)}
