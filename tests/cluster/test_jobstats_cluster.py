"""``gpuslurm jobstats`` on a real sbatch job: the monitor attributes the job through Slurm's
squeue and cgroup, stores two cycles, leaves the job's file for its owner, and jobstats shows
the job's GPU and process from the store."""

from __future__ import annotations

import json
import os
import socket
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
from tests.helpers import slurm_roots
from tests.helpers.slurm_helpers import wait_for_line

from gpuslurm.hw.source import load_node
from gpuslurm.slurm.hookenv import gres_devices

pytestmark = pytest.mark.slurm


@slurm_roots.without_cgroups("the monitor attributes a process by its Slurm job cgroup, which is not made")
def test_jobstats_of_a_real_job(slurm_cluster, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    bundle = os.environ.get("GPUSLURM_BUNDLE", "dgx-h100")
    node = load_node(bundle)
    mark = slurm_cluster.state_dir / f"jobstats-{os.getpid()}.txt"
    job = slurm_cluster.sbatch(["--gres=gpu:1", "--time=2"],
                               f'echo "$$ $SLURM_JOB_GPUS" > {mark}\nexec sleep 120\n')
    state = tmp_path / "state"
    config = tmp_path / "gpuslurm.toml"
    config.write_text(f'[paths]\nrun_dir = "{tmp_path / "run"}"\nstate_dir = "{state}"\n'
                      f'violations_dir = "{tmp_path / "violations"}"\n'
                      f'[monitor]\nnode_name = "{socket.gethostname().split(".")[0]}"\n')
    try:
        pid_text, gpus = wait_for_line(mark).split()
        gpu = gres_devices(node)[int(gpus.split(",")[0])].uuid
        scenario = tmp_path / "scenario.json"
        scenario.write_text(json.dumps({"procs": [{"pid": int(pid_text), "gpu": gpu, "mem_mib": 3000}],
                                        "gpus": {gpu: {"util": 0, "mem_mib": 3000, "power_w": 90}}}))
        env = {**slurm_cluster.env, "GPUSLURM_CONFIG": str(config), "GPUSLURM_SCENARIO": str(scenario),
               "GPUSLURM_CAPTURE": bundle}
        for _ in range(2):
            out = subprocess.run([sys.executable, "-m", "gpuslurm", "monitor", "--once"], env=env,
                                 capture_output=True, text=True, timeout=60)
            assert out.returncode == 0, out.stderr
            time.sleep(1.1)
        done = subprocess.run([sys.executable, "-m", "gpuslurm", "jobstats", str(job), "--json"], env=env,
                              capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        doc = json.loads(done.stdout)
        missing = subprocess.run([sys.executable, "-m", "gpuslurm", "jobstats", "4000000000"], env=env,
                                 capture_output=True, text=True, timeout=60)
    finally:
        subprocess.run(["/usr/bin/scancel", str(job)], env=slurm_cluster.env, check=False)
    assert (doc["job"]["id"], doc["job"]["source"], doc["job"]["running"]) == (str(job), "squeue", True)
    assert [g["uuid"] for g in doc["gpus"]] == [gpu] and doc["gpus"][0]["samples"] == 2
    assert doc["gpus"][0]["util_mean_pct"] == 0.0 and doc["gpus"][0]["mem_peak_mib"] >= 3000.0
    assert [(p["pid"], p["name"]) for p in doc["processes"]] == [(int(pid_text), "sleep")]
    assert missing.returncode == 2
    assert missing.stderr.strip() == \
        "gpuslurm: job 4000000000: not in this node's monitor store, or not yours"
    f = (state / "jobstats" / f"{job}.json").stat()  # the job's own file: root's, its owner is root here
    assert (doc["job"]["uid"], f.st_uid, stat.S_IMODE(f.st_mode)) == (0, 0, 0o400)
