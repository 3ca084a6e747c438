#!/usr/bin/env python3
"""Time the placement engine in-process, and `gpuslurm pick` as a whole process against `python -c pass`.

Engine: ``place()`` on the replayed DGX H100 (8 GPUs, choose 1-8, idle and with load), and on the
same node with every GPU cut into 7 MIG devices (56 devices, choose 4, 8, 16, with five busy per
GPU so the walk must look across GPUs); median and max of many calls (targets 1 ms and 50 ms).
Process: `gpuslurm pick 4 --from dgx-h100 --format json` through the installed executable (the
light dispatcher, no click) and `python -m gpuslurm pick ...`, interleaved with the floor
(`python -c pass`), median of each and the ratio (target 3); with the parsed bundle in the
caller's cache (a fresh $XDG_CACHE_HOME, warmed by the first, uncounted run) and without one.

    python benchmarks/bench_pick.py [--calls 300] [--runs 20]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from gpuslurm.hw.model.node import MigDevice
from gpuslurm.hw.source import load_node
from gpuslurm.place.engine import DeviceState, place
from gpuslurm.place.request import Request

VENV_BIN = Path(sys.executable).parent


def timed(fn, calls: int) -> tuple[float, float]:  # type: ignore[no-untyped-def]
    samples = []
    for _ in range(calls):
        t = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t)
    return statistics.median(samples) * 1000, max(samples) * 1000


def engine(calls: int) -> None:
    node = load_node("dgx-h100")
    busy = {g.uuid: DeviceState(util_pct=10.0 * g.index, mem_used_mib=4000.0 * g.index) for g in node.gpus}
    print("engine, dgx-h100 (8 GPUs), ms per place() call: median / max")
    for n in (1, 2, 4, 8):
        for label, states in (("idle", {}), ("loaded", busy)):
            med, worst = timed(lambda n=n, states=states: place(node, Request(n), states), calls)
            print(f"  choose {n} {label:6}: {med:.3f} / {worst:.3f}")
    gpus = tuple(g._replace(mig_mode=True, mig_devices=tuple(
        MigDevice(i, i + 1, 0, "1g.10gb", 9856, f"MIG-{g.index}-{i}") for i in range(7))) for g in node.gpus)
    big = node._replace(gpus=gpus)
    taken = {f"MIG-{g}-{i}": DeviceState(foreign_procs=1) for g in range(8) for i in range(5)}
    print("engine, 8 GPUs x 7 MIG = 56 devices, ms per place() call: median / max")
    for n in (4, 8, 16):
        for label, states in (("idle", {}), ("5/GPU busy", taken)):
            if label != "idle" and n > 16:
                continue
            req = Request(n, mig_profile="1g.10gb", exclusive=True)
            med, worst = timed(lambda req=req, states=states: place(big, req, states), max(calls // 10, 10))
            print(f"  choose {n:2} {label:10}: {med:.3f} / {worst:.3f}")


def whole(runs: int) -> None:
    # Byte-compile first, as an installed package is: with PYTHONDONTWRITEBYTECODE set (or a
    # read-only tree) every run would otherwise compile the modules edited since the last .pyc.
    import compileall

    import gpuslurm

    compileall.compile_dir(str(Path(gpuslurm.__file__).parent), quiet=1)
    args = ["pick", "4", "--from", "dgx-h100", "--format", "json"]
    exe = str(VENV_BIN / "gpuslurm")
    commands = {"floor (python -c pass)": [sys.executable, "-c", "pass"],
                "gpuslurm pick (executable)": [exe, *args],
                "python -m gpuslurm pick": [sys.executable, "-m", "gpuslurm", *args],
                "gpuslurm pick, no cache": [exe, *args],
                "load_node alone (a parse)": [
                    sys.executable, "-c", "from gpuslurm.hw.source import load_node; load_node('dgx-h100')"]}
    cache = tempfile.mkdtemp(prefix="bench-pick-")  # the caller's own cache, warmed by the first run
    env = {**os.environ, "XDG_CACHE_HOME": cache}
    no_cache = {k: v for k, v in env.items() if k not in ("XDG_CACHE_HOME", "HOME")}
    times: dict[str, list[float]] = {k: [] for k in commands}
    for _ in range(runs + 1):
        for name, cmd in commands.items():
            t = time.perf_counter()
            run_env = no_cache if "no cache" in name else env
            subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, env=run_env)
            times[name].append(time.perf_counter() - t)
    shutil.rmtree(cache)
    floor = statistics.median(times["floor (python -c pass)"][1:])
    print("whole process, `gpuslurm pick 4 --from dgx-h100 --format json`, wall ms: median (ratio to floor)")
    for name, samples in times.items():
        med = statistics.median(samples[1:])
        print(f"  {name:28}: {med * 1000:6.1f} ({med / floor:.2f}x)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--runs", type=int, default=20)
    opts = parser.parse_args()
    engine(opts.calls)
    whole(opts.runs)


if __name__ == "__main__":
    main()
