"""The charts hold the expected series, and the PNG is a real image of the expected size."""

from __future__ import annotations

from pathlib import Path

import pytest
from PIL import Image
from tests.helpers.report_helpers import END, POLICY, T0, make_store

from gpuslurm.report.charts import build_figure, titles, write_plot, zone
from gpuslurm.report.compute import compute
from gpuslurm.report.query import load_sqlite


@pytest.fixture
def built(tmp_path: Path) -> tuple[object, object]:
    data = load_sqlite(str(make_store(tmp_path / "m.db")), T0, END, 600.0)
    return data, compute(data, "user", POLICY)


def test_figure_series(built: tuple[object, object]) -> None:
    data, report = built
    fig = build_figure(data, report)
    ax_hours, ax_gpu, ax_share = fig.axes[:3]
    assert [a.get_title() for a in (ax_hours, ax_gpu, ax_share)] == list(titles(report))
    # what the report says, per user: allocated, used, used outside any job, idle
    ticks = [t.get_text() for t in ax_hours.get_xticklabels()]
    assert ticks == ["alice", "carol", "bob"]
    bars = [round(b.get_height(), 6) for b in ax_hours.patches]
    assert bars == [2.0, 0.0, 4.0, 1.8, 0.5, 0.0, 0.0, 0.5, 0.0, 0.2, 0.0, 3.5]
    # one heat-map row per GPU, labelled by index (first written: NVML order), not by UUID
    assert [t.get_text() for t in ax_gpu.get_yticklabels()] == ["0", "1", "2"]
    rows = ax_gpu.images[0].get_array()
    assert list(rows[1]) == [0.0] * 6 + [50.0] * 6
    assert ax_gpu.get_xlabel() == f"time ({zone(report.since)})"
    ticks = ax_share.get_xticklabels()
    bars = [(t.get_text(), round(b.get_height(), 6)) for t, b in zip(ticks, ax_share.patches, strict=True)]
    assert bars == [("alice", 30.0), ("carol", round(50 / 6, 6)), ("bob", 0.0)]
    quota = ax_share.collections[0].get_offsets()
    assert [tuple(q) for q in quota] == [(0.0, 20.0), (1.0, 100.0), (2.0, 100.0)]


def test_png_file(built: tuple[object, object], tmp_path: Path) -> None:
    data, report = built
    out = tmp_path / "chart.png"
    write_plot(str(out), data, report)
    with Image.open(out) as im:
        assert im.format == "PNG" and im.size == (1100, 1200)
