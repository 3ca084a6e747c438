"""``gpuslurm jobstats``: one job's figures from a real store written through Store.write_cycle,
checked against hand-computed values (utilisation, memory, idle time, energy as the integral of
power), before and after the monitor's minute rollup; its notes; who may see the job.

The store: node n1, one cycle every 10 s from T0 for 2 h (721 cycles).
- Job 7 (alice, uid 1001) has G0 and G1. G0: 80 % and 2 GiB for the first hour, then 0 % still
  holding 2 GiB (busy then idle); power 300 W, then 100 W. G1: 0 %, 60 W throughout (idle).
- Job 8 (bob, uid 1002) has G2 at 50 %, 200 W; process python PID 300.
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuslurm.cli.main import main
from gpuslurm.config import parse_config
from gpuslurm.errors import EXIT_BAD_INPUT, InputError
from gpuslurm.report.jobstats import Settings, gpu_figures, may_see, table, to_json
from gpuslurm.report.jobstats_load import job_stats
from gpuslurm.samples import Allocation, Cycle, GpuSample, ProcSample
from gpuslurm.state.store import Store
from gpuslurm.state.store_job import DeviceSeries, SeriesPoint

T0 = 1_700_000_000.0 - 1_700_000_000.0 % 3600
STEP = 10.0
END = T0 + 7200
G0, G1, G2 = "GPU-00000000-aaaa", "GPU-11111111-bbbb", "GPU-22222222-cccc"
CONFIG = """
[jobstats]
offers = { "1g.10gb" = 10, "3g.40gb" = 40 }
notes = { idle = "Our guide: https://hpc.example/idle" }
links = ["https://hpc.example/jobstats"]
"""


def write_store(path: Path, rolled: bool = False) -> Path:
    allocs = (Allocation("7", "alice", 1001, (G0, G1), T0, "phys"),
              Allocation("8", "bob", 1002, (G2,), T0, "chem"))
    with Store.open(str(path)) as store:
        for i in range(int(7200 / STEP) + 1):
            ts = T0 + STEP * i
            first = ts < T0 + 3600
            gpus = (GpuSample(ts, G0, util_pct=80.0 if first else 0.0, mem_used_mib=2048.0,
                              mem_total_mib=81559.0, power_w=300.0 if first else 100.0),
                    GpuSample(ts, G1, util_pct=0.0, mem_used_mib=0.0, mem_total_mib=81559.0, power_w=60.0),
                    GpuSample(ts, G2, util_pct=50.0, mem_used_mib=30000.0, mem_total_mib=81559.0,
                              power_w=200.0))
            procs = (ProcSample(ts, G0, 100, name="train", uid=1001, user="alice", job_id="7",
                                mem_mib=2048.0),
                     ProcSample(ts, G2, 300, name="python", uid=1002, user="bob", job_id="8",
                                mem_mib=30000.0))
            store.write_cycle(Cycle(ts, "n1", gpus, procs, allocs))
        if rolled:
            store.rollup(END, raw_window_s=1800)
    return path


@pytest.fixture(scope="module")
def stores(tmp_path_factory: pytest.TempPathFactory) -> dict[bool, Path]:
    d = tmp_path_factory.mktemp("jobstats")
    return {rolled: write_store(d / f"monitor-{rolled}.db", rolled) for rolled in (False, True)}


def stats(db: Path, job: str = "7", uid: int = 0, gids: tuple[int, ...] = (), config: str = CONFIG):
    return job_stats(parse_config(config), job, now=END + 3600, db=str(db), caller_uid=uid,
                     caller_gids=gids)


@pytest.mark.parametrize("rolled", [False, True])
def test_figures_match_the_hand_computed_ones(stores: dict[bool, Path], rolled: bool) -> None:
    s = stats(stores[rolled])
    g0, g1 = s.gpus
    assert (g0.uuid, g1.uuid) == (G0, G1)
    # 720 intervals of 10 s; G0 busy for the first 360 of them
    assert g0.observed_s == pytest.approx(7200) and g1.observed_s == pytest.approx(7200)
    assert g0.util_mean_pct == pytest.approx(80.0 * 360 / 721)
    assert g0.idle_s == pytest.approx(3600) and g0.idle_tail_s == pytest.approx(3600)
    assert g1.idle_s == pytest.approx(7200)
    assert g0.mem_peak_mib == 2048.0
    # energy: 300 W for the first hour, 100 W for the second (raw: one trapezoid across the step)
    assert g0.energy_j == pytest.approx(300 * 3600 + 100 * 3600, rel=1e-3)
    assert g1.energy_j == pytest.approx(60 * 7200)
    assert s.energy_j == pytest.approx(g0.energy_j + g1.energy_j)
    if rolled:  # minute rows keep no minimum or mean memory
        assert g0.util_min_pct is None and g0.mem_mean_mib is None
    else:
        assert g0.util_min_pct == 0.0 and g0.mem_mean_mib == 2048.0
    assert [p.pid for p in s.job.processes] == [100]
    assert s.job.processes[0].mem_max_mib == 2048.0


def test_the_raw_energy_is_the_trapezoid_across_the_power_step(stores: dict[bool, Path]) -> None:
    # samples 0..359 at 300 W, 360..720 at 100 W: 359 steps at 300 W, one at their mean, 360 at 100 W
    g0 = stats(stores[False]).gpus[0]
    assert g0.energy_j == pytest.approx(359 * STEP * 300 + STEP * 200 + 360 * STEP * 100)


def test_the_verdict_names_the_idle_gpu_the_idle_tail_and_a_smaller_gpu(stores: dict[bool, Path]) -> None:
    s = stats(stores[False])
    assert s.verdict == "idle GPUs"
    kinds = {n.kind: n for n in s.notes}
    assert set(kinds) == {"idle", "busy-then-idle", "smaller"}
    assert G1 in kinds["idle"].text and G0 not in kinds["idle"].text
    assert kinds["idle"].site_text == "Our guide: https://hpc.example/idle"
    assert "1 h 00 min" in kinds["busy-then-idle"].text
    assert "1g.10gb" in kinds["smaller"].text
    assert s.links == ("https://hpc.example/jobstats",)
    bob = stats(stores[False], "8")
    assert bob.verdict == "room to improve"  # 30000 MiB fits a 3g.40gb
    assert [n.kind for n in bob.notes] == ["smaller"] and "3g.40gb" in bob.notes[0].text
    assert stats(stores[False], "8", config="").verdict == "good"


def test_held_memory_busy_counts_a_gpu_holding_memory_as_not_idle(stores: dict[bool, Path]) -> None:
    busy = '[detect.idle]\nheld_memory = "busy"\nheld_min_mib = 1024\n'
    g0, g1 = stats(stores[False], config=busy).gpus
    assert g0.idle_s == 0 and g1.idle_s == pytest.approx(7200)  # G0 holds 2 GiB throughout; G1 none
    s = stats(stores[False], config=busy)
    assert [n.kind for n in s.notes] == ["idle"] and G0 not in s.notes[0].text


def test_a_user_sees_only_their_own_job_root_and_admins_all(stores: dict[bool, Path]) -> None:
    db = stores[False]
    assert stats(db, "7", uid=1001).job.user == "alice"
    with pytest.raises(InputError) as other:
        stats(db, "8", uid=1001)
    with pytest.raises(InputError) as missing:
        stats(db, "9", uid=1001)
    # a job of another user reads as one the store never saw: nothing tells them apart
    assert str(other.value).replace("8", "N") == str(missing.value).replace("9", "N")
    assert other.value.exit_code == EXIT_BAD_INPUT
    assert stats(db, "8", uid=0).job.user == "bob"
    assert may_see(1001, [50, 60], [60], 1002) and not may_see(1001, [50], [60], 1002)


def test_a_process_name_with_terminal_escapes_reaches_an_admins_table_as_plain_text(
        tmp_path: Path) -> None:
    """A process names itself (prctl PR_SET_NAME: any byte but NUL, kept as the store's name) and
    an account is the user's text under PBS: root or an admin runs jobstats on that job, and no
    escape sequence (retitle, clear, OSC 52 clipboard) or line break of theirs reaches the terminal."""
    hostile = "\x1b]52;c;cm0gLXJmIH4K\x07\x1b[2J\rok\nVerdict: good"
    alloc = Allocation("7", "alice", 1001, (G0,), T0, "phys\x1b[8m")
    with Store.open(str(tmp_path / "m.db")) as store:
        for i in range(3):
            ts = T0 + STEP * i
            store.write_cycle(Cycle(ts, "n1", (GpuSample(ts, G0, util_pct=50.0, mem_used_mib=1.0,
                                                         mem_total_mib=81559.0, power_w=100.0),),
                                    (ProcSample(ts, G0, 100, name=hostile, uid=1001, user="alice",
                                                job_id="7", mem_mib=1.0),), (alloc,)))
    lines = table(to_json(stats(tmp_path / "m.db", "7", uid=0)))
    assert all(line.isprintable() for line in lines)
    assert sum(line.startswith("Verdict:") for line in lines) == 1


def test_a_bad_job_id_and_a_missing_store_are_one_line_errors(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="not a job id"):
        stats(tmp_path / "x.db", "../../etc")
    with pytest.raises(InputError, match="no monitor store here"):
        stats(tmp_path / "x.db", "7")
    with pytest.raises(InputError, match="unknown key 'colour' in \\[jobstats\\]"):
        parse_config("[jobstats]\ncolour = 1\n")
    with pytest.raises(InputError, match="unknown note kind"):
        stats(write_store(tmp_path / "m.db"), "7", config='[jobstats]\nnotes = { nice = "x" }\n')


def test_the_command_prints_a_table_and_json_and_exits_2_for_an_unknown_job(
        stores: dict[bool, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    cfg = tmp_path / "gpuslurm.toml"
    cfg.write_text(CONFIG)
    monkeypatch.setenv("GPUSLURM_CONFIG", str(cfg))
    db = str(stores[True])
    capsys.readouterr()
    assert main(["jobstats", "7", "--db", db]) == 0
    out = capsys.readouterr().out
    assert out.startswith("Job 7 on n1: user alice (uid 1001)")
    assert "Verdict: idle GPUs" in out and "https://hpc.example/jobstats" in out
    assert main(["jobstats", "7", "--db", db, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["schema"] == "gpuslurm.jobstats.v1" and doc["node"] == "n1"
    assert doc["energy_kwh"] == pytest.approx((400 * 3600 + 60 * 7200) / 3.6e6, rel=1e-3)
    assert main(["jobstats", "999", "--db", db]) == EXIT_BAD_INPUT
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "job 999: not in this node's monitor store, or not yours" in err


powers = st.lists(st.floats(0, 1000), min_size=1, max_size=50)


@settings(max_examples=200, deadline=None)
@given(powers, st.floats(1, 60), st.floats(0, 100))
def test_energy_is_the_trapezoid_and_idle_never_exceeds_what_was_seen(
        watts: list[float], step: float, idle_pct: float) -> None:
    pts = tuple(SeriesPoint(T0 + i * step, 0.0, 1, w / 10, w / 10, None, None, w)
                for i, w in enumerate(watts))
    g = gpu_figures(DeviceSeries(G0, G0, pts, ()), Settings(idle_pct=idle_pct, max_gap_s=3 * step))
    trapezoid = sum((a + b) / 2 * step for a, b in itertools.pairwise(watts))
    if len(watts) == 1:  # one sample spans no time: no energy rather than 0 J
        assert g.energy_j is None
    else:
        assert g.energy_j == pytest.approx(trapezoid, rel=1e-6, abs=1e-6)  # ts are ~1.7e9: float steps
    assert g.observed_s == pytest.approx(step * (len(watts) - 1), rel=1e-6)
    assert 0 <= g.idle_tail_s <= g.idle_s <= g.observed_s + 1e-9
    assert g.util_min_pct is not None and g.util_mean_pct is not None and g.util_max_pct is not None
    assert g.util_min_pct <= g.util_mean_pct + 1e-9 <= g.util_max_pct + 2e-9


def test_a_gap_longer_than_three_intervals_is_not_counted() -> None:
    ts = [T0, T0 + 10, T0 + 20, T0 + 1020, T0 + 1030]
    pts = tuple(SeriesPoint(t, 0.0, 1, 0.0, 0.0, None, None, 100.0) for t in ts)
    g = gpu_figures(DeviceSeries(G0, G0, pts, ()), Settings(max_gap_s=5))
    assert g.observed_s == 30 and g.energy_j == pytest.approx(3000) and g.energy_covered_s == 30
