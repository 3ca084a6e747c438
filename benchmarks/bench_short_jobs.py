#!/usr/bin/env python3
"""Short jobs in the real test cluster: gpuslurm's hooks against PrologFlags alone, A/B.

One one-node cluster (docker-slurm/cluster.sh, the host's Slurm 22.05 unless
GPUSLURM_SLURM_RELEASE names a root; the emulated DGX H100) with ``PrologFlags=Alloc,Contain`` in
both arms, which is what `gpuslurm install` asks for. The arms differ only in slurm.conf's
``Prolog=``, ``Epilog=`` and ``TaskProlog=`` lines (the executables `gpuslurm install` writes,
the bundle and a config baked in), applied with ``scontrol reconfigure`` before each batch:

* ``hooks``: gpuslurm's prolog, epilog and task prolog;
* ``flags``: no gpuslurm hook at all;
* ``site`` (with ``--site-arm``): the same hooks started as before ``-S`` (``python -I``, with
  ``site`` and its ``.pth`` files, no sys.path written);
* ``served`` (with ``--server-arm``): the same hooks with ``gpuslurm hook-server`` running for
  them (docs/hooks.md, "The hook server"): the prolog and the epilog are its clients;
* ``served-c`` (with ``--c-client-arm``): as ``served``, the hooks installed with
  ``--c-client`` (the prolog and the epilog start the C client);
* ``before`` (with ``--before-python PY``): the hooks installed with another Python, e.g. a venv
  whose gpuslurm is an older checkout (``git archive main src``), for before/after in one run.

(The arm without any PrologFlags is slower for a reason of its own, Slurm's scheduling cadence,
so it is not the baseline.) A batch is ``--jobs`` one-GPU ``true`` jobs (``sbatch --gres=gpu:1``,
root's), timed from the first submission until the last has left squeue; its rate is jobs per
second. Each round runs one batch of each arm, each arm first in turn, so that the machine's
load (other work on it) hits them alike; the figure is the median over rounds of the ratio
hooks rate / flags rate, with its spread (min, max). Each batch is checked: its arm's hooks must
leave one summary per job, the other arms' none.

With ``--tasks N`` each round also times an ``srun -n N`` step of a one-GPU job in each arm
(``--steps`` steps, inside one job, timed in the job with ``date``): the difference of the two
medians is the task prolog's cost per step (N task prologs; slurmstepd starts them in parallel).

Runs as root, takes the test cluster's host lock (it waits while a test session holds it), and
stops the cluster at the end. No assertion on time: the figures are for people to read.

    python benchmarks/bench_short_jobs.py [--jobs 40] [--rounds 10] [--tasks 16] [--steps 5]
        [--site-arm] [--server-arm] [--c-client-arm] [--before-python PY] [--json F]
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.helpers.cluster_fixture import (  # noqa: E402  (needs ROOT on the path)
    CLUSTER_SH,
    LOCK_PATH,
    SBATCH,
    SlurmCluster,
    _gpuslurm_bin,
    _use_release,
    install_hooks,
)
from tests.helpers.slurm_helpers import (  # noqa: E402
    NodeControl,
    conf_with,
    hook_lines,
    hooks_paths,
    hooks_root,
    short_hostname,
)

SQUEUE = "/usr/bin/squeue"


class Bench(NodeControl):
    node_timeout = 60

    def __init__(self, cluster: SlurmCluster, node: str) -> None:
        self.cluster = cluster
        self.node = node


def cluster_sh(command: str, env: dict[str, str]) -> None:
    done = subprocess.run(["/bin/bash", str(CLUSTER_SH), command], env=env, capture_output=True, text=True,
                          timeout=180, check=False)
    if done.returncode != 0:
        raise SystemExit(f"cluster.sh {command} failed ({done.returncode}): {done.stderr}{done.stdout}")


def batch(cluster: SlurmCluster, jobs: int) -> float:
    """Seconds from the first submission of ``jobs`` one-GPU ``true`` jobs until none is left."""
    out = cluster.state_dir / "jobs"
    start = time.monotonic()
    ids = set()
    for _ in range(jobs):
        done = subprocess.run([SBATCH, "--parsable", "--gres=gpu:1", f"--output={out}/bench-%j.out",
                               "--wrap", "true"], env=cluster.env, capture_output=True, text=True,
                              timeout=30, check=True)
        ids.add(done.stdout.strip().split(";")[0])
    listed = ",".join(sorted(ids))
    while True:
        left = subprocess.run([SQUEUE, "-h", "-j", listed, "-o", "%i"], env=cluster.env, capture_output=True,
                              text=True, timeout=30, check=False).stdout.split()
        if not left:
            return time.monotonic() - start
        time.sleep(0.05)


def step_times(cluster: SlurmCluster, tasks: int, steps: int) -> list[float]:
    """Seconds of each of ``steps`` ``srun -n TASKS true`` steps inside one one-GPU job."""
    script = (f"for i in $(seq {steps}); do s=$(date +%s.%N); srun -n {tasks} true; e=$(date +%s.%N); "
              'echo "STEP $s $e"; done\n')
    jobid = cluster.sbatch(["--gres=gpu:1", f"-n{tasks}"], script)
    state = cluster.wait(jobid, timeout=300)
    text = cluster.output(jobid)
    if state != "COMPLETED":
        raise SystemExit(f"step job {jobid} {state}: {text}\n{cluster.log_tail()}")
    return [float(e) - float(s) for line in text.splitlines() if line.startswith("STEP ")
            for s, e in [line.split()[1:3]]]


def start_with_site(prefix: Path) -> None:
    """Make the installed hooks start as before issue 22's ``-S``: ``python -I -c '...'``, with
    ``site`` (site-packages and its ``.pth`` start-up code) and no sys.path of their own."""
    for hook in ("gpuslurm-prolog", "gpuslurm-task-prolog", "gpuslurm-epilog"):
        path = prefix / hook
        text = path.read_text()
        new = re.sub(r" -S -c 'import sys; sys\.path \+= \[[^]]*\]; ", " -c '", text)
        if new == text:
            raise SystemExit(f"{path}: no -S start to replace")
        path.write_text(new)


def start_server(sock: Path) -> subprocess.Popen[str]:
    """``gpuslurm hook-server`` for the served arm, where slurmd runs (in the release's root, if
    any), on the socket `gpuslurm install` wrote into that arm's prolog and epilog."""
    from tests.helpers import slurm_roots

    python = sys.executable if slurm_roots.active() is None else slurm_roots.VENV_PYTHON
    argv = [python, "-m", "gpuslurm", "hook-server", "--socket", str(sock)]
    proc = subprocess.Popen(slurm_roots.on_node(argv), stderr=subprocess.PIPE, text=True)
    assert proc.stderr is not None
    line = proc.stderr.readline()
    if "serving" not in line:
        raise SystemExit(f"gpuslurm hook-server did not start: {line}{proc.stderr.read()}")
    return proc


