"""A node's monitor down inside the window is named with its gap, not only counted as unmeasured
(from the store here; from Prometheus in tests/prometheus/test_cluster_report_e2e.py)."""

from __future__ import annotations

import io
import json
from pathlib import Path

from tests.helpers.report_helpers import END, POLICY, T0, cycles

from gpuslurm.report.compute import compute
from gpuslurm.report.data import Gap
from gpuslurm.report.html import render_page
from gpuslurm.report.query import load_sqlite
from gpuslurm.report.render import as_json, write_table
from gpuslurm.state.store import Store


def _store(path: Path, missing: range) -> str:
    """The hand-made store (a cycle a minute for 2 h) without the cycles at the minutes ``missing``."""
    with Store.open(str(path)) as store:
        for i, c in enumerate(cycles()):
            if i not in missing:
                store.write_cycle(c, [])
    return str(path)


def test_a_monitor_down_for_ten_minutes_is_a_named_gap(tmp_path: Path) -> None:
    db = _store(tmp_path / "monitor.db", range(30, 40))  # no cycle from T0 + 30 min to T0 + 39 min
    data = load_sqlite(db, T0, END, 600.0)
    assert data.gaps == (Gap("n1", T0 + 29 * 60, T0 + 40 * 60),)
    report = compute(data, "user", POLICY)
    out = io.StringIO()
    write_table(report, out)
    (line,) = [x for x in out.getvalue().splitlines() if x.startswith("gap:")]
    assert line.startswith("gap: node n1 has no samples from ") and "(11 min): counted as unmeasured" in line
    (doc,) = as_json(report)["gaps"]
    assert (doc["node"], doc["from_unix_s"], doc["until_unix_s"], doc["seconds"]) == \
        ("n1", T0 + 29 * 60, T0 + 40 * 60, 660.0)
    assert report.totals.unmeasured_gpu_hours > 0  # the gap's time stays unmeasured
    page = render_page(report, "heading", "UTC", [])
    assert "<h2>Gaps</h2>" in page and "node n1 has no samples from " in page and "(11 min)" in page


def test_a_missed_cycle_or_two_is_no_gap(tmp_path: Path) -> None:
    db = _store(tmp_path / "monitor.db", range(30, 32))  # three intervals apart: not more than three
    data = load_sqlite(db, T0, END, 600.0)
    assert data.gaps == () and json.loads(json.dumps(as_json(compute(data, "user", POLICY))))["gaps"] == []


def test_a_gap_outside_the_window_or_across_its_edge_is_not_named(tmp_path: Path) -> None:
    db = _store(tmp_path / "monitor.db", range(30, 40))
    assert load_sqlite(db, T0 + 45 * 60, END, 600.0).gaps == ()
    assert load_sqlite(db, T0, T0 + 20 * 60, 600.0).gaps == ()
    # a window that starts inside the gap has no sample before it: unmeasured, not named (as from
    # Prometheus, which reads only the window's scrapes)
    assert load_sqlite(db, T0 + 35 * 60, END, 600.0).gaps == ()
