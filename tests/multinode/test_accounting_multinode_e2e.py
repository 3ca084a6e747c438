"""Accounting in the multi-node cluster: one slurmdbd (on a private MariaDB) behind the one
slurmctld, which records a two-node GPU job as Slurm's ``sacct`` shows it (docs/multinode.md)."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from tests.helpers.multinode_fixture import MultiNodeCluster

pytestmark = pytest.mark.slurm

FIELDS = "JobID,NNodes,NodeList,AllocTRES,State"


def _sacct(cluster: MultiNodeCluster, jobid: int, timeout: float = 60) -> dict[str, dict[str, str]]:
    """The job's and its steps' records in slurmdbd, by JobID, once the job's record says it ended
    (slurmctld sends its records to slurmdbd asynchronously)."""
    deadline = time.monotonic() + timeout
    rows: dict[str, dict[str, str]] = {}
    while True:
        done = cluster.client("/usr/bin/sacct", "-j", str(jobid), "-n", "-P", f"--format={FIELDS}",
                              check=False)
        rows = {line.split("|")[0]: dict(zip(FIELDS.split(","), line.split("|"), strict=False))
                for line in done.stdout.splitlines() if line.count("|") == FIELDS.count(",")}
        # Under load, 22.05 once showed the ended job's NodeList as its batch host alone (mnode1,
        # beside NNodes=2), and both nodes in the next run: wait for the record to name both.
        job = rows.get(str(jobid), {})
        if job.get("State") == "COMPLETED" and job.get("NodeList") == "mnode[1-2]" and f"{jobid}.0" in rows:
            return rows
        if time.monotonic() > deadline:
            raise AssertionError(f"sacct -j {jobid}: {done.stdout}{done.stderr}\n{cluster.log_tail()}")
        time.sleep(0.5)


def _tres(text: str) -> dict[str, str]:
    return dict(item.split("=", 1) for item in text.split(",") if "=" in item)


def test_a_two_node_gpu_jobs_accounting_names_both_nodes_and_its_gpus(
        multinode_cluster: MultiNodeCluster) -> None:
    """``-N2 --gres=gpu:2`` with an ``srun`` step over both nodes: slurmdbd holds the job with 2
    nodes (mnode1 and mnode2) and 4 GPUs allocated (2 per node), and its step on both nodes."""
    cluster = multinode_cluster
    jobid = cluster.sbatch(["-N2", "-w", "mnode1,mnode2", "--gres=gpu:2"],
                           "srun --ntasks-per-node=1 /bin/true\n")
    assert cluster.wait(jobid) == "COMPLETED", f"{cluster.output(jobid)}\n{cluster.log_tail()}"
    rows = _sacct(cluster, jobid)
    job, step = rows[str(jobid)], rows[f"{jobid}.0"]
    assert job["NNodes"] == "2" and job["NodeList"] == "mnode[1-2]", rows
    tres = _tres(job["AllocTRES"])
    assert tres.get("gres/gpu") == "4" and tres.get("node") == "2", rows
    assert step["NNodes"] == "2" and step["NodeList"] == "mnode[1-2]", rows
    # each node's epilog summarised its own share of the same job
    for node in ("mnode1", "mnode2"):
        assert cluster.summary(node, jobid).exists(), node
