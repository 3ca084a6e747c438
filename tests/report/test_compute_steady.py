"""compute's shortcut for the common bucket (one job holding all of it, one of its processes seen
throughout) counts exactly what the general path counts: the same report, to the last bit."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuslurm.report import compute as compute_mod
from gpuslurm.report.compute import Policy, compute
from gpuslurm.report.data import AllocationSpan, GpuSeries, ProcSeries, ReportData, Sparse

STEP = 60.0
N = 40
SINCE = 1_700_000_000.0 // 60 * 60 + 13.0  # the first bucket clipped


@st.composite
def _data(draw: st.DrawFn) -> ReportData:
    gpus, allocs, procs = [], [], []
    for g in range(draw(st.integers(1, 3))):
        uuid = f"GPU-{g}"
        util = tuple(draw(st.none() | st.sampled_from([0.0, 35.5, 80.5, 100.0])) for _ in range(N))
        cover = tuple(draw(st.sampled_from([1.0, 0.5])) for _ in range(N))
        gpus.append(GpuSeries("n1", uuid, uuid, util, cover))
        t = SINCE + draw(st.integers(0, 300))
        for j in range(draw(st.integers(0, 4))):
            length = draw(st.integers(30, 900))
            job = f"{g}{j}"
            user = draw(st.sampled_from(["alice", "bob"]))
            allocs.append(AllocationSpan("n1", job, user, "acct", (uuid,), float(t), float(t + length)))
            b0 = int((t - SINCE // STEP * STEP) // STEP)
            b1 = min(N - 1, b0 + length // 60)
            if b0 < N and draw(st.booleans()):
                seen = [draw(st.sampled_from([1.0, 1.0, 0.5])) for _ in range(b0, b1 + 1)]
                sm = [draw(st.none() | st.just(20.0)) for _ in range(b0, b1 + 1)]
                procs.append(ProcSeries("n1", uuid, 100 + j, "python", user, None, job,
                                        Sparse(N, b0, seen, 0.0), Sparse(N, b0, sm, None)))
            t += length + draw(st.integers(0, 200))
    start = SINCE // STEP * STEP
    return ReportData("test", SINCE, start + N * STEP, start, STEP, tuple(gpus), tuple(procs),
                      tuple(allocs), ())


@settings(max_examples=60, deadline=None)
@given(_data(), st.sampled_from(["user", "account", "job"]))
def test_the_shortcut_counts_what_the_general_path_counts(data: ReportData, by: str) -> None:
    policy = Policy(quota_of=lambda user, account: 0.3, account_quotas={})
    fast = compute(data, by, policy)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(compute_mod, "STEADY", False)
        slow = compute(data, by, policy)
    assert fast == slow
