#!/usr/bin/env python3
"""How often Slurm gives a GPU job CPUs on its GPUs' sockets: gpuslurm's gres.conf vs no Cores=.

Runs the real test cluster (docker-slurm/cluster.sh, an emulated DGX H100: 8 GPUs, 2 sockets of
56 cores x 2 threads) twice: once with the gres.conf gpuslurm generates, once with the same file
with every Cores= removed. Each time the same seeded workload of 1/2/4/8-GPU batch jobs, each
asking for CPUs with --cpus-per-gpu, is submitted at once; every job records Slurm's allocation
(`scontrol -d show job`: CPU_IDs and GRES IDX) from inside itself. With gpuslurm's gres.conf the
workload also runs a second time with --gres-flags=enforce-binding (Slurm treats Cores= only as
a preference without it). The cluster's cgroup.conf has ConstrainCores=no and this host has
far fewer CPUs than the emulated node, so the process's own affinity says nothing: Slurm's
allocation is what is measured.

Only one test cluster can run per host: this takes the same host lock as the test fixture
(tests/helpers/cluster_fixture.py) and waits for it. Runs as root, like the cluster. --use-running
SLURM_CONF measures one workload on a cluster that is already up instead (its own gres.conf).

    python benchmarks/bench_numa_affinity.py [--jobs 40] [--seed 1] [--binding both]
"""

from __future__ import annotations

import argparse
import fcntl
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CLUSTER_SH = ROOT / "docker-slurm" / "cluster.sh"
LOCK_PATH = "/run/lock/gpuslurm-test-cluster.lock"  # the one tests/helpers/cluster_fixture.py takes
SBATCH = "/usr/bin/sbatch"
SCONTROL = "/usr/bin/scontrol"
SQUEUE = "/usr/bin/squeue"
SIZES = {1: 4, 2: 3, 4: 2, 8: 1}  # GPUs per job -> weight in the workload

DEFINITION = """\
metric: a job is socket-affine when every CPU Slurm allocated it lies on a socket that at least
  one of its GPUs is attached to (CPU sockets ⊆ GPU sockets). A GPU's socket comes from the
  bundle (the sockets of the CPUs in its CPU affinity); GRES index k is the k-th GPU in PCI bus
  order, as in gres.conf. A CPU's socket is its id in scontrol -d CPU_IDs (Slurm's abstract
  ids: socket by socket, core by core, thread by thread) divided by the CPUs per socket
  (CoresPerSocket x ThreadsPerCore of the node). An 8-GPU job spans both sockets and is
  affine whatever CPUs it gets; "single-socket jobs" counts only jobs whose GPUs share one
  socket, the ones where placement can go wrong. "CPUs near" is the share of all allocated
  CPUs that are on one of their job's GPU sockets."""

JOB_SCRIPT = """#!/bin/bash
# Record Slurm's allocation for this job, then hold it for a while ($1 seconds).
echo "BENCH_GPUS=${SLURM_JOB_GPUS:-}"
/usr/bin/scontrol -d show job "$SLURM_JOB_ID" | /bin/grep -E 'CPU_IDs=' | /bin/sed 's/^/BENCH_ALLOC /'
/bin/sleep "$1"
"""


@dataclass(frozen=True)
class JobSpec:
    gpus: int
    cpus_per_gpu: int
    seconds: float


@dataclass(frozen=True)
class Allocation:
    job_id: int
    spec: JobSpec
    gres_indices: tuple[int, ...]
    cpu_ids: tuple[int, ...]


@dataclass(frozen=True)
class Geometry:
    sockets: int
    cpus_per_socket: int


def parse_ranges(text: str) -> tuple[int, ...]:
    out: set[int] = set()
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        out.update(range(int(lo), int(hi or lo) + 1))
    return tuple(sorted(out))


def workload(jobs: int, seed: int, cpus_choices: Sequence[int],
             seconds: tuple[float, float]) -> list[JobSpec]:
    """The fixed mixed workload: sizes weighted towards small jobs, seeded."""
    rng = random.Random(seed)
    sizes = [s for s, w in SIZES.items() for _ in range(w)]
    return [JobSpec(rng.choice(sizes), rng.choice(list(cpus_choices)),
                    round(rng.uniform(*seconds), 1)) for _ in range(jobs)]


