"""gres.conf Cores= that Slurm 24.11 and later accept: whole sockets on a node whose GPUs sit on
NUMA nodes smaller than a socket (the built-in a100-mig: 2 sockets of 64 cores, 8 NUMA nodes of
16). Those releases set such a node INVAL on NUMA ranges ("gres/gpu GRES core specification 48-63
for node ... doesn't match socket boundaries"); 22.05 takes either. The module restarts the
session cluster as that node (cluster.sh passes a root's release to gres-conf and node-conf) and
back as the default afterwards.
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest
from tests.helpers import slurm_roots

if TYPE_CHECKING:
    from pathlib import Path

    from tests.helpers.cluster_fixture import SlurmCluster

pytestmark = pytest.mark.slurm

BUNDLE = "a100-mig"


@pytest.fixture(scope="module")
def numa_node(slurm_cluster: SlurmCluster) -> Iterator[SlurmCluster]:
    from tests.helpers.cluster_fixture import _cluster_sh

    env = {k: v for k, v in slurm_cluster.env.items() if k != "SLURM_CONF"}
    default = os.environ.get("GPUSLURM_BUNDLE", "dgx-h100")
    for bundle in (BUNDLE, default):
        assert _cluster_sh("down", env).returncode == 0
        up = _cluster_sh("up", {**env, "GPUSLURM_BUNDLE": bundle})
        assert up.returncode == 0, up.stderr + slurm_cluster.log_tail()
        if bundle != default:
            yield slurm_cluster


def _resume(cluster: SlurmCluster) -> None:
    subprocess.run(["/usr/bin/scontrol", "update", f"NodeName={socket.gethostname().split('.')[0]}",
                    "State=RESUME"], env=cluster.env, capture_output=True, timeout=30, check=False)


def _node(cluster: SlurmCluster) -> str:
    return subprocess.run(["/usr/bin/scontrol", "-o", "show", "node"], env=cluster.env,
                          capture_output=True, text=True, timeout=30, check=True).stdout


def test_numa_gpu_node_registers_and_runs_a_gpu_job(numa_node: SlurmCluster) -> None:
    gres_conf = (numa_node.conf.parent / "gres.conf").read_text()
    cores = set(re.findall(r" Cores=([0-9,-]+)", gres_conf))
    assert cores, gres_conf  # Cores= written, not left out
    node = _node(numa_node)
    assert "INVAL" not in node and "socket boundaries" not in node, node
    job = numa_node.sbatch(["--gres=gpu:1"], 'echo "GPUS=$SLURM_JOB_GPUS"\n')
    assert numa_node.wait(job, timeout=60) == "COMPLETED", numa_node.log_tail()
    assert numa_node.output(job).startswith("GPUS="), numa_node.output(job)


def test_numa_cores_set_the_node_inval_where_slurm_checks(numa_node: SlurmCluster, tmp_path: Path) -> None:
    """The finding itself: the same node with the GPUs' NUMA ranges (what gres-conf wrote before,
    and still writes for 22.05). 24.11 and 26.05 set it INVAL; 22.05 takes it."""
    from tests.helpers.cluster_fixture import _cluster_sh

    ours = (numa_node.conf.parent / "gres.conf").read_text()
    numa = ours.replace("Cores=0-63", "Cores=48-63").replace("Cores=64-127", "Cores=112-127")
    assert " Cores=48-63" in numa and " Cores=112-127" in numa, ours
    (tmp_path / "gres.conf").write_text(numa)
    env = {k: v for k, v in numa_node.env.items() if k != "SLURM_CONF"}
    assert _cluster_sh("down", env).returncode == 0
    up = _cluster_sh("up", {**env, "GPUSLURM_BUNDLE": BUNDLE, "GPUSLURM_CLUSTER_TIMEOUT": "20",
                            "GPUSLURM_CLUSTER_GRES_CONF": str(tmp_path / "gres.conf")})
    try:
        release = slurm_roots.selected()
        if release is None:  # the host's 22.05
            assert up.returncode == 0, up.stderr + numa_node.log_tail()
            assert "INVAL" not in _node(numa_node)
            return
        assert up.returncode != 0, _node(numa_node)
        node = _node(numa_node)
        assert "INVAL" in node and "socket boundaries" in node, node + numa_node.log_tail()
    finally:
        # The INVAL registration drained the node, and slurmctld keeps that across restarts; it
        # takes RESUME only once the node has registered again with a gres.conf it accepts.
        assert _cluster_sh("down", env).returncode == 0
        _cluster_sh("up", {**env, "GPUSLURM_BUNDLE": BUNDLE, "GPUSLURM_CLUSTER_TIMEOUT": "10"})
        _resume(numa_node)
