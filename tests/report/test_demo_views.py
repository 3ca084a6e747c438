"""The report, its chart and its HTML page on the demo's store (``gpuslurm demo``), as a user sees them.

Before: allocated GPU-hours were 142.25 by user, account and job and 148.25 by process (dave's
python in no job counted as allocated); the same 142.25 printed as 142.2 and 142.3; dave used
7.4 GPU-hours against 4.7 allocated with no word why.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpuslurm.policy.wording import tenths

BYS = ("user", "account", "job", "process")


class Demo:
    def __init__(self, out: Path) -> None:
        self.out = out
        done = subprocess.run([sys.executable, "-m", "gpuslurm", "demo", "--no-plot", "--out", str(out)],
                              capture_output=True, text=True, timeout=300, check=False)
        assert done.returncode == 0, done.stderr
        nxt = next(line for line in done.stderr.splitlines() if line.startswith("Next:"))
        words = nxt.split()
        self.window = words[words.index("--since"):words.index("--since") + 4]

    def report(self, *args: str) -> str:
        env = {**os.environ, "GPUSLURM_CONFIG": str(self.out / "gpuslurm.toml"), "TZ": "UTC"}
        done = subprocess.run([sys.executable, "-m", "gpuslurm", "fairshare-report", "--db",
                               str(self.out / "monitor.db"), *self.window, *args],
                              capture_output=True, text=True, timeout=300, env=env, check=False)
        assert done.returncode == 0, done.stderr
        return done.stdout


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> Demo:
    return Demo(tmp_path_factory.mktemp("demo") / "out")


def test_the_totals_are_the_same_whatever_the_grouping(demo: Demo) -> None:
    totals = {by: json.loads(demo.report("--format", "json", "--by", by))["totals"] for by in BYS}
    assert all(t == totals["user"] for t in totals.values()), totals
    assert totals["user"]["outside_jobs_gpu_hours"] > 5  # dave's python, in no job
    headline = {by: demo.report("--by", by).splitlines()[2] for by in BYS}
    assert len(set(headline.values())) == 1, headline


def test_use_outside_any_job_is_its_own_column_and_holds_no_allocation(demo: Demo) -> None:
    rows = {r["key"]: r for r in json.loads(demo.report("--format", "json", "--by", "process"))["rows"]}
    rogue = rows["python (PID 48211, no job)"]
    assert rogue["allocated_gpu_hours"] == 0 and rogue["idle_gpu_hours"] == 0
    assert rogue["outside_jobs_gpu_hours"] == rogue["used_gpu_hours"] > 0
    table = demo.report("--by", "user").splitlines()
    head = next(line for line in table if line.startswith("USER "))
    assert "NO-JOB USE" in head
    dave = next(line.split() for line in table if line.startswith("dave "))
    alloc, used, outside = (float(x) for x in dave[1:4])
    assert used > alloc and outside > 0 and used - outside <= alloc  # the excess is use outside its job
    assert any(line.startswith("NO-JOB USE:") for line in table)


def test_one_figure_prints_the_same_everywhere(demo: Demo) -> None:
    data = json.loads(demo.report("--format", "json", "--by", "job"))
    allocated = tenths(data["totals"]["allocated_gpu_hours"])
    for by in BYS:
        assert f"Allocated {allocated} GPU-h" in demo.report("--by", by)


def test_tenths_rounds_halves_up_through_binary_noise() -> None:
    assert tenths(142.25) == tenths(142.25 - 1e-12) == tenths(142.25 + 1e-12) == "142.3"
    assert (tenths(0.0), tenths(0.05), tenths(4.75)) == ("0.0", "0.1", "4.8")


@given(st.integers(min_value=0, max_value=10**7), st.floats(min_value=-1e-9, max_value=1e-9))
def test_tenths_never_lets_noise_change_a_figure(hundredths: int, noise: float) -> None:
    value = hundredths / 100
    assert tenths(value + noise) == tenths(value)


def _page_tables(text: str) -> dict[str, list[list[str]]]:
    from html.parser import HTMLParser

    class Tables(HTMLParser):
        def __init__(self) -> None:
            super().__init__()
            self.tables: dict[str, list[list[str]]] = {}
            self.current: list[list[str]] | None = None
            self.cell: list[str] | None = None

        def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
            if tag == "table":
                self.current = self.tables.setdefault(dict(attrs).get("id") or "", [])
            elif tag == "tr" and self.current is not None:
                self.current.append([])
            elif tag in ("td", "th"):
                self.cell = []

        def handle_endtag(self, tag: str) -> None:
            if tag in ("td", "th") and self.cell is not None and self.current is not None:
                self.current[-1].append("".join(self.cell).strip())
                self.cell = None
            elif tag == "table":
                self.current = None

        def handle_data(self, data: str) -> None:
            if self.cell is not None:
                self.cell.append(data)

    parser = Tables()
    parser.feed(text)
    return parser.tables


def test_the_html_page_is_the_report_in_tables(demo: Demo) -> None:
    page = demo.out / "report.html"
    demo.report("--by", "user", "--plot", str(page))
    text = page.read_text()
    assert "<pre>" not in text
    tables = _page_tables(text)
    data = json.loads(demo.report("--format", "json", "--by", "user"))
    rows = {r[0].removesuffix(" (over quota)"): r for r in tables["rows"][1:]}
    for r in data["rows"]:
        shown = rows[r["key"]]
        assert shown[1:5] == [tenths(r["allocated_gpu_hours"]), tenths(r["used_gpu_hours"]),
                              tenths(r["outside_jobs_gpu_hours"]), tenths(r["idle_gpu_hours"])]
    totals = dict(zip(tables["totals"][0], tables["totals"][1], strict=True))
    assert totals["allocated (GPU-h)"] == tenths(data["totals"]["allocated_gpu_hours"])
    assert text.count("data:image/png;base64,") == 3


def test_the_chart_draws_allocation_and_idle_per_user_and_labels_gpus_by_index(demo: Demo) -> None:
    from gpuslurm.report.charts import build_figure, zone
    from gpuslurm.report.compute import Policy, compute
    from gpuslurm.report.query import load_sqlite

    since, until = (float(w.lstrip("@")) for w in demo.window[1::2])
    data = load_sqlite(str(demo.out / "monitor.db"), since, until, 600.0)
    report = compute(data, "user", Policy(lambda user, account: 1.0, {}))
    hours, gpus = build_figure(data, report).axes[:2]
    labels = [h.get_label() for h in hours.containers]
    assert labels == ["allocated", "used", "used outside any job", "idle (allocated, not busy)"]
    dave = [t.get_text() for t in hours.get_xticklabels()].index("dave")
    alloc, used, outside, idle = (c.patches[dave].get_height() for c in hours.containers)
    row = next(r for r in report.rows if r.key == "dave")
    assert (alloc, used, outside, idle) == (row.allocated_gpu_hours, row.used_gpu_hours,
                                            row.outside_gpu_hours, row.idle_gpu_hours)
    assert [t.get_text() for t in gpus.get_yticklabels()] == [str(i) for i in range(8)]
    assert gpus.get_xlabel() == f"time ({zone(report.since)})" and zone(report.since)


def test_names_from_the_store_are_escaped_in_the_page(demo: Demo) -> None:
    """A user names a process (its comm) or a job so that it is markup: the page shows it as text."""
    from gpuslurm.report.compute import Policy, compute
    from gpuslurm.report.html import render_page
    from gpuslurm.report.query import load_sqlite

    since, until = (float(w.lstrip("@")) for w in demo.window[1::2])
    data = load_sqlite(str(demo.out / "monitor.db"), since, until, 600.0)
    report = compute(data, "process", Policy(lambda user, account: 1.0, {}))
    evil = "<img src=x onerror=alert(1)>"
    first = report.rows[0]._replace(key=evil, evidence=(evil,))
    page = render_page(report._replace(rows=(first, *report.rows[1:]), recommendations=(evil,)),
                       evil, "UTC", [(evil, b"png")])
    assert "<img src=x" not in page
    # the row, its evidence line (key and text), the recommendation, the heading, the chart's alt and caption
    assert page.count("&lt;img src=x onerror=alert(1)&gt;") == 7
