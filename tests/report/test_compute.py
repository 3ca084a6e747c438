"""The report's numbers from a real store (raw and rolled up), checked against hand arithmetic."""

from __future__ import annotations

from pathlib import Path

import pytest
from tests.helpers.report_helpers import END, G0, G1, G2, POLICY, T0, make_store

from gpuslurm.report.compute import Report, Totals, compute
from gpuslurm.report.data import AllocationSpan, GpuSeries, ProcSeries, ReportData, bucket_start
from gpuslurm.report.query import load_sqlite


def rows(report: Report) -> dict[str, tuple[float, float, float]]:
    return {r.key: (round(r.allocated_gpu_hours, 6), round(r.used_gpu_hours, 6), round(r.idle_gpu_hours, 6))
            for r in report.rows}


@pytest.fixture(params=["raw", "rolled"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Path:
    return make_store(tmp_path / "monitor.db", rolled=request.param == "rolled")


@pytest.mark.parametrize("step", [60.0, 600.0, 3600.0])
def test_by_user_exact(store: Path, step: float) -> None:
    data = load_sqlite(str(store), T0, END, step)
    report = compute(data, "user", POLICY)
    assert rows(report) == {"alice": (2.0, 1.8, 0.2), "carol": (0.0, 0.5, 0.0), "bob": (4.0, 0.0, 3.5)}
    t = report.totals
    assert (t.gpus, t.capacity_gpu_hours, round(t.allocated_gpu_hours, 6)) == (3, 6.0, 6.0)
    assert (round(t.used_gpu_hours, 6), round(t.idle_gpu_hours, 6)) == (2.3, 3.7)
    assert round(t.utilisation_pct, 6) == round(230 / 6, 6)
    alice, carol, bob = report.rows
    assert (round(alice.share_pct, 6), alice.quota_pct, alice.over_quota) == (30.0, 20.0, True)
    assert alice.evidence == ("python (PID 100, job 1): 2.0 h at >80 % (expected quota: 20 %)",)
    assert (bob.jobs, bob.idle_jobs, bob.over_quota) == (2, 1, False)  # job 3 idle, job 2 25 % busy
    assert (carol.violations, carol.rogue_processes) == (1, 1)
    assert carol.evidence[0] == ("rogue (1.0 h in the window): miner (PID 200) uses GPU-11111111-bbbb "
                                 "but is in no job")
    assert report.recommendations == (
        "alice: used 30 % of GPU capacity against a 20 % quota — lower its priority or cap its GPUs "
        "(gpuslurm throttle)",
        "carol: 1 GPU process outside any job — stop them; GPU work goes through the scheduler "
        "(sbatch/srun, qsub)",
        "bob: 1 idle allocation, 3.5 idle GPU-hours — ask to release GPUs or use --time",
    )


def test_by_account_job_process(store: Path) -> None:
    data = load_sqlite(str(store), T0, END, 60.0)
    acc = compute(data, "account", POLICY)
    assert rows(acc) == {"phys": (2.0, 1.8, 0.2), "(no account)": (0.0, 0.5, 0.0), "chem": (4.0, 0.0, 3.5)}
    assert {r.key: r.quota_pct for r in acc.rows} == {"phys": 50.0, "(no account)": None, "chem": None}
    job = compute(data, "job", POLICY)
    assert rows(job) == {"1": (2.0, 1.8, 0.2), "(no job)": (0.0, 0.5, 0.0), "2": (2.0, 0.0, 1.5),
                         "3": (2.0, 0.0, 2.0)}
    assert {r.key: r.idle_jobs for r in job.rows} == {"1": 0, "(no job)": 0, "2": 0, "3": 1}
    proc = compute(data, "process", POLICY)
    # a process in no job holds no allocation; job 2 keeps what it held while the miner was on its GPU
    assert rows(proc) == {"python (PID 100, job 1)": (2.0, 1.8, 0.2),
                          "miner (PID 200, no job)": (0.0, 0.5, 0.0),
                          "(no process, job 2)": (2.0, 0.0, 1.5),
                          "(no process, job 3)": (2.0, 0.0, 2.0)}
    assert {r.key: round(r.outside_gpu_hours, 6) for r in proc.rows if r.outside_gpu_hours} == \
        {"miner (PID 200, no job)": 0.5}


def test_the_totals_are_one_computation_whatever_the_grouping(store: Path) -> None:
    """Before: allocated 6.0 GPU-h by user, account and job, 7.0 by process (the miner in no job
    counted as allocated)."""
    data = load_sqlite(str(store), T0, END, 60.0)
    totals = {by: compute(data, by, POLICY).totals for by in ("user", "account", "job", "process")}
    def rounded(t: Totals) -> tuple[float | None, ...]:  # energy_kwh is None without power readings
        return tuple(None if x is None else round(x, 9) for x in t)

    assert {rounded(t) for t in totals.values()} == {rounded(totals["user"])}
    t = totals["process"]
    assert (round(t.allocated_gpu_hours, 6), round(t.used_gpu_hours, 6), round(t.outside_gpu_hours, 6)) == \
        (6.0, 2.3, 0.5)


def test_partial_window_and_user_series(store: Path) -> None:
    # 30 min inside the second hour: G0 90 %, G1 50 % by carol, G2 idle
    data = load_sqlite(str(store), T0 + 4500, T0 + 6300, 60.0)
    report = compute(data, "user", POLICY)
    assert rows(report) == {"alice": (0.5, 0.45, 0.05), "carol": (0.0, 0.25, 0.0), "bob": (1.0, 0.0, 0.75)}
    series = dict(report.user_gpus)
    assert len(series["alice"]) == 30 and {round(x, 6) for x in series["alice"]} == {0.9}
    assert {round(x, 6) for x in series["carol"]} == {0.5}


def test_query_series_shape(store: Path) -> None:
    data = load_sqlite(str(store), T0, END, 600.0)
    assert data.buckets == 12 and data.start == T0
    assert [g.uuid for g in data.gpus] == [G0, G1, G2]
    assert data.gpus[1].util == (0.0,) * 6 + (50.0,) * 6
    miner = next(p for p in data.procs if p.pid == 200)
    assert miner.seen == (0.0,) * 6 + (1.0,) * 6 and miner.util == (None,) * 12
    # a job seen at its last cycle holds its GPUs for that cycle's interval (60 s), as a sample does
    held = END + 60
    assert {(a.job_id, a.devices, a.start, a.end) for a in data.allocations} == {
        ("1", (G0,), T0, held), ("2", (G1,), T0, held), ("3", (G2,), T0, held)}
    assert [v.kind for v in data.violations] == ["rogue"]


def test_mig_devices_count_as_their_fraction() -> None:
    # a GPU split in two MIG devices: the parent is not counted twice; each MIG device weighs 1/2;
    # NVML gives MIG devices no utilisation, so it comes from the process (70 %) or is 0 without one
    gpu, m1, m2 = "GPU-p", "MIG-1", "MIG-2"
    since = 0.0
    data = ReportData("test", since, 3600.0, bucket_start(since, 3600.0), 3600.0,
                      (GpuSeries("n", gpu, gpu, (None,)), GpuSeries("n", m1, gpu, (None,)),
                       GpuSeries("n", m2, gpu, (None,))),
                      (ProcSeries("n", m1, 7, "train", "dora", 5, "9", (1.0,), (70.0,)),),
                      (AllocationSpan("n", "9", "dora", None, (m1,), 0.0, 3600.0),
                       AllocationSpan("n", "10", "eve", None, (m2,), 0.0, 3600.0)), ())
    report = compute(data, "user", POLICY)
    assert rows(report) == {"dora": (0.5, 0.35, 0.15), "eve": (0.5, 0.0, 0.5)}
    assert report.totals.gpus == 1 and report.totals.capacity_gpu_hours == 1.0


def test_unknown_utilisation_is_unmeasured_not_idle() -> None:
    data = ReportData("test", 0.0, 7200.0, 0.0, 3600.0, (GpuSeries("n", "GPU-a", "GPU-a", (None, 40.0)),),
                      (), (AllocationSpan("n", "5", "fay", "x", ("GPU-a",), 0.0, 7200.0),), ())
    r = compute(data, "user", POLICY).rows[0]
    assert (r.allocated_gpu_hours, r.used_gpu_hours, r.unmeasured_gpu_hours) == (2.0, 0.4, 1.0)
    assert round(r.idle_gpu_hours, 6) == 0.6


def test_unknown_by_is_refused() -> None:
    with pytest.raises(ValueError, match="by must be one of"):
        compute(ReportData("t", 0, 60, 0, 60, (), (), (), ()), "team", POLICY)
