"""A two-node GPU job in the real multi-node cluster: each node's hooks see only that node's GPUs.

mnode1 replays a DGX H100 (8 GPUs), mnode2 an L40S x4 box whose hostname is an FQDN
(mnode2.cluster.test) while its NodeName is short, mnode3 an A100 with MIG; each node has its own
/dev, address and hooks (tests/multinode_fixture.py, docs/multinode.md).
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from multinode_fixture import MultiNodeCluster

pytestmark = pytest.mark.slurm


def _step_script(cluster: MultiNodeCluster) -> str:
    """A batch script whose ``srun`` step reports, per node, what the node's hooks and pick saw."""
    gpuslurm = cluster.env["GPUSLURM_BIN"]
    nodes = cluster.state_dir / "nodes"
    return f"""
srun --ntasks-per-node=1 bash -c '
n=$SLURMD_NODENAME
echo "$n HOST=$(hostname)"
echo "$n GPUS=$SLURM_JOB_GPUS"
echo "$n UUIDS=$GPUSLURM_GPU_UUIDS"
echo "$n MAP=$(tr -d "\\n" <{nodes}/$n/run/jobs/$SLURM_JOB_ID.json)"
echo "$n PICK=$({gpuslurm} pick 2 --from {nodes}/$n/bundle --format json | tr -d "\\n")"
{gpuslurm} pick 3 --from {nodes}/$n/bundle >/dev/null 2>&1; echo "$n PICK3=$?"
'
"""


def _per_node(out: str) -> dict[str, dict[str, str]]:
    seen: dict[str, dict[str, str]] = {}
    for node, key, value in re.findall(r"^(mnode\d) (\w+)=(.*)$", out, re.M):
        seen.setdefault(node, {})[key] = value
    return seen


def _wait_gone(path: Path, timeout: float = 30) -> bool:
    deadline = time.monotonic() + timeout
    while path.exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    return not path.exists()


def test_two_node_job_maps_each_nodes_own_gpus(multinode_cluster: MultiNodeCluster) -> None:
    cluster = multinode_cluster
    jobid = cluster.sbatch(["-N2", "-w", "mnode1,mnode2", "--gres=gpu:2"], _step_script(cluster))
    state = cluster.wait(jobid)
    out = cluster.output(jobid)
    assert state == "COMPLETED", f"{out}\n{cluster.log_tail()}"
    seen = _per_node(out)
    assert set(seen) == {"mnode1", "mnode2"}, out
    assert seen["mnode1"]["HOST"] == "mnode1"
    assert seen["mnode2"]["HOST"] == "mnode2.cluster.test"  # hostname != NodeName: hooks go by the latter
    for node in ("mnode1", "mnode2"):
        report = seen[node]
        uuids = cluster.uuids(node)
        own = [uuids[int(i)] for i in report["GPUS"].split(",")]
        assert len(own) == 2, report
        jmap = json.loads(report["MAP"])
        assert jmap["job_id"] == str(jobid)
        assert [g["uuid"] for g in jmap["gpus"]] == own, (node, jmap)  # this node's GPUs, not the other's
        assert report["UUIDS"] == ",".join(own)  # the task prolog on this node
        assert {g["uuid"] for g in json.loads(report["PICK"])["gpus"]} == set(own)
        assert report["PICK3"] == "2"  # the job holds 2 GPUs on this node
        # after the job, this node's epilog removed its map and wrote its summary
        assert _wait_gone(cluster.job_map(node, jobid)), f"{node}: map left\n{cluster.log_tail()}"
        summary = json.loads(cluster.summary(node, jobid).read_text())
        assert [g["uuid"] for g in summary["gpus"]] == own
    # the two nodes' GPU sets are their own bundles' (an H100's UUIDs and an L40S's)
    assert not set(cluster.uuids("mnode1")) & set(cluster.uuids("mnode2"))
    assert not cluster.summary("mnode3", jobid).exists()


def test_a_prolog_failing_on_one_node_leaves_the_other_clean_and_the_rest_serving(
        multinode_cluster: MultiNodeCluster) -> None:
    """mnode2's every GPU reports 97 C: its prolog refuses the job and drains mnode2 naming the GPU;
    mnode1, where the job's batch step had started, keeps no map of it; a two-node job then runs on
    mnode1 and mnode3."""
    cluster = multinode_cluster
    health = cluster.bundle("mnode2") / "health.json"
    health.write_text(json.dumps({uuid: {"temperature_c": 97} for uuid in cluster.uuids("mnode2")}))
    jobid = None
    try:
        jobid = cluster.sbatch(["-N2", "-w", "mnode1,mnode2", "--gres=gpu:2"], _step_script(cluster))
        cluster.wait_node("mnode2", r"DRAIN")
        reason = cluster.node_field("mnode2", "Reason")
        assert "gpuslurm:" in reason and "temperature 97 C over limit" in reason, \
            f"{reason}\n{cluster.log_tail()}"
        assert cluster.job_field(jobid, "JobState") != "COMPLETED"
        cluster.client("/usr/bin/scancel", str(jobid))
        assert _wait_gone(cluster.job_map("mnode1", jobid)), f"mnode1 kept the map\n{cluster.log_tail()}"
        assert not cluster.job_map("mnode2", jobid).exists()
        assert "DRAIN" not in cluster.node_field("mnode1", "State")
        # the other nodes serve a two-node job meanwhile
        other = cluster.sbatch(["-N2", "--gres=gpu:1"], _step_script(cluster))
        assert cluster.wait(other) == "COMPLETED", f"{cluster.output(other)}\n{cluster.log_tail()}"
        assert set(_per_node(cluster.output(other))) == {"mnode1", "mnode3"}
    finally:
        health.unlink(missing_ok=True)
        if jobid is not None:
            cluster.client("/usr/bin/scancel", str(jobid), check=False)
        cluster.resume("mnode2")
