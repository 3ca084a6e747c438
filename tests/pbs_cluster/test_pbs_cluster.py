"""The real OpenPBS test cluster: NUMA vnodes from the bundle, a real user's GPU job, a clean down."""

from __future__ import annotations

import os
import re
import subprocess
import tempfile
from pathlib import Path

import pytest
from tests.helpers.cluster_fixture import _gpuslurm_bin
from tests.helpers.pbs_fixture import PREFIX, STATE_PARENT, PbsCluster, cluster_sh
from tests.helpers.pbs_helpers import BUNDLE, _vnodes

from gpuslurm.gres.pbs_vnodes import plan_vnodes
from gpuslurm.hw.source import load_node

pytestmark = pytest.mark.pbs

NS = "gpuslurm-pbs"


def test_up_status_down_leave_nothing(host_cluster_lock: None, pbs_installed: Path) -> None:
    # A cluster of its own (one namespace name per host): first in this file, so that it runs
    # before the session cluster is brought up.
    if subprocess.run(["ip", "netns", "pids", NS], capture_output=True, check=False).returncode == 0:
        pytest.skip("the session PBS cluster is up; run this test in a session of its own (-k leave_nothing)")
    # Not tmp_path: postgres must enter it, and pbs_mom refuses a home under world-writable /tmp.
    state = Path(tempfile.mkdtemp(prefix="gpuslurm-pbs-down-", dir=STATE_PARENT))
    state.chmod(0o755)
    env = {**os.environ, "GPUSLURM_PBS_DIR": str(state), "GPUSLURM_PBS_USER": "gpuspbs2",
           "GPUSLURM_BIN": _gpuslurm_bin(state)}
    before = set(os.listdir("/dev"))
    up = cluster_sh("up", env)
    try:
        assert up.returncode == 0, up.stderr
        status = cluster_sh("status", env)
        assert status.returncode == 0, status.stdout + status.stderr
        assert "pbshost[0]" in status.stdout
    finally:
        down = cluster_sh("down", env)
    assert down.returncode == 0, down.stderr
    assert not state.exists()
    assert not Path(f"/etc/netns/{NS}").exists()
    assert subprocess.run(["ip", "netns", "pids", NS], capture_output=True, check=False).returncode != 0
    assert subprocess.run(["id", "gpuspbs2"], capture_output=True, check=False).returncode != 0
    assert set(os.listdir("/dev")) <= before


def test_pbsnodes_shows_one_vnode_per_numa_node_as_in_the_bundle(pbs_cluster: PbsCluster) -> None:
    nodes = _vnodes(pbs_cluster.run(str(PREFIX / "bin" / "pbsnodes"), "-av"))
    for vnode in plan_vnodes(load_node(BUNDLE)):
        attrs = nodes[f"pbshost[{vnode.numa_node}]"]
        assert attrs["resources_available.ncpus"] == str(len(vnode.cpus))
        assert attrs["resources_available.ngpus"] == str(len(vnode.gpu_minors))


def test_a_users_gpu_job_runs_on_one_numa_vnode(pbs_cluster: PbsCluster) -> None:
    jobid = pbs_cluster.qsub(["-l", "select=1:ncpus=4:ngpus=2"], "id -un\nls -l /dev/nvidia0\n")
    status = pbs_cluster.wait(jobid)
    assert re.search(r"^\s*Job_Owner = gpuspbs1@", status, re.M)
    assert re.search(r"^\s*Exit_status = 0$", status, re.M), status
    exec_vnode = re.search(r"^\s*exec_vnode = (.+)$", status, re.M)
    assert exec_vnode, status
    # One chunk, placed whole on one NUMA vnode: its CPUs and both GPUs together.
    chunk = exec_vnode.group(1).strip()
    assert re.fullmatch(r"\(pbshost\[\d+\]:ncpus=4:ngpus=2\)", chunk), chunk
