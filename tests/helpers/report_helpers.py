"""A small store with hand-computable GPU-hours, written through Store.write_cycle.

Node n1, three GPUs, one cycle a minute from T0 to T0 + 2 h (121 cycles; the last, at T0 + 2 h,
lies on the window's end and is outside ``[T0, T0 + 2 h)``):

- G0: job 1 (alice, account phys), process python PID 100 in the job, utilisation 90 % throughout.
- G1: job 2 (bob, account chem). First hour 0 % and no process; second hour 50 %, busy with
  miner PID 200 of carol, in no job (a rogue finding is stored for it).
- G2: job 3 (bob, chem), 0 % throughout, no process: an idle allocation.

Over [T0, T0 + 2 h): capacity 6 GPU-h; allocated 2 + 2 + 2; used alice 1.8, carol 0.5, bob 0;
idle alice 0.2, bob 1 + 0.5 + 2 = 3.5.
"""

from __future__ import annotations

from pathlib import Path

from gpuslurm.config import ShareDetect
from gpuslurm.policy.share import Quotas
from gpuslurm.report.compute import Policy
from gpuslurm.samples import Allocation, Cycle, GpuSample, ProcSample, Violation
from gpuslurm.state.store import Store

T0 = 1_699_999_200.0  # a whole hour
G0, G1, G2 = "GPU-00000000-aaaa", "GPU-11111111-bbbb", "GPU-22222222-cccc"
HOURS = 2
END = T0 + HOURS * 3600
ROGUE = Violation("rogue", "n1", "carol", None, 200, "miner", G1, T0 + 3600, 3600.0,
                  "miner (PID 200) uses GPU-11111111-bbbb but is in no job")
CONFIG = """
[detect.share]
threshold_pct = 80.0
users = { alice = 0.2 }
accounts = { phys = 0.5 }
"""


def cycles() -> list[Cycle]:
    allocs = (Allocation("1", "alice", 1001, (G0,), T0, "phys"),
              Allocation("2", "bob", 1002, (G1,), T0, "chem"),
              Allocation("3", "bob", 1002, (G2,), T0, "chem"))
    out = []
    for i in range(HOURS * 60 + 1):
        ts = T0 + 60 * i
        second_hour = i >= 60
        gpus = (GpuSample(ts, G0, util_pct=90.0, mem_used_mib=1000.0, mem_total_mib=80000.0),
                GpuSample(ts, G1, util_pct=50.0 if second_hour else 0.0, mem_total_mib=80000.0),
                GpuSample(ts, G2, util_pct=0.0, mem_total_mib=80000.0))
        procs = [ProcSample(ts, G0, 100, name="python", uid=1001, user="alice", job_id="1",
                            mem_mib=1000.0, started=T0 - 5)]
        if second_hour:
            procs.append(ProcSample(ts, G1, 200, name="miner", uid=1003, user="carol", mem_mib=500.0,
                                    started=T0 + 3590))
        out.append(Cycle(ts, "n1", gpus, tuple(procs), allocs))
    return out


def make_store(path: Path, rolled: bool = False) -> Path:
    """Write the cycles; with ``rolled``, fold the first hour into minute rows as the monitor would."""
    with Store.open(str(path)) as store:
        cs = cycles()
        for c in cs:
            store.write_cycle(c, [ROGUE] if c.ts == END else [])
        if rolled:
            store.rollup(END, raw_window_s=3600)
    return path


POLICY = Policy(Quotas(ShareDetect(users=(("alice", 0.2),), accounts=(("phys", 0.5),))).of,
                {"phys": 0.5}, busy_pct=80.0, idle_pct=5.0)
