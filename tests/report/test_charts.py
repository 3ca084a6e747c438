"""The charts hold the expected series, and the PNG is a real image of the expected size."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from PIL import Image
from report_helpers import END, G0, G1, G2, T0, make_store
from test_compute import POLICY

from gpuslurm.report.charts import TITLES, build_figure, write_plot
from gpuslurm.report.compute import compute
from gpuslurm.report.query import load_sqlite


@pytest.fixture
def built(tmp_path: Path) -> tuple[object, object]:
    data = load_sqlite(str(make_store(tmp_path / "m.db")), T0, END, 600.0)
    return data, compute(data, "user", POLICY)


def test_figure_series(built: tuple[object, object]) -> None:
    data, report = built
    fig = build_figure(data, report)
    ax_gpu, ax_user, ax_share = fig.axes
    assert [a.get_title() for a in fig.axes] == list(TITLES)
    lines = {line.get_label(): list(line.get_ydata()) for line in ax_gpu.get_lines()}
    assert set(lines) == {u[:16] + "…" for u in (G0, G1, G2)}
    assert lines[G1[:16] + "…"] == [0.0] * 6 + [50.0] * 6
    assert ax_user.get_legend_handles_labels()[1] == ["alice", "carol"]
    top = ax_user.collections[-1].get_paths()[0].vertices[:, 1].max()  # alice 0.9 + carol 0.5
    assert math.isclose(top, 1.4)
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
