#!/usr/bin/env python3
"""Time `gpuslurm gres-conf --from dgx-h100` as a whole process against `python -c pass`.

Both run in the same session, interleaved, so machine noise hits them alike. Prints the medians
and their ratio; the target is a ratio of at most 3. A third line times `import click, jinja2`
alone: the part of the cost that belongs to the two libraries the command is built on, so the
figure for gpuslurm's own code is the difference. Run it with the interpreter of a clean venv
(`.venv/bin/python benchmarks/bench_gres_conf.py`): an interpreter whose site-packages run
startup hooks (.pth files) has a slower floor and flatters the ratio.

    python3 benchmarks/bench_gres_conf.py [--runs 30]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path


def _time(argv: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run(argv, check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - start


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--bundle", default="dgx-h100", help="bundle directory or built-in name")
    args = parser.parse_args()

    floor_cmd = [sys.executable, "-c", "pass"]
    # The console script an admin runs, beside this interpreter (a venv's bin/, not a PATH shim).
    script = Path(sys.executable).parent / "gpuslurm"
    prog = [str(script)] if script.is_file() else [sys.executable, "-m", "gpuslurm"]
    gres_cmd = [*prog, "gres-conf", "--from", args.bundle]
    _time(gres_cmd)  # warm the page cache and .pyc files once
    libs_cmd = [sys.executable, "-c", "import click, jinja2"]
    floor, gres, libs = [], [], []
    for _ in range(args.runs):
        floor.append(_time(floor_cmd))
        gres.append(_time(gres_cmd))
        libs.append(_time(libs_cmd))
    f, g, lib = statistics.median(floor), statistics.median(gres), statistics.median(libs)
    print(f"python -c pass        median {f * 1000:7.1f} ms  ({args.runs} runs)")
    print(f"import click, jinja2  median {lib * 1000:7.1f} ms  (ratio {lib / f:.2f}: the libraries alone)")
    print(f"gpuslurm gres-conf    median {g * 1000:7.1f} ms  ({' '.join(gres_cmd)})")
    print(f"ratio                 {g / f:7.2f}   (target <= 3)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
