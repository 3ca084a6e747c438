"""fairshare-report as a whole process: formats parsed back, charts, and bad input (exit 2, one line)."""

from __future__ import annotations

import csv
import io
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from tests.helpers.report_helpers import CONFIG, END, ROGUE, T0, cycles, make_store

from gpuslurm.state.store import Store

WINDOW = ["--since", f"@{T0:.0f}", "--until", f"@{END:.0f}"]


def run(args: list[str], tmp_path: Path) -> subprocess.CompletedProcess[str]:
    cfg = tmp_path / "gpuslurm.toml"
    cfg.write_text(CONFIG)
    env = {**os.environ, "GPUSLURM_CONFIG": str(cfg), "MPLBACKEND": "Agg"}
    return subprocess.run([sys.executable, "-m", "gpuslurm", "fairshare-report", *args], env=env,
                          capture_output=True, text=True, timeout=60)


@pytest.fixture
def db(tmp_path: Path) -> Path:
    return make_store(tmp_path / "monitor.db", rolled=True)


def test_json(db: Path, tmp_path: Path) -> None:
    r = run(["--db", str(db), *WINDOW, "--format", "json"], tmp_path)
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["window_hours"] == 2.0 and doc["since_unix_s"] == T0 and doc["by"] == "user"
    assert doc["totals"]["capacity_gpu_hours"] == 6.0 and doc["totals"]["used_gpu_hours"] == 2.3
    alice = doc["rows"][0]
    assert (alice["key"], alice["allocated_gpu_hours"], alice["used_gpu_hours"], alice["idle_gpu_hours"],
            alice["share_pct"], alice["quota_pct"], alice["over_quota"]) == (
        "alice", 2.0, 1.8, 0.2, 30.0, 20.0, True)
    assert len(doc["recommendations"]) == 3


@pytest.mark.parametrize("by,keys", [("user", ["alice", "carol", "bob"]),
                                     ("account", ["phys", "(no account)", "chem"]),
                                     ("job", ["1", "(no job)", "2", "3"]),
                                     ("process", ["python (PID 100, job 1)", "miner (PID 200, no job)",
                                                  "(no process, job 2)", "(no process, job 3)"])])
def test_csv_each_by(db: Path, tmp_path: Path, by: str, keys: list[str]) -> None:
    r = run(["--db", str(db), *WINDOW, "--format", "csv", "--by", by], tmp_path)
    assert r.returncode == 0, r.stderr
    got = list(csv.DictReader(io.StringIO(r.stdout)))
    assert [g["key"] for g in got] == keys
    units = {"allocated_gpu_hours", "used_gpu_hours", "idle_gpu_hours", "share_pct", "quota_pct"}
    assert units <= set(got[0])
    assert sum(float(g["used_gpu_hours"]) for g in got) == pytest.approx(2.3)


def test_table_and_html_plot(db: Path, tmp_path: Path) -> None:
    out = tmp_path / "report.html"
    r = run(["--db", str(db), *WINDOW, "--plot", str(out)], tmp_path)
    assert r.returncode == 0, r.stderr
    assert "alice !" in r.stdout and "capacity 6.0 GPU-hours" in r.stdout
    page = out.read_text()
    images = re.findall(r'src="data:image/png;base64,([A-Za-z0-9+/=]+)"', page)
    assert len(images) == 3
    import base64

    assert all(base64.b64decode(i).startswith(b"\x89PNG\r\n") for i in images)
    assert "python (PID 100, job 1): 2.0 h at &gt;80 %" in page


def one_line_error(r: subprocess.CompletedProcess[str]) -> str:
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert r.stdout == "" and len(r.stderr.strip().splitlines()) == 1, r.stderr
    return r.stderr


@pytest.mark.parametrize("args,expect", [
    (["--since", "2999-01-01T00:00"], "in the future"),
    (["--since", f"@{END:.0f}", "--until", f"@{T0:.0f}"], "backwards"),
    (["--last", "24 parsecs"], "bad duration"),
    (["--last", "0h"], "bad duration"),
    (["--since", "yesterday-ish"], "bad time"),
    (["--until", "now"], "--until needs --since"),
    (["--last", "2h", "--since", "-3h"], "cannot be combined"),
    (["--by", "team"], "'team' is not one of"),
    (["--format", "xml"], "'xml' is not one of"),
    (["--plot", "chart.pdf"], ".png or .html"),
    (["--source", "influx:http://x"], "give --source or --db, not both"),
])
def test_bad_options(db: Path, tmp_path: Path, args: list[str], expect: str) -> None:
    assert expect in one_line_error(run(["--db", str(db), *args], tmp_path))


@pytest.mark.parametrize("source,expect", [("influx:http://x", "unknown source kind"),
                                           ("sqlite:", "bad source"), ("nocolon", "bad source")])
def test_bad_sources(tmp_path: Path, source: str, expect: str) -> None:
    assert expect in one_line_error(run(["--source", source], tmp_path))


def test_bad_stores(tmp_path: Path) -> None:
    assert "no such file" in one_line_error(run(["--db", str(tmp_path / "none.db")], tmp_path))
    junk = tmp_path / "junk.db"
    junk.write_bytes(b"this is not sqlite at all" * 100)
    assert "not an SQLite database" in one_line_error(run(["--db", str(junk)], tmp_path))
    from gpuslurm.state.store import Store

    empty = tmp_path / "empty.db"
    Store.open(str(empty)).close()
    assert "holds no GPU samples yet" in one_line_error(run(["--db", str(empty)], tmp_path))


def test_window_outside_the_stored_data(db: Path, tmp_path: Path) -> None:
    err = one_line_error(run(["--db", str(db), "--last", "1h"], tmp_path))
    assert "no GPU samples between" in err and "the store holds" in err


def test_a_process_name_with_terminal_escapes_reaches_the_admin_s_table_as_plain_text(tmp_path: Path) -> None:
    """carol names her miner with escape sequences (prctl PR_SET_NAME: any byte but NUL); the
    admin's table by process, and its evidence, keep none of them, nor her line breaks."""
    hostile = "\x1b]52;c;cm0K\x07\x1b[2J\rok\nalice"
    path = tmp_path / "monitor.db"
    with Store.open(str(path)) as store:
        for c in cycles():
            procs = tuple(p._replace(name=hostile) if p.pid == 200 else p for p in c.procs)
            rogue = ROGUE._replace(process=hostile, evidence=f"{hostile} (PID 200) is in no job")
            store.write_cycle(c._replace(procs=procs), [rogue] if c.ts == END else [])
    res = run(["--source", f"sqlite:{path}", *WINDOW, "--by", "process"], tmp_path)
    assert res.returncode == 0, res.stderr
    assert "(PID 200" in res.stdout
    assert all(line.isprintable() for line in res.stdout.splitlines())
    assert "\r" not in res.stdout and "\x1b" not in res.stdout