def summaries(root: Path) -> int:
    jobs = root / "state" / "jobs"
    return len(list(jobs.glob("*-summary.json"))) if jobs.is_dir() else 0


def spread(values: list[float]) -> str:
    return (f"median {statistics.median(values):.3f} (min {min(values):.3f}, max {max(values):.3f}, "
            f"n={len(values)})")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--jobs", type=int, default=40)
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--tasks", type=int, default=16, help="srun -n TASKS step (0: none)")
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--json", type=Path, help="write the raw figures here")
    ap.add_argument("--before-python", help="a third arm: the hooks installed with this Python "
                    "(e.g. a venv whose gpuslurm is another checkout, to compare versions)")
    ap.add_argument("--site-arm", action="store_true",
                    help="an arm whose installed hooks start `python -I` with site, as before -S")
    ap.add_argument("--server-arm", action="store_true",
                    help="an arm whose prolog and epilog are served by `gpuslurm hook-server`")
    ap.add_argument("--c-client-arm", action="store_true",
                    help="an arm served as --server-arm's, its hooks installed with --c-client")
    args = ap.parse_args(argv)
    if os.geteuid() != 0:
        raise SystemExit("bench_short_jobs: run as root (it starts a Slurm cluster)")
    with open(LOCK_PATH, "a") as lock:
        print("waiting for the test cluster's host lock ...", file=sys.stderr)
        fcntl.flock(lock, fcntl.LOCK_EX)
        return run(args)


