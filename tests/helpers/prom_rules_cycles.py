"""Three nodes' cycles for the report read from the 5-minute rules, and their store's report
data (the truth): jobs that end and start inside buckets, a device busy without a job, a window
not on the scrapes' grid (tests/prometheus/test_prom_rules_report.py, test_prom_users_report.py)."""

from __future__ import annotations

from pathlib import Path

from gpuslurm.report.compute import Policy
from gpuslurm.report.data import ReportData
from gpuslurm.report.query import load_sqlite
from gpuslurm.samples import Allocation, Cycle, GpuSample, ProcSample
from gpuslurm.state.store import Store

RULES = Path(__file__).resolve().parents[2] / "packaging" / "gpuslurm-rules.yml"
HOUR = 1_699_999_200.0  # a whole hour (and a multiple of 5 minutes)
T0 = HOUR + 7  # cycles 7 s off every 5-minute edge
EVERY = 30.0
STEP = 600.0  # two of the rules' 5 minutes
SINCE, UNTIL = HOUR + 450.0, HOUR + 6 * 3600 + 390.0  # neither on a bucket's edge
NODES = ("n1", "n2.x", "n3")
POLICY = Policy(quota_of=lambda user, account: 0.5, account_quotas={})


def cycles(node: str, k: int) -> list[Cycle]:
    """Two GPUs for 6.5 h: on G0 alice's job then carol's, on G1 bob's job then none (busy anyway);
    utilisation changing every cycle."""
    g0, g1 = f"GPU-{node}-0", f"GPU-{node}-1"
    jobs = [(Allocation(f"{k}1", "alice", 1001, (g0,), T0, "phys"), 2 * 3600 + 10 * k),
            (Allocation(f"{k}2", "bob", 1002, (g1,), T0 + 600, "chem"), 4 * 3600 + 20 * k),
            (Allocation(f"{k}3", "carol", 1003, (g0,), T0 + 3 * 3600, "chem"), 6.4 * 3600)]
    out = []
    for i in range(int(6.5 * 3600 / EVERY)):
        ts = T0 + EVERY * i
        allocs = tuple(a for a, last in jobs if a.start <= ts <= a.start + last)
        gpus = (GpuSample(ts, g0, util_pct=float((i * 13 + k) % 101), mem_total_mib=80000.0),
                GpuSample(ts, g1, util_pct=float((i * 7) % 101), mem_total_mib=80000.0))
        procs = tuple(ProcSample(ts, a.uuids[0], 100 + int(a.job_id), name="python", uid=a.uid,
                                 user=a.user, job_id=a.job_id, mem_mib=1000.0) for a in allocs)
        out.append(Cycle(ts, node, gpus, procs, allocs))
    return out


def cluster() -> list[Cycle]:
    return [c for k, node in enumerate(NODES) for c in cycles(node, k)]


def truth(tmp_path: Path) -> ReportData:
    with Store.open(str(tmp_path / "monitor.db")) as store:
        for c in cluster():
            store.write_cycle(c)
    return load_sqlite(str(tmp_path / "monitor.db"), SINCE, UNTIL, STEP)
