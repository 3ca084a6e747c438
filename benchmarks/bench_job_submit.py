#!/usr/bin/env python3
"""sbatch submission rate through the real slurmctld with plugins/job_submit.lua and a throttle
file of 10,000 throttled users, against the same cluster without the plugin, in one run.

It starts the test cluster (docker-slurm/cluster.sh, under the host-wide lock the tests use),
then alternates rounds without and with the plugin (``scontrol reconfigure`` between them), so
that machine noise hits both alike. In each round a non-throttled user (root) submits held jobs
(``--hold``: the node is never the bottleneck) from several parallel sbatch processes; the jobs
are cancelled after the round. While the plugin is on, the throttle file is rewritten every
``--churn`` seconds so the figure includes the plugin re-parsing 10,000 lines. Prints the median
rate of each side and their ratio; the target is a ratio of at least 0.95. Needs root.

    python3 benchmarks/bench_job_submit.py [--jobs 500] [--rounds 5] [--workers 8]
"""

from __future__ import annotations

import argparse
import fcntl
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from gpuslurm.policy.throttle import Throttle  # noqa: E402
from gpuslurm.slurm.throttle import write_throttle_file  # noqa: E402

CLUSTER_SH = ROOT / "docker-slurm" / "cluster.sh"
PLUGIN = ROOT / "plugins" / "job_submit.lua"
LOCK_PATH = "/run/lock/gpuslurm-test-cluster.lock"
SBATCH, SCONTROL, SCANCEL = "/usr/bin/sbatch", "/usr/bin/scontrol", "/usr/bin/scancel"


def _throttles(n: int) -> list[Throttle]:
    now = int(time.time())
    return [Throttle(f"bench{i:05d}", now + 3600, ("reject", "cap", "priority")[i % 3],
                     (0, 1, 1000)[i % 3], now, "hpc-support@example.org", f"benchmark throttle {i}")
            for i in range(n)]


def _run(argv: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120, check=False)


def _round(env: dict[str, str], jobs: int, workers: int) -> float:
    """Submit ``jobs`` held jobs from ``workers`` parallel sbatch processes; jobs per second."""
    argv = [SBATCH, "--parsable", "--hold", "--chdir=/tmp", "--output=/dev/null", "--wrap", "true"]

    def one(_: int) -> None:
        proc = _run(argv, env)
        if proc.returncode != 0:
            raise RuntimeError(f"sbatch failed: {proc.stderr.strip()}")

    start = time.perf_counter()
    with ThreadPoolExecutor(workers) as pool:
        list(pool.map(one, range(jobs)))
    rate = jobs / (time.perf_counter() - start)
    _run([SCANCEL, "--user=root"], env)
    return rate


def _set_plugin(conf: Path, original: str, on: bool, env: dict[str, str]) -> None:
    text = original.replace("\nNodeName=", "\nJobSubmitPlugins=lua\nNodeName=", 1) if on else original
    conf.write_text(text)
    proc = _run([SCONTROL, "reconfigure"], env)
    if proc.returncode != 0:
        raise RuntimeError(f"scontrol reconfigure failed: {proc.stderr.strip()}")
    time.sleep(1.0)


def _churn(path: Path, throttles: list[Throttle], stop: threading.Event, every: float) -> None:
    while not stop.wait(every):
        write_throttle_file(str(path), throttles)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=500, help="submissions per round")
    parser.add_argument("--rounds", type=int, default=5, help="rounds per side, interleaved")
    parser.add_argument("--workers", type=int, default=8, help="parallel sbatch processes")
    parser.add_argument("--users", type=int, default=10_000, help="throttled users in the file")
    parser.add_argument("--churn", type=float, default=2.0,
                        help="rewrite the throttle file every SECONDS while the plugin is on (0: never)")
    args = parser.parse_args()
    if os.geteuid() != 0:
        print("bench_job_submit: needs root (the test cluster runs slurmd and munged)", file=sys.stderr)
        return 2

    lock = open(LOCK_PATH, "a")  # noqa: SIM115 - held for the whole run, like the test fixture
    fcntl.flock(lock, fcntl.LOCK_EX)
    state = Path(tempfile.mkdtemp(prefix="gpuslurm-bench-"))
    state.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "SBATCH_"))}
    env["GPUSLURM_CLUSTER_DIR"] = str(state)
    gpuslurm = Path(sys.executable).parent / "gpuslurm"
    if gpuslurm.exists():
        env.setdefault("GPUSLURM_BIN", str(gpuslurm))
    conf = state / "etc" / "slurm.conf"
    client = {**env, "SLURM_CONF": str(conf)}
    try:
        up = _run(["/bin/bash", str(CLUSTER_SH), "up"], env)
        if up.returncode != 0:
            print(f"cluster.sh up failed:\n{up.stderr}", file=sys.stderr)
            return 1
        original = conf.read_text()
        throttles = _throttles(args.users)
        throttle_file = conf.parent / "gpuslurm-throttle"
        write_throttle_file(str(throttle_file), throttles)
        (conf.parent / "job_submit.lua").write_text(PLUGIN.read_text())
        rates: dict[bool, list[float]] = {False: [], True: []}
        _round(client, 20, args.workers)  # warm up slurmctld and the page cache
        for _ in range(args.rounds):
            for on in (False, True):
                _set_plugin(conf, original, on, client)
                if on:
                    _round(client, 5, 1)  # the first submission loads the 10,000-line file
                stop = threading.Event()
                churn = threading.Thread(target=_churn, args=(throttle_file, throttles, stop, args.churn),
                                         daemon=True)
                if on and args.churn > 0:
                    churn.start()
                try:
                    rates[on].append(_round(client, args.jobs, args.workers))
                finally:
                    stop.set()
                    if churn.is_alive():
                        churn.join()
        log = (state / "log" / "slurmctld.log").read_text(errors="replace")
        loaded = f"{args.users} user(s) throttled" in log
        off, on_ = statistics.median(rates[False]), statistics.median(rates[True])
        each = {side: ", ".join(f"{r:.1f}" for r in rates[side]) for side in rates}
        print(f"without plugin: median {off:8.1f} jobs/s  rounds {each[False]}")
        print(f"with plugin:    median {on_:8.1f} jobs/s  rounds {each[True]}"
              f"  ({args.users} throttled users{'' if loaded else ', NOT seen loaded in the log'})")
        print(f"ratio with/without: {on_ / off:.3f}  (target >= 0.95; {args.jobs} jobs x {args.rounds} "
              f"rounds per side, {args.workers} parallel sbatch)")
        return 0 if loaded else 1
    finally:
        _run(["/bin/bash", str(CLUSTER_SH), "down"], env)
        if not os.environ.get("GPUSLURM_KEEP_CLUSTER"):
            subprocess.run(["/bin/rm", "-rf", str(state)], check=False)
        lock.close()


if __name__ == "__main__":
    sys.exit(main())