def parse_job_output(job_id: int, spec: JobSpec, text: str) -> Allocation:
    """The allocation a job recorded: CPU_IDs and GRES IDX, else SLURM_JOB_GPUS for the GPUs."""
    cpus: tuple[int, ...] = ()
    gpus: tuple[int, ...] = ()
    env_gpus = ""
    for line in text.splitlines():
        if line.startswith("BENCH_GPUS="):
            env_gpus = line.split("=", 1)[1].strip()
        elif line.startswith("BENCH_ALLOC "):
            if m := re.search(r"\bCPU_IDs=(\S+)", line):
                cpus = parse_ranges(m.group(1))
            if m := re.search(r"\(IDX:([0-9,-]+)\)", line):
                gpus = parse_ranges(m.group(1))
    if not gpus and env_gpus:
        gpus = parse_ranges(env_gpus)
    if not cpus or not gpus:
        raise ValueError(f"job {job_id} recorded no allocation:\n{text}")
    return Allocation(job_id, spec, gpus, cpus)


def gpu_sockets(bundle: str) -> dict[int, frozenset[int]]:
    """GRES index -> the sockets of the GPU's affine CPUs, from the bundle."""
    from gpuslurm.hw.source import load_node

    node = load_node(bundle, links=False)
    socket_of = {c.os_id: c.socket for c in node.cpus}
    out = {}
    for k, gpu in enumerate(sorted(node.gpus, key=lambda g: g.bus_id)):
        sockets = frozenset(socket_of[c] for c in gpu.cpu_affinity if c in socket_of)
        if not sockets:
            raise SystemExit(f"bundle {bundle}: GPU {gpu.index} has no CPU affinity")
        out[k] = sockets
    return out


def affinity_summary(allocs: Sequence[Allocation], sockets_of_gpu: dict[int, frozenset[int]],
                     geometry: Geometry) -> dict[str, tuple[int, int]]:
    """Counts (hits, total) for: all jobs, single-socket jobs, CPUs near their GPUs."""
    jobs = single = single_hit = hit = near = cpus = 0
    for a in allocs:
        g_sockets = frozenset().union(*(sockets_of_gpu[i] for i in a.gres_indices))
        c_sockets = [c // geometry.cpus_per_socket for c in a.cpu_ids]
        affine = set(c_sockets) <= g_sockets
        jobs += 1
        hit += affine
        if len(g_sockets) == 1:
            single += 1
            single_hit += affine
        near += sum(s in g_sockets for s in c_sockets)
        cpus += len(c_sockets)
    return {"jobs": (hit, jobs), "single": (single_hit, single), "cpus": (near, cpus)}


# --- the cluster ---------------------------------------------------------------------------------


def run(argv: Sequence[str], env: dict[str, str], timeout: float = 60) -> str:
    result = subprocess.run(list(argv), env=env, capture_output=True, text=True, timeout=timeout,
                            check=False)
    if result.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} exited {result.returncode}: {result.stderr.strip()}")
    return result.stdout


def gpuslurm_bin() -> str:
    explicit = os.environ.get("GPUSLURM_BIN")
    beside = Path(sys.executable).parent / "gpuslurm"
    if explicit:
        return explicit
    if os.access(beside, os.X_OK):
        return str(beside)
    raise SystemExit(f"no gpuslurm executable beside {sys.executable}: set GPUSLURM_BIN")


def gres_confs(dest: Path, bundle: str, host: str, env: dict[str, str]) -> tuple[Path, Path]:
    """gpuslurm's gres.conf for this host, and the same file without any Cores=."""
    with_cores = dest / "gres-cores.conf"
    run([gpuslurm_bin(), "gres-conf", "--from", bundle, "--node-name", host, "--output",
         str(with_cores)], env)
    text = with_cores.read_text()
    lines = [line if line.lstrip().startswith("#") else re.sub(r"\s+Cores=\S+", "", line)
             for line in text.splitlines()]
    if not any("Cores=" in line for line in text.splitlines() if not line.lstrip().startswith("#")):
        raise SystemExit(f"{with_cores} has no Cores= to remove")
    without = dest / "gres-no-cores.conf"
    without.write_text("\n".join(["# gpuslurm's gres.conf with every Cores= removed", *lines]) + "\n")
    return with_cores, without


