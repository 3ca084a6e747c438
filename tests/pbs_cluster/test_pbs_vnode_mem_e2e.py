"""The real OpenPBS cluster: NUMA vnodes from a capture without meminfo still run a job that asks
for memory (pbs-conf gave every vnode ``mem = 0mb``, which no ``mem=`` request could fit)."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from tests.helpers.pbs_fixture import PREFIX, PbsCluster
from tests.helpers.pbs_helpers import BUNDLE, HOST, QMGR, _restart_mom, _wait_vnodes

from gpuslurm.gres.pbs_vnodes import plan_vnodes
from gpuslurm.hw.source import bundle_path, load_node

pytestmark = pytest.mark.pbs


def _insert(cluster: PbsCluster, vnode_file: Path, numa: list[str]) -> dict[str, dict[str, str]]:
    """Replace the vnode file pbs_mom holds and let the NUMA vnodes be made anew from it."""
    cluster.run(str(PREFIX / "sbin" / "pbs_mom"), "-s", "remove", "gpuslurm-numa", check=False)
    cluster.run(str(PREFIX / "sbin" / "pbs_mom"), "-s", "insert", "gpuslurm-numa", str(vnode_file))
    for name in numa:
        cluster.run(QMGR, "-c", f"delete node {name}", check=False)
    cluster.run(QMGR, "-c", f"unset node {HOST} resources_available.mem", check=False)
    _restart_mom(cluster)
    return _wait_vnodes(cluster, numa)


def test_vnodes_without_meminfo_run_a_job_that_asks_for_memory(pbs_cluster: PbsCluster,
                                                               tmp_path: Path) -> None:
    source = bundle_path(BUNDLE)
    assert source is not None
    bundle = tmp_path / "b"
    shutil.copytree(source, bundle)
    (bundle / "meminfo").unlink()
    made = subprocess.run([sys.executable, "-m", "gpuslurm", "pbs-conf", "--from", str(bundle),
                           "--node-name", HOST], capture_output=True, text=True, timeout=60, check=False)
    assert made.returncode == 0 and "mem left out" in made.stderr, made.stderr
    assert "mem" not in made.stdout
    nomem = pbs_cluster.state_dir / "vnodes-nomem"
    nomem.write_text(made.stdout)
    numa = [f"{HOST}[{v.numa_node}]" for v in plan_vnodes(load_node(str(bundle)))]
    try:
        _insert(pbs_cluster, nomem, numa)
        jobid = pbs_cluster.qsub(["-l", "select=1:ncpus=1:ngpus=1:mem=100mb"], "true\n")
        status = pbs_cluster.wait(jobid, timeout=120)
        assert re.search(r"^\s*Exit_status = 0$", status, re.M), status
    finally:
        nodes = _insert(pbs_cluster, pbs_cluster.state_dir / "vnodes", numa)
        assert all(nodes[n].get("resources_available.mem") for n in numa)  # the cluster as it was
