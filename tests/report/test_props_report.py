"""The report's invariant on generated stores: used + idle ≤ allocated + outside-Slurm, per user
and in total, whatever the monitor's gaps (started, stopped, restarted mid-bucket), the jobs'
edges and the bucket width. Each store is written through Store.write_cycle and read back by
load_sqlite, raw or rolled up into minutes.

Slack: the store knows a job's span only to the monitor's cycles (from its start to the last cycle
that saw it), while a cycle's sample counts for one interval; so each job may show up to one
interval of use per edge beyond its allocation (``EDGE_H`` per job of the user). That counts
every job the loader returns, also one whose stored span ends exactly at the window's start (seen
last by the cycle at ``since``): it holds no time in the window, so the report does not count it
among the user's jobs, yet that cycle's sample stands for the interval after it.
Budget: 200 examples, about 10 s with CI=1."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuslurm.report.compute import NOBODY, Policy, compute
from gpuslurm.report.query import load_sqlite
from gpuslurm.samples import Allocation, Cycle, GpuSample, ProcSample
from gpuslurm.state.store import Store

T0 = 1_699_999_200.0
EVERY = 10.0  # the monitor's interval
CYCLES = 240  # 40 minutes of cycles
GPUS = ("GPU-00000000-aaaa", "GPU-11111111-bbbb")
USERS = ("alice", "bob")
POLICY = Policy(lambda _u, _a: 1.0, {})
EPS = 1e-9
EDGE_H = 2 * EVERY / 3600

# a job: (user index, GPU index, first cycle, cycles, SM utilisation of its process or None: no process)
jobs = st.tuples(st.integers(0, 1), st.integers(0, 1), st.integers(0, CYCLES - 1), st.integers(1, CYCLES),
                 st.one_of(st.none(), st.integers(0, 100)))
# a process in no job: (user index, GPU index, first cycle, cycles, SM utilisation)
rogues = st.tuples(st.integers(0, 1), st.integers(0, 1), st.integers(0, CYCLES - 1), st.integers(1, CYCLES),
                   st.integers(0, 100))
# the monitor's up periods: (first cycle, cycles); at least 3 cycles each, so the store tells its
# interval (with one sample, a bucket it falls in is taken as covered: nothing says otherwise)
ups = st.lists(st.tuples(st.integers(0, CYCLES - 3), st.integers(3, CYCLES)), min_size=1, max_size=4)


def _store(path: Path, up: list[tuple[int, int]], js: list[tuple[int, int, int, int, int | None]],
           rs: list[tuple[int, int, int, int, int]], base: list[int], rolled: bool) -> None:
    sampled = sorted({i for first, n in up for i in range(first, min(first + n, CYCLES))})
    with Store.open(str(path)) as store:
        for i in sampled:
            ts = T0 + EVERY * i
            procs: list[ProcSample] = []
            allocs = []
            util = [0.0, 0.0]
            for j, (u, g, first, n, sm) in enumerate(js):
                if first <= i < first + n:
                    # the job started before the monitor first saw it (at least one interval)
                    allocs.append(Allocation(str(j + 1), USERS[u], 1000 + u, (GPUS[g],),
                                             T0 + EVERY * (first - 1) - 3.0, "acct"))
                    if sm is not None:
                        procs.append(ProcSample(ts, GPUS[g], 100 + j, name="python", uid=1000 + u,
                                                user=USERS[u], job_id=str(j + 1), sm_util_pct=float(sm),
                                                started=1.0))
                        util[g] += sm
            for k, (u, g, first, n, sm) in enumerate(rs):
                if first <= i < first + n:
                    procs.append(ProcSample(ts, GPUS[g], 500 + k, name="miner", uid=1000 + u, user=USERS[u],
                                            sm_util_pct=float(sm), started=1.0))
                    util[g] += sm
            # a GPU's utilisation: its processes' (capped), else a base load of nobody's
            gpus = tuple(GpuSample(ts, GPUS[g], util_pct=min(util[g], 100.0) if any(
                p.gpu_uuid == GPUS[g] for p in procs) else float(base[g])) for g in range(2))
            store.write_cycle(Cycle(ts, "n1", gpus, tuple(procs), tuple(allocs)))
        if rolled and sampled:
            store.rollup(T0 + EVERY * sampled[-1], raw_window_s=600)


@settings(max_examples=200)
@given(up=ups, js=st.lists(jobs, max_size=4), rs=st.lists(rogues, max_size=2),
       base=st.lists(st.integers(0, 100), min_size=2, max_size=2), rolled=st.booleans(),
       step=st.sampled_from([60.0, 120.0, 300.0, 900.0, 3600.0]),
       edges=st.tuples(st.integers(-60, 2400), st.integers(60, 3000)))
def test_used_and_idle_never_exceed_allocated_and_outside_slurm(
        up: list[tuple[int, int]], js: list[tuple[int, int, int, int, int | None]],
        rs: list[tuple[int, int, int, int, int]], base: list[int], rolled: bool, step: float,
        edges: tuple[int, int]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "monitor.db"
        _store(path, up, js, rs, base, rolled)
        since = T0 + edges[0] * 1.0
        until = since + edges[1]
        try:
            data = load_sqlite(str(path), since, until, step)
        except Exception as exc:  # a window with no sample is refused, nothing else
            assert "no GPU samples between" in str(exc), exc
            return
    by_user = compute(data, "user", POLICY)
    outside: dict[str | None, float] = {}
    for r in compute(data, "process", POLICY).rows:
        if r.job_id is None:
            outside[r.user] = outside.get(r.user, 0.0) + r.used_gpu_hours
    touching: dict[str | None, int] = {}
    for a in data.allocations:
        touching[a.user] = touching.get(a.user, 0) + 1
    for r in by_user.rows:
        key = None if r.key == NOBODY else r.key
        slack = EDGE_H * touching.get(key, 0)
        bound = r.allocated_gpu_hours + outside.get(key, 0.0) + slack + EPS
        assert r.used_gpu_hours + r.idle_gpu_hours <= bound, (r, outside)
        assert r.idle_gpu_hours >= -EPS and r.unmeasured_gpu_hours >= -EPS
    t = by_user.totals
    slack = EDGE_H * len(data.allocations)
    assert t.used_gpu_hours + t.idle_gpu_hours <= t.allocated_gpu_hours + sum(outside.values()) + slack + EPS
    assert t.allocated_gpu_hours <= sum(r.allocated_gpu_hours for r in by_user.rows) + EPS


def test_window_starting_inside_a_rolled_up_minute_keeps_its_jobs() -> None:
    """The residue random runs found (~0.2 s of use with no job): a job seen in one cycle only,
    rolled up into a minute row, and a window starting after that cycle but inside its minute.
    The minute row (counted whole) kept the job's use while the job and its process, cut at the
    exact start, were left out. The window now moves out to the minute's edge for all of them."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "monitor.db"
        _store(path, [(0, CYCLES)], [(0, 0, 100, 1, 50)], [], [0, 0], True)  # alice, cycle 100 only
        since = T0 + 100 * EVERY + 5  # 5 s after the job's one cycle, in the same minute
        data = load_sqlite(str(path), since, since + 600, 60.0)
    assert data.since == T0 + 960 and [a.job_id for a in data.allocations] == ["1"]
    (row,) = compute(data, "user", POLICY).rows
    assert (row.key, row.jobs) == ("alice", 1)
    assert row.used_gpu_hours * 3600 == pytest.approx(5.0)  # one 10 s sample at 50 %
    assert row.used_gpu_hours + row.idle_gpu_hours <= row.allocated_gpu_hours + EPS


def test_processes_all_at_zero_percent_are_not_given_the_device_busy_time() -> None:
    """The other residue: every process on the device reports 0 % SM, the device shows a little
    load (someone else's); that load went to the processes as if their use were unknown. Now it
    goes to the jobs holding the device, else to nobody."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "monitor.db"
        # alice's job on GPU 0 seen by the first of three cycles, its process at 0 %; a 1 % base
        _store(path, [(0, 3)], [(0, 0, 0, 1, 0)], [], [1, 0], False)
        data = load_sqlite(str(path), T0, T0 + 60, 60.0)
    rows = {r.key: r for r in compute(data, "user", POLICY).rows}
    # the job holds the device for its one cycle's interval: at most that sample's 1 % × 10 s is
    # its; the rest is nobody's; none of it is its 0 % process's as if its use were unknown
    alice = rows["alice"].used_gpu_hours * 3600 if "alice" in rows else 0.0
    assert alice <= 0.1 + 1e-9
    assert (alice + rows[NOBODY].used_gpu_hours * 3600) == pytest.approx(0.2)  # 1 % × two 10 s samples
    procs = compute(data, "process", POLICY).rows
    assert all(r.used_gpu_hours == 0.0 for r in procs if r.pid is not None)
