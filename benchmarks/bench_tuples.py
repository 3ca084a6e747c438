#!/usr/bin/env python3
"""Is ``gpuslurm.tuples`` (the home-made NamedTuple) still worth keeping? Whole-process figures.

Issue 20 asks to keep it only if its milliseconds still count. This times the two processes where
start-up matters and which make gpuslurm's NamedTuple classes: ``gpuslurm pick`` (in every job
script) and the hooks' light path (the prolog's imports, as the installed executable loads them).
Each runs twice, interleaved with the floor (``python -c pass``): as shipped, and with
``gpuslurm.tuples.NamedTuple`` replaced by ``typing.NamedTuple`` before any gpuslurm module is
imported (what removing tuples.py would give: ``typing`` imported, and each class made by it).
Medians of ``--runs`` runs after one warm-up; the difference is the figure to quote.

    python benchmarks/bench_tuples.py [--runs 30]
"""

from __future__ import annotations

import argparse
import compileall
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import gpuslurm

PICK = ("from gpuslurm.cli.fast import main; "
        "sys.argv = ['gpuslurm', 'pick', '4', '--from', 'dgx-h100', '--format', 'json']; main()")
HOOKS = "import gpuslurm.hooks.prolog, gpuslurm.hooks.epilog, gpuslurm.hooks.taskprolog"
WITH_TYPING = "import typing, gpuslurm.tuples as t; t.NamedTuple = typing.NamedTuple; "


def run(code: str, env: dict[str, str]) -> float:
    start = time.perf_counter()
    subprocess.run([sys.executable, "-c", code], check=True, stdout=subprocess.DEVNULL, env=env)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=30)
    opts = parser.parse_args()
    compileall.compile_dir(str(Path(gpuslurm.__file__).parent), quiet=1)  # as installed
    cache = tempfile.mkdtemp(prefix="bench-tuples-")
    env = {**os.environ, "XDG_CACHE_HOME": cache}  # pick's bundle cache, warmed by the first run
    commands = {
        "floor (python -c pass)": "pass",
        "pick, gpuslurm.tuples": "import sys; " + PICK,
        "pick, typing.NamedTuple": "import sys; " + WITH_TYPING + PICK,
        "hook imports, gpuslurm.tuples": HOOKS,
        "hook imports, typing.NamedTuple": WITH_TYPING + HOOKS,
    }
    times: dict[str, list[float]] = {name: [] for name in commands}
    for _ in range(opts.runs + 1):
        for name, code in commands.items():
            times[name].append(run(code, env))
    med = {name: statistics.median(samples[1:]) * 1000 for name, samples in times.items()}
    print(f"whole process, wall ms, median of {opts.runs} (Python {sys.version.split()[0]})")
    for name, value in med.items():
        print(f"  {name:34}: {value:6.1f}")
    for what in ("pick", "hook imports"):
        gain = med[f"{what}, typing.NamedTuple"] - med[f"{what}, gpuslurm.tuples"]
        print(f"  {what}: gpuslurm.tuples saves {gain:.1f} ms a process")


if __name__ == "__main__":
    main()
