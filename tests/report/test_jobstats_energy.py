"""Energy in ``gpuslurm jobstats``: NVML's total energy counter stored with each sample and read
back as the rises between samples, checked against hand-computed integrals, across a counter
that restarts (a driver reload, a GPU reset) and through the minute rollup; a store of schema 1
upgraded without losing a row; the replay NVML library serving the counter to the monitor."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

from gpuslurm.cli.main import main
from gpuslurm.config import parse_config
from gpuslurm.report.jobstats_load import job_stats
from gpuslurm.samples import Allocation, Cycle, GpuSample
from gpuslurm.state import store_file
from gpuslurm.state.store import Store

T0 = 1_700_000_000.0 - 1_700_000_000.0 % 3600
STEP = 10.0
N = 721  # samples: 2 h at 10 s
RESET_AT = 200  # sample 200 reads the counter restarted at 1 J
G0 = "GPU-00000000-aaaa"
COUNTER_W = 250.0  # what the counter rises by; the power readings say 300 W, so the two differ
POWER_W = 300.0


def counter(i: int) -> float:
    """The counter at sample i, mJ: 250 W from 5 MJ, restarting at 1 J at sample RESET_AT."""
    if i < RESET_AT:
        return 5e9 + COUNTER_W * STEP * 1000 * i
    return 1000.0 + COUNTER_W * STEP * 1000 * (i - RESET_AT)


def write(path: Path, rolled: bool = False, with_counter: bool = True) -> Path:
    alloc = (Allocation("7", "alice", 1001, (G0,), T0),)
    with Store.open(str(path)) as store:
        for i in range(N):
            ts = T0 + STEP * i
            g = GpuSample(ts, G0, util_pct=50.0, mem_used_mib=100.0, mem_total_mib=81559.0,
                          power_w=POWER_W, energy_mj=counter(i) if with_counter else None)
            store.write_cycle(Cycle(ts, "n1", (g,), (), alloc))
        if rolled:
            store.rollup(T0 + 7200, raw_window_s=1800)
    return path


def figures(db: Path):  # type: ignore[no-untyped-def]
    return job_stats(parse_config(""), "7", now=T0 + 10_000, db=str(db), caller_uid=0).gpus[0]


def test_the_counter_gives_the_energy_and_power_stands_in_across_its_reset(tmp_path: Path) -> None:
    g = figures(write(tmp_path / "m.db"))
    # 720 intervals: 719 counted by the counter's rise (250 W x 10 s), the one across the reset by
    # the power readings' trapezoid (300 W x 10 s)
    assert g.energy_j == pytest.approx(719 * COUNTER_W * STEP + POWER_W * STEP)
    assert g.energy_source == "counter+power" and g.counter_resets == 1
    assert g.energy_covered_s == pytest.approx(7200)


def test_without_a_counter_the_energy_is_the_power_integral(tmp_path: Path) -> None:
    g = figures(write(tmp_path / "m.db", with_counter=False))
    assert g.energy_j == pytest.approx(720 * POWER_W * STEP)
    assert g.energy_source == "power" and g.counter_resets == 0


def test_the_minute_rollup_keeps_the_counter_s_energy(tmp_path: Path) -> None:
    # rolled: the first 90 minutes are minute rows. Each keeps its samples' rises and its first and
    # last counter; between minute rows the counter's step counts too. The interval across the
    # reset lies inside a minute (sample 200 is at 33 min 20 s), where a fall counts nothing.
    g = figures(write(tmp_path / "m.db", rolled=True))
    assert g.energy_j == pytest.approx(719 * COUNTER_W * STEP)
    assert g.energy_source == "counter"
    raw = figures(write(tmp_path / "raw.db"))
    assert raw.energy_j - g.energy_j == pytest.approx(POWER_W * STEP)


def _v1_schema() -> str:
    """Schema 1: today's without the columns version 2 added."""
    text = store_file.SCHEMA.replace(", energy_mj REAL", "")
    return text.replace("\n  energy_first_mj REAL, energy_last_mj REAL, energy_inside_mj REAL,", "")


