#!/usr/bin/env python3
"""CPU time of the hog detectors per monitor cycle, for 8 GPUs and 64 processes.

Every detector is on and has work: eight jobs of four users (one GPU each), fair-share quotas low
enough that every user is tracked, a few rogue processes, and windows full (the default 30 min
idle window at a 10 s interval holds 180 samples per key). Prints microseconds of CPU per cycle
(the median of several runs); the monitor's whole budget, attribution included, is 2 ms.

    python3 benchmarks/bench_detect.py [--cycles 2000] [--per-gpu 8] [--interval 10]
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

from gpuslurm.config import parse_config
from gpuslurm.policy.detect import Detector
from gpuslurm.samples import Allocation, Cycle, GpuSample, ProcSample

USERS = ("alice", "bob", "carol", "dave")


def _cycles(n: int, per_gpu: int, interval: float, seed: int = 1) -> list[Cycle]:
    rng = random.Random(seed)
    gpus = [f"GPU-{i:08x}-0000-0000-0000-000000000000" for i in range(8)]
    allocs = tuple(Allocation(str(800 + i), USERS[i % 4], 1000 + i % 4, (g,), 0.0, "physics")
                   for i, g in enumerate(gpus))
    out = []
    for k in range(n):
        ts = 1.7e9 + k * interval
        samples = tuple(GpuSample(ts, g, None, rng.choice((0.0, 3.0, 95.0, 99.0)), 1e4, 8e4, 300.0, 60.0)
                        for g in gpus)
        procs = []
        for i, g in enumerate(gpus):
            a = allocs[i]
            for j in range(per_gpu):
                rogue = j == per_gpu - 1 and i % 4 == 0  # two GPUs carry a stray process
                procs.append(ProcSample(ts, g, 10000 + i * 100 + j, None, "python", a.uid,
                                        "eve" if rogue else a.user, None if rogue else a.job_id, 900.0,
                                        None, None))
        out.append(Cycle(ts, "gpu-node-01", samples, tuple(procs), allocs))
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cycles", type=int, default=2000)
    parser.add_argument("--per-gpu", type=int, default=8, help="processes per GPU (8 → 64 in all)")
    parser.add_argument("--interval", type=float, default=10.0, help="seconds between cycles")
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()

    cfg = parse_config("[detect.share]\ndefault_quota = 0.1\n", "bench").detect
    cycles = _cycles(args.cycles, args.per_gpu, args.interval)
    warm = int(cfg.idle.window_s / args.interval) + 10  # fill the windows before timing
    per_cycle = []
    for _ in range(args.runs):
        det = Detector(cfg)
        for c in cycles[:warm]:
            det.feed(c)
        start = time.process_time()
        for c in cycles[warm:]:
            det.feed(c)
        per_cycle.append((time.process_time() - start) / (len(cycles) - warm))
    found = det.violations
    print(f"8 GPUs x {8 * args.per_gpu} processes: {statistics.median(per_cycle) * 1e6:.0f} us CPU per cycle "
          f"(median of {args.runs} runs of {len(cycles) - warm} cycles; {len(found)} violations now, "
          f"{det.state_size()} samples and keys held)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
