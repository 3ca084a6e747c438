#!/usr/bin/env python3
"""Time the gpuslurm process of the PBS hook's execjob_begin (and execjob_end) against `python -c pass`.

The process runs as plugins/pbs/gpuslurm_hook.py runs it inside pbs_mom: ``python -I -c 'from
gpuslurm.pbs.entry import run; run()' execjob_begin`` with the hook's JSON request on stdin and a
minimal environment (PATH, LANG, GPUSLURM_CONFIG, GPUSLURM_CAPTURE), for a 4-GPU job on one NUMA
vnode of the replayed DGX H100 (``exec_vnode=(pbshost[0]:ncpus=4:ngpus=4)``). execjob_begin reads
the node with its link matrix (the placement ranks GPU sets by it), checks the health of the
vnode's GPUs, chooses 4 under the jobs directory's lock and writes the map; execjob_end runs the
epilog (release check, map removal, summary). run_dir is on a tmpfs (/dev/shm), state_dir on disk,
cgroup_root points nowhere (no devices cgroup: isolation is a few writes on a real node).

Each round runs the floor, the begin and the end of a fresh job id, interleaved so that noise
hits them alike; one untimed begin and end first fill the caches. Prints medians and p90s, the
ratio to the floor and whether "begin <= 3 x floor" holds. No assertion on time.

    python benchmarks/bench_pbs_begin.py [--runs 30] [--ngpus 4] [--clean-venv] [--pbs-python PATH]

--pbs-python also times PBS's embedded interpreter starting a script that does nothing
(``pbs_python FILE``), the cost pbs_mom pays before the hook's own code runs.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_hooks import clean_venv, p90  # the sibling script's helpers

TARGET = 3.0
ENTRY = "from gpuslurm.pbs.entry import run; run()"


def request(event: str, job: int, ngpus: int) -> bytes:
    return json.dumps({"format": 1, "event": event, "hostname": "pbshost", "job_id": f"{job}.pbshost",
                       "euser": "root", "exec_vnode": f"(pbshost[0]:ncpus=4:ngpus={ngpus})",
                       "exec_host": "pbshost/0*4", "vnodes": ["pbshost[0]"], "pbs_cgroups": False}).encode()


def timed(argv: Sequence[str], env: dict[str, str], stdin: bytes = b"") -> float:
    """Wall time of one run; a failing run (or a refusing answer) stops the benchmark."""
    start = time.perf_counter()
    result = subprocess.run(argv, env=env, input=stdin, capture_output=True, check=False, timeout=120)
    elapsed = time.perf_counter() - start
    if result.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} exited {result.returncode}:\n{result.stderr.decode()}")
    if stdin and json.loads(result.stdout).get("accept") is not True:
        raise SystemExit(f"the answer refused the job: {result.stdout.decode()}")
    return elapsed


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--runs", type=int, default=30, help="rounds of floor+begin+end")
    parser.add_argument("--bundle", default="dgx-h100", help="bundle directory or built-in name")
    parser.add_argument("--ngpus", type=int, default=4, help="the job's GPUs on the vnode (1-4)")
    parser.add_argument("--python", default=sys.executable, help="interpreter the hook runs gpuslurm with")
    parser.add_argument("--clean-venv", action="store_true",
                        help="run everything in a throwaway venv whose start runs no .pth hooks")
    parser.add_argument("--pbs-python", metavar="PATH", help="also time PBS's pbs_python starting")
    args = parser.parse_args(argv)
    if args.runs < 1:
        parser.error("--runs must be at least 1")
    if not 1 <= args.ngpus <= 4:
        parser.error("--ngpus must be 1 to 4 (one NUMA vnode of the DGX H100)")

    shm = "/dev/shm" if os.path.isdir("/dev/shm") else None
    with tempfile.TemporaryDirectory(prefix="gpuslurm-bench-pbs-") as tmp, \
            tempfile.TemporaryDirectory(prefix="gpuslurm-bench-pbs-run-", dir=shm) as run_tmp:
        dest = Path(tmp)
        python = clean_venv(dest, args.python) if args.clean_venv else args.python
        config = dest / "gpuslurm.toml"
        config.write_text(f'[paths]\nrun_dir = "{Path(run_tmp) / "run"}"\nstate_dir = "{dest / "state"}"\n'
                          f'cgroup_root = "{dest / "no-cgroup"}"\n')
        env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8",
               "GPUSLURM_CONFIG": str(config), "GPUSLURM_CAPTURE": args.bundle}
        hook = {event: [python, "-I", "-c", ENTRY, event] for event in ("execjob_begin", "execjob_end")}
        floor_cmd = [python, "-c", "pass"]
        job = 1000
        timed(hook["execjob_begin"], env, request("execjob_begin", job, args.ngpus))
        timed(hook["execjob_end"], env, request("execjob_end", job, args.ngpus))
        times: dict[str, list[float]] = {"floor": [], "begin": [], "end": []}
        pbs_python: list[float] = []
        noop = dest / "noop.py"
        noop.write_text("pass\n")
        for _ in range(args.runs):
            job += 1
            times["floor"].append(timed(floor_cmd, dict(os.environ)))
            begin = request("execjob_begin", job, args.ngpus)
            times["begin"].append(timed(hook["execjob_begin"], env, begin))
            times["end"].append(timed(hook["execjob_end"], env, request("execjob_end", job, args.ngpus)))
            if args.pbs_python:
                pbs_python.append(timed([args.pbs_python, str(noop)], dict(os.environ)))
        if leftovers := list((Path(run_tmp) / "run" / "jobs").glob("*.json")):
            raise SystemExit(f"execjob_end left job maps behind: {leftovers}")

    med = {k: statistics.median(v) for k, v in times.items()}
    print(f"bundle {args.bundle}, exec_vnode=(pbshost[0]:ncpus=4:ngpus={args.ngpus}), {args.runs} runs, "
          f"{python}")
    print(f"  python -c pass         median {med['floor'] * 1000:7.1f} ms  "
          f"p90 {p90(times['floor']) * 1000:7.1f} ms")
    for key, label in (("begin", "gpuslurm execjob_begin"), ("end", "gpuslurm execjob_end  ")):
        print(f"  {label} median {med[key] * 1000:7.1f} ms  p90 {p90(times[key]) * 1000:7.1f} ms"
              f"  ratio {med[key] / med['floor']:.2f}")
    if pbs_python:
        print(f"  pbs_python noop.py     median {statistics.median(pbs_python) * 1000:7.1f} ms"
              f"  p90 {p90(pbs_python) * 1000:7.1f} ms")
    ratio = med["begin"] / med["floor"]
    print(f"target execjob_begin <= {TARGET:g} x floor: {'met' if ratio <= TARGET else 'NOT met'} "
          f"({ratio:.2f})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
