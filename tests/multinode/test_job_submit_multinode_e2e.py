"""plugins/job_submit.lua in the multi-node cluster's slurmctld: a throttled user's cap holds for
jobs that span nodes, and the jobs it lets through run with that many GPUs over their nodes.

The cap is per job (docs/throttle.md): ``-N2 --gres=gpu:K`` asks for 2K GPUs. Over the cap the
plugin lowers the per-node count to what fits (floor(cap / nodes)), and refuses a job whose
nodes alone exceed it; ``--gpus=N`` (per job) is lowered to the cap, and so is the job's
``SLURM_GPUS``, which a bare ``srun`` in it reads back. ``up`` installs the plugin
beside slurm.conf; the test writes its throttle file there and removes it afterwards.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from tests.helpers.throttle_helpers import SETTLE_S

if TYPE_CHECKING:
    from tests.helpers.multinode_fixture import MultiNodeCluster

pytestmark = pytest.mark.slurm

NOBODY = 65534


@pytest.fixture
def throttle_file(multinode_cluster: MultiNodeCluster) -> Iterator[Path]:
    path = multinode_cluster.state_dir / "etc" / "gpuslurm-throttle"
    try:
        yield path
    finally:
        path.unlink(missing_ok=True)
        multinode_cluster.client("/usr/bin/scancel", "-u", "nobody", check=False)
        time.sleep(SETTLE_S)  # the plugin forgets the throttle before the next module's jobs


def _throttle(path: Path, *args: str) -> None:
    done = subprocess.run([sys.executable, "-m", "gpuslurm", "throttle", "add", "nobody", *args,
                           "--for", "1h", "--file", str(path)], capture_output=True, text=True,
                          timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    time.sleep(SETTLE_S)


def _submit(cluster: MultiNodeCluster, *args: str, script: str = "srun true"
            ) -> subprocess.CompletedProcess[str]:
    """sbatch as nobody (``script``: ``srun true`` on every node the job gets); the job id in stdout."""
    outdir = cluster.state_dir / "jobs" / str(NOBODY)
    outdir.mkdir(exist_ok=True)
    os.chown(outdir, NOBODY, NOBODY)  # the module alone: no earlier module made it nobody's
    return cluster.client("/usr/bin/setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups",
                          "/usr/bin/sbatch", "--parsable", f"--output={outdir}/slurm-%j.out", *args,
                          "--wrap", script, check=False)


def _gpus_per_node(cluster: MultiNodeCluster, job: int) -> dict[str, int]:
    """How many GPUs each node's epilog summary says the job had there."""
    assert cluster.wait(job) == "COMPLETED", f"{cluster.output(job, NOBODY)}\n{cluster.log_tail()}"
    out = {}
    for node in ("mnode1", "mnode2", "mnode3"):
        summary = cluster.summary(node, job)
        if summary.exists():
            out[node] = len(json.loads(summary.read_text())["gpus"])
    return out


def test_a_throttled_users_cap_holds_over_two_nodes(multinode_cluster: MultiNodeCluster,
                                                   throttle_file: Path) -> None:
    cluster = multinode_cluster
    # unthrottled: the request as asked, 4 GPUs on each node
    job = int(_submit(cluster, "-N2", "-w", "mnode1,mnode2", "--gres=gpu:4").stdout.strip())
    assert _gpus_per_node(cluster, job) == {"mnode1": 4, "mnode2": 4}

    _throttle(throttle_file, "--cap", "4")
    # over the cap (2 nodes x 4): lowered to 2 per node, and it runs with 2 on each node
    over = _submit(cluster, "-N2", "-w", "mnode1,mnode2", "--gres=gpu:4")
    assert over.returncode == 0 and "reduced to 4 GPU(s)" in over.stderr, over.stderr
    assert _gpus_per_node(cluster, int(over.stdout.strip())) == {"mnode1": 2, "mnode2": 2}
    # at the cap: as asked, nothing said
    under = _submit(cluster, "-N2", "-w", "mnode1,mnode2", "--gres=gpu:2")
    assert under.returncode == 0 and "reduced" not in under.stderr, under.stderr
    assert _gpus_per_node(cluster, int(under.stdout.strip())) == {"mnode1": 2, "mnode2": 2}
    # --gpus=6 -N2 (per job, uneven over an 8- and a 4-GPU node): lowered to 4 in all
    uneven = _submit(cluster, "-N2", "-w", "mnode1,mnode2", "--gpus=6")
    assert uneven.returncode == 0 and "reduced to 4 GPU(s)" in uneven.stderr, uneven.stderr
    shares = _gpus_per_node(cluster, int(uneven.stdout.strip()))
    assert set(shares) == {"mnode1", "mnode2"} and sum(shares.values()) == 4, shares

    _throttle(throttle_file, "--cap", "1")
    # two nodes with GPUs are over a cap of one GPU, whatever the count per node: refused
    refused = _submit(cluster, "-N2", "--gres=gpu:1")
    assert refused.returncode != 0, refused.stdout
    assert "2 node(s) with GPUs exceed the cap of 1" in refused.stderr, refused.stderr
    one = _submit(cluster, "-N1", "--gres=gpu:1")
    assert one.returncode == 0 and "reduced" not in one.stderr, one.stderr
    assert sum(_gpus_per_node(cluster, int(one.stdout.strip())).values()) == 1


def test_a_capped_gpus_jobs_bare_srun_runs(multinode_cluster: MultiNodeCluster, throttle_file: Path) -> None:
    # sbatch wrote SLURM_GPUS=6 into the job's environment before the plugin lowered --gpus=6 to 4;
    # the plugin rewrites it, so the batch step's bare srun asks for the job's 4, not 6 (before:
    # "Step requested gres=gpu:6 is more than the job's gres=gpu:4").
    cluster = multinode_cluster
    _throttle(throttle_file, "--cap", "4")
    capped = _submit(cluster, "-N2", "-w", "mnode1,mnode2", "--gpus=6",
                     script='echo "SLURM_GPUS=$SLURM_GPUS"; srun true')
    assert capped.returncode == 0 and "reduced to 4 GPU(s)" in capped.stderr, capped.stderr
    job = int(capped.stdout.strip())
    assert cluster.wait(job) == "COMPLETED", cluster.output(job, NOBODY)
    assert "SLURM_GPUS=4\n" in cluster.output(job, NOBODY)
    # srun keeps the request it sent for its own step: over the cap it is refused, not lowered
    srun = cluster.client("/usr/bin/setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups",
                          "/usr/bin/srun", "-N2", "-w", "mnode1,mnode2", "--gpus=6", "true", check=False)
    assert srun.returncode != 0 and "srun and salloc requests are not lowered" in srun.stderr, srun.stderr
