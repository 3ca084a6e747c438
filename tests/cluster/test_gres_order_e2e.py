"""Slurm's GPU numbers are gres.conf positions, not device minors: checked where they differ.

On the built-in l40s-4x node the bus order (and so gpuslurm's gres.conf order) is minors 2, 3, 0,
1. For each job, the devices gpuslurm resolves from ``SLURM_JOB_GPUS`` must be exactly the ones
Slurm's device cgroup lets the job open (ENXIO: allowed, no driver; EPERM: denied). The module
restarts the session cluster as that node and back as the default afterwards.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest
from tests.helpers import slurm_roots

from gpuslurm.hw.source import load_node
from gpuslurm.slurm.hookenv import HookEnv, resolve_job_gpus

if TYPE_CHECKING:
    from tests.helpers.cluster_fixture import SlurmCluster

pytestmark = pytest.mark.slurm

PROBE = """
echo "GPUS=$SLURM_JOB_GPUS"
for i in 0 1 2 3; do /usr/bin/python3 -c "
import errno, os
try:
    os.close(os.open('/dev/nvidia$i', os.O_RDWR))
except OSError as e:
    print('nvidia$i', errno.errorcode[e.errno])
"; done
"""


@pytest.fixture(scope="module")
def l40s(slurm_cluster: SlurmCluster) -> Iterator[SlurmCluster]:
    from tests.helpers.cluster_fixture import _cluster_sh

    env = {k: v for k, v in slurm_cluster.env.items() if k != "SLURM_CONF"}
    default = os.environ.get("GPUSLURM_BUNDLE", "dgx-h100")
    for bundle in ("l40s-4x", default):
        assert _cluster_sh("down", env).returncode == 0
        up = _cluster_sh("up", {**env, "GPUSLURM_BUNDLE": bundle})
        assert up.returncode == 0, up.stderr
        if bundle != default:
            yield slurm_cluster


@slurm_roots.without_cgroups("no device cgroup: the probe opens every GPU")
def test_slurm_job_gpus_name_gres_positions(l40s: SlurmCluster) -> None:
    node = load_node("l40s-4x")
    assert [g.minor for g in node.gpus] == [2, 3, 0, 1]  # the case this test is about
    jobs = [l40s.sbatch([f"--gres=gpu:{n}"], PROBE) for n in (1, 2, 1)]
    for job in jobs:
        assert l40s.wait(job, timeout=60) == "COMPLETED", l40s.log_tail()
        lines = l40s.output(job).split("\n")
        gpus = lines[0].removeprefix("GPUS=")
        opened = {int(line.split()[0].removeprefix("nvidia")) for line in lines[1:]
                  if line.endswith("ENXIO")}
        denied = {int(line.split()[0].removeprefix("nvidia")) for line in lines[1:]
                  if line.endswith("EPERM")}
        env = HookEnv.from_environ({"SLURM_JOB_ID": str(job), "SLURM_JOB_UID": "0",
                                    "SLURM_JOB_USER": "root", "SLURM_JOB_GPUS": gpus})
        resolved = {d.minor for d in resolve_job_gpus(env, node)}
        assert resolved == opened and opened | denied == {0, 1, 2, 3}, (gpus, opened, denied)
