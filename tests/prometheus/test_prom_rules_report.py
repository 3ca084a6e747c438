"""The report read from the shipped 5-minute recording rules: the rules' series are made by
``promtool tsdb create-blocks-from rules`` evaluating packaging/gpuslurm-rules.yml over
backfilled exporter samples (never written by hand), and the report from them is the report from
the raw samples, which is the monitor's SQLite store's (the truth of these tests)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from tests.helpers.prom_backfill import PROMETHEUS, PROMTOOL, backfilled
from tests.helpers.prom_rules_cycles import HOUR, POLICY, RULES, SINCE, STEP, UNTIL
from tests.helpers.prom_rules_cycles import cluster as _cluster
from tests.helpers.prom_rules_cycles import truth as _truth

from gpuslurm.report import prom_grid
from gpuslurm.report import prometheus as promsrc
from gpuslurm.report.compute import compute
from gpuslurm.report.data import ReportData
from gpuslurm.report.prometheus import load_prometheus

pytestmark = pytest.mark.skipif(not (os.access(PROMETHEUS, os.X_OK) and os.access(PROMTOOL, os.X_OK)),
                                reason="needs Debian's prometheus package (.ci/run installs it)")

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
