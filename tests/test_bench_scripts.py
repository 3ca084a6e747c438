"""Smoke tests of the benchmark scripts: arguments, parsing, the metric, and tiny real runs.

Nothing here looks at how long anything took: the scripts print figures for people to read.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from tests.helpers.cluster_fixture import SlurmCluster

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"


def load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, BENCH / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up while the class is built
    spec.loader.exec_module(module)
    return module


def script(name: str, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(BENCH / f"{name}.py"), *args], capture_output=True,
                          text=True, timeout=timeout, check=False)


# --- bench_hooks -------------------------------------------------------------------------------


def test_bench_hooks_tiny_run() -> None:
    run = script("bench_hooks", "--runs", "2", "--gpus", "0,1")
    assert run.returncode == 0, run.stderr
    lines = run.stdout.splitlines()
    assert lines[0].startswith("bundle dgx-h100, SLURM_JOB_GPUS=0,1, 2 runs")
    assert [line.split(" median ")[0].strip() for line in lines[1:5]] == [
        "python -c pass", "gpuslurm prolog", "gpuslurm task-prolog", "gpuslurm epilog"]
    assert "ratio" in lines[2] and all(" CPU median " in line for line in lines[1:5])
    assert lines[5].startswith("CPU of the three hooks per job: median ")
    assert lines[6].startswith("target prolog <= 3 x floor: ")


def test_bench_hooks_with_site_times_the_hooks_started_as_before() -> None:
    run = script("bench_hooks", "--runs", "1", "--gpus", "0", "--with-site")
    assert run.returncode == 0, run.stderr
    names = [line.split(" median ")[0].strip() for line in run.stdout.splitlines()[1:8]]
    assert names[4:] == ["gpuslurm prolog (site)", "gpuslurm task-prolog (site)", "gpuslurm epilog (site)"]
    assert "CPU of the three hooks per job (site): median " in run.stdout


def test_bench_hooks_stops_on_a_failing_hook() -> None:
    run = script("bench_hooks", "--runs", "1", "--gpus", "9")  # dgx-h100 has no GPU 9
    assert run.returncode != 0
    assert "gpuslurm-prolog exited 2" in run.stderr and "GPU index 9" in run.stderr


def test_bench_hooks_rejects_zero_runs() -> None:
    run = script("bench_hooks", "--runs", "0")
    assert run.returncode == 2 and "--runs must be at least 1" in run.stderr


@pytest.mark.skipif(os.geteuid() != 0, reason="the job map and its directories are root's")
def test_bench_pbs_begin_tiny_run() -> None:
    run = script("bench_pbs_begin", "--runs", "2", "--ngpus", "2")
    assert run.returncode == 0, run.stderr
    lines = run.stdout.splitlines()
    assert lines[0].startswith("bundle dgx-h100, exec_vnode=(pbshost[0]:ncpus=4:ngpus=2), 2 runs")
    assert [line.split(" median ")[0].strip() for line in lines[1:4]] == [
        "python -c pass", "gpuslurm execjob_begin", "gpuslurm execjob_end"]
    assert lines[-1].startswith("target execjob_begin <= 3 x floor: ")


# --- bench_numa_affinity: pure parts ----------------------------------------------------------


@pytest.fixture(scope="module")
def numa() -> ModuleType:
    return load("bench_numa_affinity")


def test_workload_is_seeded_and_mixed(numa: ModuleType) -> None:
    jobs = numa.workload(40, 1, [8, 16, 28], (1.0, 3.0))
    assert jobs == numa.workload(40, 1, [8, 16, 28], (1.0, 3.0))
    assert jobs != numa.workload(40, 2, [8, 16, 28], (1.0, 3.0))
    assert {j.gpus for j in jobs} == {1, 2, 4, 8}
    assert {j.cpus_per_gpu for j in jobs} == {8, 16, 28}
    assert all(1.0 <= j.seconds <= 3.0 for j in jobs)


def test_parse_job_output(numa: ModuleType) -> None:
    spec = numa.JobSpec(2, 8, 1.0)
    text = ("BENCH_GPUS=4,6\nBENCH_ALLOC      Nodes=vm CPU_IDs=112-119,168-175 Mem=0 "
            "GRES=gpu:nvidia_h100_80gb_hbm3:2(IDX:4,6)\n")
    alloc = numa.parse_job_output(7, spec, text)
    assert alloc.gres_indices == (4, 6)
    assert alloc.cpu_ids == (*range(112, 120), *range(168, 176))
    # After the job ends Slurm drops the IDX; the job's own SLURM_JOB_GPUS is used then.
    alloc = numa.parse_job_output(7, spec, "BENCH_GPUS=0-1\nBENCH_ALLOC Nodes=vm CPU_IDs=0-3 GRES=\n")
    assert alloc.gres_indices == (0, 1)
    with pytest.raises(ValueError, match="job 7 recorded no allocation"):
        numa.parse_job_output(7, spec, "BENCH_GPUS=0\n")


def test_affinity_metric(numa: ModuleType) -> None:
    sockets = numa.gpu_sockets("dgx-h100")
    assert sockets == {k: frozenset({k // 4}) for k in range(8)}
    geometry = numa.Geometry(sockets=2, cpus_per_socket=112)
    spec = numa.JobSpec(1, 8, 1.0)
    allocs = [
        numa.Allocation(1, spec, (0,), tuple(range(0, 8))),  # GPU and CPUs on socket 0
        numa.Allocation(2, spec, (5,), (*range(0, 4), *range(112, 116))),  # half on the wrong socket
        numa.Allocation(3, spec, (0, 7), (*range(0, 4), *range(112, 116))),  # spans both: affine
        numa.Allocation(4, spec, (4,), tuple(range(0, 8))),  # socket-1 GPU, socket-0 CPUs
    ]
    summary = numa.affinity_summary(allocs, sockets, geometry)
    assert summary == {"jobs": (2, 4), "single": (1, 3), "cpus": (8 + 4 + 8 + 0, 32)}


@pytest.mark.parametrize("args", [["--seconds", "3,1"], ["--cpus-per-gpu", "0"], ["--seconds", "x"],
                                  ["--jobs", "0"]])
def test_numa_bad_arguments(args: list[str]) -> None:
    run = script("bench_numa_affinity", "--dry-run", *args)
    assert run.returncode == 2 and "error:" in run.stderr


def test_numa_dry_run_prints_the_workload_and_definition() -> None:
    run = script("bench_numa_affinity", "--dry-run", "--jobs", "5", "--seed", "3")
    assert run.returncode == 0, run.stderr
    assert run.stdout.startswith("workload: 5 jobs (seed 3): ")
    assert "socket-affine" in run.stdout
    assert sum(line.startswith("  --gres=gpu:") for line in run.stdout.splitlines()) == 5


# --- bench_numa_affinity in the real cluster ---------------------------------------------------


@pytest.mark.slurm
def test_numa_tiny_run_in_the_session_cluster(slurm_cluster: SlurmCluster) -> None:
    # The session cluster uses gpuslurm's gres.conf, whose Cores= keep each job on its GPUs' socket.
    run = script("bench_numa_affinity", "--use-running", str(slurm_cluster.conf), "--jobs", "3",
                 "--seed", "5", "--seconds", "0,0.3", "--cpus-per-gpu", "4", "--timeout", "60",
                 "--verbose", timeout=120)
    assert run.returncode == 0, run.stderr + run.stdout
    assert "running cluster, default placement" in run.stdout
    assert "socket-affine jobs      3/3 = 100.0%" in run.stdout, run.stdout
    assert sum(" IDX " in line for line in run.stdout.splitlines()) == 3
