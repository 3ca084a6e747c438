"""The Grafana dashboard (packaging/grafana/gpuslurm-dashboard.json): its structure as Grafana
reads it, and every panel's PromQL run against a real Prometheus holding the exporter's series
(its own ``cycle_samples``, backfilled with promtool) and the shipped recording rules' series
(``promtool tsdb create-blocks-from rules``). Grafana itself is not installed here: nothing
renders the dashboard, this checks what it would ask."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

import pytest
from tests.helpers.prom_backfill import PROMETHEUS, PROMTOOL, backfilled

from gpuslurm.report.prometheus import PrometheusClient
from gpuslurm.samples import Allocation, Cycle, GpuSample, ProcSample, Violation

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "packaging" / "grafana" / "gpuslurm-dashboard.json"
RULES = ROOT / "packaging" / "gpuslurm-rules.yml"
T0 = 1_699_999_200.0 + 7
G0, G1 = "GPU-00000000-aaaa", "GPU-11111111-bbbb"
# Grafana's variables as "All" would set them, and its rate interval
VARIABLES = {"$node": ".*", "$user": ".*", "$__rate_interval": "5m"}
# counters come from the monitor's running state, not from one cycle's gauges (cycle_samples)
NOT_IN_A_BACKFILL = {"Monitor problems per minute"}


def _dashboard() -> dict[str, Any]:
    return dict(json.loads(DASHBOARD.read_text()))


def _panels() -> list[dict[str, Any]]:
    return [p for p in _dashboard()["panels"] if p["type"] != "row"]


def test_the_dashboard_is_what_grafana_reads() -> None:
    d = _dashboard()
    assert isinstance(d["schemaVersion"], int) and d["schemaVersion"] >= 36
    assert d["uid"] and d["title"]
    variables = {v["name"]: v for v in d["templating"]["list"]}
    source = variables["datasource"]
    assert source["type"] == "datasource" and source["query"] == "prometheus"
    for name in ("node", "user"):
        assert variables[name]["type"] == "query" and variables[name]["datasource"]["uid"] == "${datasource}"
    ids = [p["id"] for p in d["panels"]]
    assert len(ids) == len(set(ids)), "panel ids are unique"
    assert [p["title"] for p in d["panels"] if p["type"] == "row"] == ["Node", "Job", "User"]
    for p in _panels():
        assert p["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, p["title"]
        box = p["gridPos"]
        assert box["x"] + box["w"] <= 24 and box["w"] > 0 and box["h"] > 0, p["title"]
        refs = [t["refId"] for t in p["targets"]]
        assert refs and len(refs) == len(set(refs)), p["title"]
        assert all(t["datasource"]["uid"] == "${datasource}" and t["expr"] for t in p["targets"]), p["title"]


def test_the_recorded_series_the_panels_read_are_shipped_rules() -> None:
    recorded = set(re.findall(r"^\s*- record: (\S+)$", RULES.read_text(), re.M))
    used = {name for p in _panels() for t in p["targets"]
            for name in re.findall(r"\b\w+:\w+:\w+\b", t["expr"])}
    assert used and used <= recorded, used - recorded


def _cycles() -> list[tuple[Cycle, list[Violation]]]:
    """Two hours of node n1: alice's job 1 on G0; carol's miner in no job on G1 (a finding)."""
    job = Allocation("1", "alice", 1001, (G0,), T0, "phys")
    out = []
    for i in range(240):
        ts = T0 + 30 * i
        gpus = (GpuSample(ts, G0, None, 80.0, 4000.0, 80000.0, 300.0, 60.0),
                GpuSample(ts, G1, None, 40.0, 1000.0, 80000.0, 150.0, 45.0))
        procs = (ProcSample(ts, G0, 100, name="python", uid=1001, user="alice", job_id="1", mem_mib=4000.0),
                 ProcSample(ts, G1, 200, name="miner", uid=1003, user="carol", mem_mib=1000.0))
        rogue = Violation("rogue", "n1", "carol", None, 200, "miner", G1, T0, ts - T0,
                          "miner (PID 200) of carol uses GPU-11111111-bbbb but is in no job")
        out.append((Cycle(ts, "n1", gpus, procs, (job,)), [rogue]))
    return out


@pytest.mark.skipif(not (os.access(PROMETHEUS, os.X_OK) and os.access(PROMTOOL, os.X_OK)),
                    reason="needs Debian's prometheus package (.ci/run installs it)")
def test_every_panel_query_answers_from_the_exporter_and_the_rules(tmp_path: Path) -> None:
    empty, failed = [], []
    with backfilled(tmp_path / "prom", _cycles(), per_process=False, rules=RULES) as url:
        prom = PrometheusClient(url)
        at = T0 + 3600
        for p in _panels():
            for t in p["targets"]:
                expr = t["expr"]
                for name, value in VARIABLES.items():
                    expr = expr.replace(name, value)
                assert "$" not in expr, expr
                try:
                    got = prom.instant(expr, at)
                except Exception as exc:
                    failed.append(f"{p['title']}: {exc}")
                    continue
                if not got and p["title"] not in NOT_IN_A_BACKFILL:
                    empty.append(f"{p['title']}: {expr}")
    assert not failed, failed
    assert not empty, empty
