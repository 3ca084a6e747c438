"""The report read from the shipped 5-minute recording rules: the rules' series are made by
``promtool tsdb create-blocks-from rules`` evaluating packaging/gpuslurm-rules.yml over
backfilled exporter samples (never written by hand), and the report from them is the report from
the raw samples, which is the monitor's SQLite store's (the truth of these tests)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from tests.helpers.prom_backfill import PROMETHEUS, PROMTOOL, backfilled

from gpuslurm.report import prom_grid
from gpuslurm.report import prometheus as promsrc
from gpuslurm.report.compute import Policy, compute
from gpuslurm.report.data import ReportData
from gpuslurm.report.prometheus import load_prometheus
from gpuslurm.report.query import load_sqlite
from gpuslurm.samples import Allocation, Cycle, GpuSample, ProcSample
from gpuslurm.state.store import Store

pytestmark = pytest.mark.skipif(not (os.access(PROMETHEUS, os.X_OK) and os.access(PROMTOOL, os.X_OK)),
                                reason="needs Debian's prometheus package (.ci/run installs it)")

RULES = Path(__file__).resolve().parents[2] / "packaging" / "gpuslurm-rules.yml"
HOUR = 1_699_999_200.0  # a whole hour (and a multiple of 5 minutes)
T0 = HOUR + 7  # cycles 7 s off every 5-minute edge
EVERY = 30.0
STEP = 600.0  # two of the rules' 5 minutes
SINCE, UNTIL = HOUR + 450.0, HOUR + 6 * 3600 + 390.0  # neither on a bucket's edge
NODES = ("n1", "n2.x", "n3")
POLICY = Policy(quota_of=lambda user, account: 0.5, account_quotas={})


def _cycles(node: str, k: int) -> list[Cycle]:
    """Two GPUs for 6.5 h: on G0 alice's job then carol's, on G1 bob's job then none (busy anyway);
    utilisation changing every cycle."""
    g0, g1 = f"GPU-{node}-0", f"GPU-{node}-1"
    jobs = [(Allocation(f"{k}1", "alice", 1001, (g0,), T0, "phys"), 2 * 3600 + 10 * k),
            (Allocation(f"{k}2", "bob", 1002, (g1,), T0 + 600, "chem"), 4 * 3600 + 20 * k),
            (Allocation(f"{k}3", "carol", 1003, (g0,), T0 + 3 * 3600, "chem"), 6.4 * 3600)]
    out = []
    for i in range(int(6.5 * 3600 / EVERY)):
        ts = T0 + EVERY * i
        allocs = tuple(a for a, last in jobs if a.start <= ts <= a.start + last)
        gpus = (GpuSample(ts, g0, util_pct=float((i * 13 + k) % 101), mem_total_mib=80000.0),
                GpuSample(ts, g1, util_pct=float((i * 7) % 101), mem_total_mib=80000.0))
        procs = tuple(ProcSample(ts, a.uuids[0], 100 + int(a.job_id), name="python", uid=a.uid,
                                 user=a.user, job_id=a.job_id, mem_mib=1000.0) for a in allocs)
        out.append(Cycle(ts, node, gpus, procs, allocs))
    return out


def _cluster() -> list[Cycle]:
    return [c for k, node in enumerate(NODES) for c in _cycles(node, k)]


def _truth(tmp_path: Path) -> ReportData:
    with Store.open(str(tmp_path / "monitor.db")) as store:
        for c in _cluster():
            store.write_cycle(c)
    return load_sqlite(str(tmp_path / "monitor.db"), SINCE, UNTIL, STEP)


def _asked(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    asked: list[str] = []
    real = promsrc.PrometheusClient._get

    def counting(self: promsrc.PrometheusClient, endpoint: str, params: dict[str, str],
                 want: str) -> list[dict[str, object]]:
        asked.append(params.get("query", ""))
        return real(self, endpoint, params, want)

    monkeypatch.setattr(promsrc.PrometheusClient, "_get", counting)
    return asked


def _same_report(got: ReportData, want: ReportData, used_abs_h: float) -> None:
    rg, rw = compute(got, "user", POLICY), compute(want, "user", POLICY)
    mine = {r.key: r for r in rw.rows}
    assert {r.key for r in rg.rows} == set(mine) >= {"alice", "bob", "carol"}
    for r in rg.rows:
        assert r.allocated_gpu_hours == pytest.approx(mine[r.key].allocated_gpu_hours, rel=1e-12), r.key
        assert abs(r.used_gpu_hours - mine[r.key].used_gpu_hours) <= used_abs_h, r.key
    assert rg.totals.allocated_gpu_hours == pytest.approx(rw.totals.allocated_gpu_hours, rel=1e-12)
    assert rg.totals.used_gpu_hours == pytest.approx(rw.totals.used_gpu_hours, rel=1e-3)


def test_the_report_from_the_rules_is_the_report_from_the_raw_samples_and_the_store(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The rules evaluated where promtool (as a Prometheus) puts them, off the 5-minute grid by
    their group's hash: the report's buckets follow them (each whole bucket is whole rule samples;
    the clipped first and last are read raw) and read no raw sample of a whole bucket. The same
    buckets read from raw samples give the same data, bucket by bucket (sums of sums are the
    sums), and the report is the store's."""
    truth = _truth(tmp_path)
    with backfilled(tmp_path / "prom", ((c, ()) for c in _cluster()), per_process=False,
                    rules=RULES, rules_start=HOUR) as url:
        asked = _asked(monkeypatch)
        ruled = load_prometheus(f"prometheus:{url}", SINCE, UNTIL, STEP)
        read_rules = list(asked)
        monkeypatch.setattr(prom_grid, "_RULES", prom_grid._RAW)  # the rules' buckets, from raw samples
        raw = load_prometheus(f"prometheus:{url}", SINCE, UNTIL, STEP)
    assert any("device:gpuslurm_gpu_utilization_ratio:sum_5m" in q for q in read_rules)
    ranged = [q for q in read_rules if "gpuslurm_gpu_utilization_ratio" in q]
    assert ranged and all("_5m" in q or "avg_over_time(gpuslurm" in q for q in ranged)
    assert sum("avg_over_time(gpuslurm" in q for q in ranged) <= 2  # the clipped buckets
    assert ruled.start == raw.start and ruled.buckets == raw.buckets
    assert ruled.start <= SINCE < ruled.start + STEP
    assert ruled.allocations == raw.allocations
    assert {a.job_id: a.end for a in ruled.allocations} == {a.job_id: a.end for a in truth.allocations}
    assert [(g.node, g.uuid) for g in ruled.gpus] == [(g.node, g.uuid) for g in raw.gpus]
    for a, b in zip(ruled.gpus, raw.gpus, strict=True):
        assert a.cover == pytest.approx(b.cover, rel=1e-12)
        assert [x is None for x in a.util] == [x is None for x in b.util]
        assert [x or 0.0 for x in a.util] == pytest.approx([x or 0.0 for x in b.util], rel=1e-9)
    assert [(p.device, p.job_id, tuple(p.seen)) for p in ruled.procs] == \
        [(p.device, p.job_id, tuple(p.seen)) for p in raw.procs]
    _same_report(ruled, raw, 1e-9)
    # the store counts a process by its own samples, the exporter's counts by device: the same
    # use, split otherwise only in the buckets where a job starts or ends (as in test_prom_backfill)
    _same_report(ruled, truth, 2 * STEP / 3600)


def test_rules_that_begin_inside_the_window_are_not_read(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Rules added an hour into the window: their sums miss the first hour, so the report reads
    the raw samples (on the 5-minute grid of the store) and is the store's."""
    truth = _truth(tmp_path)
    with backfilled(tmp_path / "prom", ((c, ()) for c in _cluster()), per_process=False,
                    rules=RULES, rules_start=HOUR + 3600) as url:
        asked = _asked(monkeypatch)
        got = load_prometheus(f"prometheus:{url}", SINCE, UNTIL, STEP)
    assert not any("_5m{" in q for q in asked if "over_time(" in q and "sum(" not in q), asked
    assert got.start == truth.start
    _same_report(got, truth, 2 * STEP / 3600)
