"""The monitor attributes a process of a real sbatch job, through Slurm's own cgroup and squeue."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from tests.helpers import slurm_roots
from tests.helpers.slurm_helpers import wait_for_line

from gpuslurm.hw.source import load_node
from gpuslurm.slurm.hookenv import gres_devices

pytestmark = pytest.mark.slurm


@slurm_roots.without_cgroups("the monitor attributes a process by its Slurm job cgroup, which is not made")
def test_a_real_job_process_is_attributed(slurm_cluster, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    node = load_node(os.environ.get("GPUSLURM_BUNDLE", "dgx-h100"))
    mark = slurm_cluster.state_dir / f"monitor-{os.getpid()}.txt"
    job = slurm_cluster.sbatch(["--gres=gpu:1", "--time=2"],
                               f'echo "$$ $SLURM_JOB_GPUS ${{SLURM_JOB_SLUID:-none}}" > {mark}\n'
                               'exec sleep 120\n')
    try:
        pid_text, gpus, sluid = wait_for_line(mark).split()
        pid = int(pid_text)
        cgroup = Path(f"/proc/{pid}/cgroup").read_text()
        expected = gres_devices(node)[int(gpus.split(",")[0])].uuid
        # the job's process on another GPU than its own: what a rogue CUDA_VISIBLE_DEVICES does
        other = next(g.uuid for g in node.gpus if g.uuid != expected)
        scenario = tmp_path / "scenario.json"
        scenario.write_text(json.dumps({"procs": [{"pid": pid, "gpu": expected, "mem_mib": 100},
                                                  {"pid": pid, "gpu": other, "mem_mib": 50}]}))
        config = tmp_path / "gpuslurm.toml"
        # no job maps here (the prolog is not installed in this cluster): squeue fills in
        config.write_text(f'[paths]\nrun_dir = "{tmp_path / "run"}"\nstate_dir = "{tmp_path / "state"}"\n'
                          f'violations_dir = "{tmp_path / "violations"}"\n'
                          f'[monitor]\nnode_name = "{socket.gethostname().split(".")[0]}"\n')
        env = {**slurm_cluster.env, "GPUSLURM_CONFIG": str(config), "GPUSLURM_SCENARIO": str(scenario),
               "GPUSLURM_CAPTURE": os.environ.get("GPUSLURM_BUNDLE", "dgx-h100")}
        out = subprocess.run([sys.executable, "-m", "gpuslurm", "monitor", "--once", "--json",
                              "--db", str(tmp_path / "state" / "monitor.db")],
                             env=env, capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        cycle = json.loads(out.stdout)
    finally:
        subprocess.run(["/usr/bin/scancel", str(job)], env=slurm_cluster.env, check=False)
    # Slurm's own layout, as the monitor reads it: 26.05 names the job by its SLUID unless
    # cgroup.conf says CgroupJobIdPaths=yes (a test that fails if that path reads as "no job")
    release = slurm_roots.selected()
    jobid_paths = os.environ.get("GPUSLURM_CLUSTER_JOBID_PATHS", "").lower() == "yes"
    sluid_layout = release is not None and release.has_jobid_paths and not jobid_paths \
        and slurm_roots.runs_cgroup_v2()
    sluid_dir = sluid if sluid.startswith("s") else f"s{sluid}"  # SLURM_JOB_SLUID's text form: s + 13
    assert (f"/{sluid_dir}/" if sluid_layout else f"job_{job}/") in cgroup, cgroup
    procs = {p["gpu_uuid"]: p for p in cycle["procs"]}
    assert procs[expected]["job_id"] == str(job) and procs[other]["job_id"] == str(job)
    assert procs[expected]["name"] == "sleep" and procs[expected]["user"] == "root"
    allocs = [(a["job_id"], a["source"], a["uuids"]) for a in cycle["allocations"]]
    assert allocs == [(str(job), "squeue", [expected])], cycle["problems"]
    rogue = [json.loads(line) for f in (tmp_path / "violations").iterdir()
             for line in f.read_text().splitlines()]
    assert [(v["kind"], v["pid"], v["gpu_uuid"], v["job_id"]) for v in rogue] == \
        [("rogue", pid, other, str(job))]