@contextmanager
def host_lock() -> Iterator[None]:
    with open(LOCK_PATH, "a") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            print(f"waiting for {LOCK_PATH} (another test cluster is up)", file=sys.stderr, flush=True)
            fcntl.flock(lock, fcntl.LOCK_EX)
        yield


@contextmanager
def cluster(state: Path, bundle: str, gres_conf: Path) -> Iterator[dict[str, str]]:
    """A running cluster with ``gres_conf``; the environment for its clients. Always taken down."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "SBATCH_"))}
    env.update(GPUSLURM_CLUSTER_DIR=str(state), GPUSLURM_BUNDLE=bundle, GPUSLURM_BIN=gpuslurm_bin(),
               GPUSLURM_CLUSTER_GRES_CONF=str(gres_conf))
    state.mkdir(mode=0o755)
    try:
        run(["/bin/bash", str(CLUSTER_SH), "up"], env, timeout=180)
        yield {**env, "SLURM_CONF": str(state / "etc" / "slurm.conf")}
    finally:
        down = subprocess.run(["/bin/bash", str(CLUSTER_SH), "down"], env=env, capture_output=True,
                              text=True, timeout=180, check=False)
        if down.returncode != 0:
            print(f"cluster.sh down failed:\n{down.stderr}", file=sys.stderr)


def node_geometry(env: dict[str, str]) -> Geometry:
    text = run([SCONTROL, "-o", "show", "node"], env)
    fields = dict(re.findall(r"(\w+)=(\S+)", text.splitlines()[0]))
    sockets = int(fields["Sockets"])
    per_socket = int(fields["CoresPerSocket"]) * int(fields["ThreadsPerCore"])
    return Geometry(sockets, per_socket)


def run_workload(env: dict[str, str], jobs: Sequence[JobSpec], flags: Sequence[str], work: Path,
                 timeout: float) -> list[Allocation]:
    """Submit every job at once, wait for all of them, and read what each recorded."""
    work.mkdir(parents=True, exist_ok=True)
    work.chmod(0o755)
    script = work / "job.sh"
    script.write_text(JOB_SCRIPT)
    script.chmod(0o755)
    submitted: dict[int, JobSpec] = {}
    for spec in jobs:
        out = run([SBATCH, "--parsable", f"--output={work}/%j.out", f"--gres=gpu:{spec.gpus}",
                   f"--cpus-per-gpu={spec.cpus_per_gpu}", *flags, str(script), str(spec.seconds)], env)
        submitted[int(out.strip().split(";")[0])] = spec
    ids = ",".join(map(str, submitted))
    deadline = time.monotonic() + timeout
    while run([SQUEUE, "-h", "-j", ids, "-o", "%i"], env).strip():
        if time.monotonic() > deadline:
            pending = run([SQUEUE, "-h", "-j", ids, "-o", "%i %T %r"], env)
            raise SystemExit(f"jobs still queued after {timeout:.0f} s:\n{pending}")
        time.sleep(0.5)
    return [parse_job_output(j, spec, (work / f"{j}.out").read_text()) for j, spec in submitted.items()]


def report(label: str, allocs: Sequence[Allocation], sockets_of_gpu: dict[int, frozenset[int]],
           geometry: Geometry, elapsed: float, verbose: bool) -> None:
    s = affinity_summary(allocs, sockets_of_gpu, geometry)

    def pct(key: str) -> str:
        hit, total = s[key]
        return f"{hit}/{total} = {hit / total:6.1%}" if total else "n/a"

    print(f"{label}  ({elapsed:.0f} s)")
    print(f"  socket-affine jobs      {pct('jobs')}")
    print(f"  single-socket jobs      {pct('single')}")
    print(f"  CPUs near their GPUs    {pct('cpus')}")
    if verbose:
        from gpuslurm.ranges import format_ranges

        for a in allocs:
            g = sorted(set().union(*(sockets_of_gpu[i] for i in a.gres_indices)))
            c = sorted({cpu // geometry.cpus_per_socket for cpu in a.cpu_ids})
            print(f"    job {a.job_id:4d} gpu:{a.spec.gpus} x{a.spec.cpus_per_gpu:3d} cpus  "
                  f"IDX {format_ranges(a.gres_indices):7} sockets {g}  CPU_IDs {format_ranges(a.cpu_ids):24} "
                  f"sockets {c}")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--jobs", type=int, default=40, help="jobs in the workload")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--cpus-per-gpu", default="8,16,28",
                        help="choices for each job's --cpus-per-gpu (28 fills a DGX socket)")
    parser.add_argument("--seconds", default="1,3", help="each job holds its allocation MIN,MAX s")
    parser.add_argument("--binding", choices=("default", "enforce", "both"), default="both",
                        help="with gpuslurm's gres.conf: default placement, enforce-binding, or both")
    parser.add_argument("--bundle", default="dgx-h100", help="the node the cluster emulates")
    parser.add_argument("--timeout", type=float, default=120, help="seconds one workload may take")
    parser.add_argument("--use-running", metavar="SLURM_CONF",
                        help="measure on this running cluster (its gres.conf) instead of starting two")
    parser.add_argument("--dry-run", action="store_true", help="print the workload and stop")
    parser.add_argument("--verbose", action="store_true", help="one line per job")
    parser.add_argument("--keep", action="store_true", help="keep the state directory (logs, outputs)")
    args = parser.parse_args(argv)
    try:
        cpus_choices = [int(x) for x in args.cpus_per_gpu.split(",")]
        lo, hi = (float(x) for x in args.seconds.split(","))
    except ValueError:
        parser.error("--cpus-per-gpu takes N,N,... and --seconds takes MIN,MAX")
    if args.jobs < 1 or min(cpus_choices) < 1 or not 0 <= lo <= hi:
        parser.error("--jobs and every --cpus-per-gpu must be at least 1, and 0 <= MIN <= MAX")

    jobs = workload(args.jobs, args.seed, cpus_choices, (lo, hi))
    counts = {size: sum(j.gpus == size for j in jobs) for size in SIZES}
    print(f"workload: {args.jobs} jobs (seed {args.seed}): "
          + ", ".join(f"{n} x {size} GPU" for size, n in counts.items())
          + f"; --cpus-per-gpu from {cpus_choices}; {lo:g}-{hi:g} s each")
    print(DEFINITION)
    if args.dry_run:
        for j in jobs:
            print(f"  --gres=gpu:{j.gpus} --cpus-per-gpu={j.cpus_per_gpu}  sleep {j.seconds:g}")
        return 0
    sockets_of_gpu = gpu_sockets(args.bundle)
    enforce = ["--gres-flags=enforce-binding"]

    if args.use_running:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "SBATCH_"))}
        env["SLURM_CONF"] = args.use_running
        work = Path(tempfile.mkdtemp(prefix="gpuslurm-bench-numa-"))
        try:
            start = time.monotonic()
            allocs = run_workload(env, jobs, [], work / "running", args.timeout)
            report("running cluster, default placement", allocs, sockets_of_gpu, node_geometry(env),
                   time.monotonic() - start, args.verbose)
        finally:
            if not args.keep:
                shutil.rmtree(work, ignore_errors=True)
        return 0

    if os.geteuid() != 0:
        raise SystemExit("the test cluster needs root")
    with host_lock():
        root = Path(tempfile.mkdtemp(prefix="gpuslurm-bench-numa-"))
        root.chmod(0o755)
        try:
            host = run(["/bin/hostname", "-s"], dict(os.environ)).strip()
            with_cores, without = gres_confs(root, args.bundle, host, dict(os.environ))
            runs: list[tuple[str, Path, list[tuple[str, list[str]]]]] = []
            bindings: list[tuple[str, list[str]]] = []
            if args.binding in ("default", "both"):
                bindings.append(("default placement", []))
            if args.binding in ("enforce", "both"):
                bindings.append(("enforce-binding", enforce))
            runs.append(("gpuslurm gres.conf (Cores=)", with_cores, bindings))
            runs.append(("gres.conf without Cores=", without, [("default placement", [])]))
            for n, (label, conf, variants) in enumerate(runs):
                with cluster(root / f"cluster{n}", args.bundle, conf) as env:
                    geometry = node_geometry(env)
                    for m, (variant, flags) in enumerate(variants):
                        start = time.monotonic()
                        allocs = run_workload(env, jobs, flags, root / f"work{n}-{m}", args.timeout)
                        report(f"{label}, {variant}", allocs, sockets_of_gpu, geometry,
                               time.monotonic() - start, args.verbose)
        finally:
            if args.keep:
                print(f"kept {root}", file=sys.stderr)
            else:
                shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