def test_a_schema_1_store_is_upgraded_without_losing_a_row(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    conn = sqlite3.connect(path, isolation_level=None)
    conn.executescript(_v1_schema())
    conn.execute("INSERT INTO schema_version VALUES (1, 0)")
    conn.execute("INSERT INTO device (id, uuid, gpu_uuid) VALUES (1, ?, ?)", (G0, G0))
    conn.execute("INSERT INTO allocation VALUES ('7', 'alice', 1001, NULL, ?, ?, 'map')", (T0, T0 + 20))
    conn.execute("INSERT INTO allocation_device VALUES ('7', 1)")
    conn.executemany("INSERT INTO gpu_sample VALUES (1, ?, 50, 100, 81559, 300, 40)",
                     [(T0,), (T0 + 10,), (T0 + 20,)])
    conn.close()
    assert "energy_mj" not in _columns(path, "gpu_sample")
    # read-only, as a user's jobstats opens it: schema 1 is read as it is (power only)
    assert figures(path).energy_j == pytest.approx(300 * 20)
    with Store.open(str(path)) as store:  # the monitor opens it for writing: upgraded
        assert store.schema_version() == 2
        store.write_cycle(Cycle(T0 + 30, "n1", (GpuSample(T0 + 30, G0, util_pct=50.0, power_w=300.0,
                                                          energy_mj=1e6),), (),
                                (Allocation("7", "alice", 1001, (G0,), T0),)))
    assert {"energy_mj"} <= _columns(path, "gpu_sample")
    assert {"energy_first_mj", "energy_last_mj", "energy_inside_mj"} <= _columns(path, "gpu_minute")
    with sqlite3.connect(path) as conn:
        rows = conn.execute("SELECT ts, power_w, energy_mj FROM gpu_sample ORDER BY ts").fetchall()
    assert rows == [(T0, 300.0, None), (T0 + 10, 300.0, None), (T0 + 20, 300.0, None), (T0 + 30, 300.0, 1e6)]
    assert figures(path).energy_j == pytest.approx(300 * 30)


def _columns(path: Path, table: str) -> set[str]:
    return {r[1] for r in sqlite3.connect(path).execute(f"PRAGMA table_info({table})")}


@pytest.mark.parametrize("rolled", [False, True])
def test_the_fair_share_report_gives_the_job_s_user_the_power_it_drew(
        tmp_path: Path, rolled: bool, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUSLURM_CONFIG", str(tmp_path / "none.toml"))
    (tmp_path / "none.toml").write_text("")
    db = write(tmp_path / "m.db", rolled=rolled)
    # the report's energy is the power sampled times the interval: 720 samples in [T0, T0 + 2 h) at
    # 300 W for 10 s each (jobstats counts the counter's 250 W; the report cannot afford the steps)
    expected = 720 * POWER_W * STEP / 3.6e6
    window = ["--since", f"@{int(T0)}", "--until", f"@{int(T0 + 7200)}"]
    capsys.readouterr()
    assert main(["fairshare-report", "--db", str(db), *window, "--by", "user", "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["totals"]["energy_kwh"] == pytest.approx(expected, abs=1e-4)
    [alice] = doc["rows"]
    assert alice["key"] == "alice" and alice["energy_kwh"] == pytest.approx(expected, abs=1e-4)
    assert main(["fairshare-report", "--db", str(db), *window]) == 0
    table = capsys.readouterr().out
    head = next(line for line in table.splitlines() if "VIOLATIONS" in line)
    row = next(line for line in table.splitlines() if line.startswith("alice"))
    assert f"Energy {expected:.2f} kWh" in table
    assert head.split()[9] == "kWh" and row.split()[5] == f"{expected:.2f}"  # after IDLE GPU-h