def run(args: argparse.Namespace) -> int:
    state_dir = Path(tempfile.mkdtemp(prefix="gpuslurm-bench-cluster-"))
    state_dir.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "SBATCH_"))}
    env.update(GPUSLURM_CLUSTER_DIR=str(state_dir), GPUSLURM_BIN=_gpuslurm_bin(state_dir),
               GPUSLURM_CLUSTER_PROLOG_FLAGS="Alloc,Contain")
    _use_release(env, state_dir)
    cluster = SlurmCluster(state_dir, {**env, "SLURM_CONF": str(state_dir / "etc" / "slurm.conf")})
    pythons = {"hooks": None, **({"site": None} if args.site_arm else {}),
               **({"served": None} if args.server_arm else {}),
               **({"served-c": None} if args.c_client_arm else {}),
               **({"before": args.before_python} if args.before_python else {})}
    arms = (*pythons, "flags")
    roots: dict[str, Path] = {}
    servers: list[subprocess.Popen[str]] = []
    try:
        cluster_sh("up", env)
        plain = cluster.conf.read_text()
        confs = {"flags": plain}
        for arm, python in pythons.items():
            roots[arm], bundle = hooks_root(f"gpuslurm-bench-{arm}-")
            config = roots[arm] / "gpuslurm.toml"
            config.write_text(hooks_paths(roots[arm], cluster) + "[hooks]\ncommand_timeout_s = 20\n")
            prefix = install_hooks(roots[arm], config, bundle, python, c_client=arm == "served-c")
            if arm == "site":
                start_with_site(prefix)
            if arm.startswith("served"):
                servers.append(start_server(roots[arm] / "run" / "hooks.sock"))
            confs[arm] = conf_with(plain, hook_lines(prefix))
        bench = Bench(cluster, short_hostname())
        rates: dict[str, list[float]] = {arm: [] for arm in arms}
        steps: dict[str, list[float]] = {arm: [] for arm in arms}
        ratios: dict[str, list[float]] = {arm: [] for arm in pythons}
        for rnd in range(args.rounds):
            order = arms[rnd % len(arms):] + arms[:rnd % len(arms)]  # each arm first in turn
            got = {}
            for arm in order:
                cluster.conf.write_text(confs[arm])
                bench.scontrol("reconfigure")
                bench.wait_node(r"^IDLE")
                before = {a: summaries(r) for a, r in roots.items()}
                seconds = batch(cluster, args.jobs)
                for other, root in roots.items():
                    made, want = summaries(root) - before[other], args.jobs if other == arm else 0
                    if made != want:
                        raise SystemExit(f"round {rnd} arm {arm}: {made} summaries from {other}'s hooks, "
                                         f"expected {want}:\n{cluster.log_tail()}")
                got[arm] = args.jobs / seconds
                rates[arm].append(got[arm])
                if args.tasks:
                    steps[arm] += step_times(cluster, args.tasks, args.steps)
            for arm in pythons:
                ratios[arm].append(got[arm] / got["flags"])
            print(f"round {rnd + 1:2d} ({'/'.join(order)}): "
                  + ", ".join(f"{arm} {got[arm]:.2f} jobs/s" for arm in arms)
                  + "; ratios " + ", ".join(f"{arm} {ratios[arm][-1]:.3f}" for arm in pythons),
                  file=sys.stderr, flush=True)
        print(f"{args.jobs} one-GPU `true` jobs per batch, {args.rounds} rounds of {len(arms)} arms "
              f"({', '.join(arms)}; the order rotating)")
        for arm in arms:
            print(f"  {arm:6s} rate (jobs/s): {spread(rates[arm])}")
        for arm in pythons:
            print(f"  {arm}/flags rate ratio: {spread(ratios[arm])}")
        if args.tasks:
            for arm in arms:
                print(f"  srun -n {args.tasks} step, {arm:6s} (s): {spread(steps[arm])}")
            for arm in pythons:
                cost = statistics.median(steps[arm]) - statistics.median(steps["flags"])
                print(f"  {arm}: task prologs per step: {cost:.3f} s (difference of the medians)")
        if args.json:
            args.json.write_text(json.dumps({"jobs": args.jobs, "rates": rates, "ratios": ratios,
                                             "tasks": args.tasks, "steps": steps}, indent=1))
        return 0
    finally:
        for server in servers:
            server.terminate()
            print(server.communicate(timeout=60)[1].strip().splitlines()[-1], file=sys.stderr)
        cluster_sh("down", env)
        for root in roots.values():
            shutil.rmtree(root, ignore_errors=True)
        if not os.environ.get("GPUSLURM_KEEP_CLUSTER"):
            shutil.rmtree(state_dir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
