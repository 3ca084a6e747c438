"""A two-node GPU job in the real multi-node cluster: each node's hooks see only that node's GPUs.

mnode1 replays a DGX H100 (8 GPUs), mnode2 an L40S x4 box whose hostname is an FQDN
(mnode2.cluster.test) while its NodeName is short, mnode3 an A100 with MIG; each node has its own
/dev, address and hooks (tests/helpers/multinode_fixture.py, docs/multinode.md).
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from gpuslurm.hw.source import load_node
from gpuslurm.ranges import parse_ranges
from gpuslurm.slurm.hookenv import HookEnv, resolve_job_gpus

if TYPE_CHECKING:
    from tests.helpers.multinode_fixture import MultiNodeCluster

pytestmark = pytest.mark.slurm


PROBE = """import errno, glob, os
for path in sorted(glob.glob("/dev/nvidia[0-9]*")):
    try:
        os.close(os.open(path, os.O_RDONLY))
        said = "OK"
    except OSError as exc:
        said = errno.errorcode.get(exc.errno, str(exc.errno))
    print("DEV", path, said)
"""


def _step_script(cluster: MultiNodeCluster) -> str:
    """A batch script whose ``srun`` step reports, per node, what the node's hooks and pick saw and
    which of the node's GPU device files the step may open."""
    gpuslurm = cluster.env["GPUSLURM_BIN"]
    nodes = cluster.state_dir / "nodes"
    probe = cluster.state_dir / "jobs" / "probe.py"
    probe.write_text(PROBE)
    return _SHOW_SHARES + _each_node(cluster.state_dir / "jobs", f"""
/usr/bin/python3 {probe} | sed "s/^/$n /"
echo "$n HOST=$(hostname)"
if [ -d /sys/fs/cgroup/devices ]; then
  echo "$n CGROUP=$(ls -d /sys/fs/cgroup/devices/slurm_$n/uid_*/job_$SLURM_JOB_ID)"
else
  echo "$n CGROUP=$(grep ^0:: /proc/self/cgroup | cut -d: -f3)"
fi
echo "$n GPUS=$SLURM_STEP_GPUS"
echo "$n UUIDS=$GPUSLURM_GPU_UUIDS"
echo "$n MAP=$(tr -d "\\n" <{nodes}/$n/run/jobs/$SLURM_JOB_ID.json)"
echo "$n PICK=$({gpuslurm} pick 2 --from {nodes}/$n/bundle --format json | tr -d "\\n")"
{gpuslurm} pick 3 --from {nodes}/$n/bundle >/dev/null 2>&1; echo "$n PICK3=$?"
""")


_SHOW_SHARES = \
    '/usr/bin/scontrol -d show job $SLURM_JOB_ID | grep -E "^ +Nodes=mnode" | sed "s/^ */SLURM /"\n'


def _each_node(outdir: Path, body: str) -> str:
    """An ``srun`` step that runs the shell ``body`` once on each node (``$n``: the node's name);
    each node's lines reach the job's output whole.

    srun forwards a task's output in chunks, so two nodes' long lines can interleave (CI saw a
    1,000-character PICK line cut by the other node's HOST line). Each node writes a file of its
    own in ``outdir`` and the batch step prints them one after the other."""
    return f"""srun --ntasks-per-node=1 bash -c '
n=$SLURMD_NODENAME
exec >{outdir}/step-$SLURM_JOB_ID.$n
{body}'
/usr/bin/cat {outdir}/step-$SLURM_JOB_ID.*
"""


def _shares(cluster: MultiNodeCluster, out: str) -> dict[str, list[str]]:
    """Each node's GPUs (UUIDs) as Slurm allocated them: ``scontrol -d show job``'s per-node GRES
    indices (the batch script wrote them), resolved against the node's bundle the way the hooks do.

    Not the step's SLURM_JOB_GPUS: srun passes the batch step's value (the first node's) on to
    every node."""
    return {node: _resolve(cluster, node, parse_ranges(idx, 1024))
            for node, idx in re.findall(r"^SLURM Nodes=(mnode\d) .*\(IDX:([^)]*)\)", out, re.M)}


def _resolve(cluster: MultiNodeCluster, node: str, indices: tuple[int, ...]) -> list[str]:
    """GRES indices of ``node`` -> its devices' UUIDs, as the hooks resolve them."""
    devices = resolve_job_gpus(HookEnv(job_gpus=indices), load_node(str(cluster.bundle(node))))
    return [d.uuid for d in devices]


def _job_cgroups_left(cluster: MultiNodeCluster, node: str, jobid: int, timeout: float = 30) -> list[Path]:
    """The job's cgroups on ``node`` (``MultiNodeCluster.job_cgroups``) left after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        left = cluster.job_cgroups(node, jobid)
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.3)


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
    shares = _shares(cluster, out)
    for node in ("mnode1", "mnode2"):
        report = seen[node]
        uuids = cluster.uuids(node)
        own = shares[node]
        assert len(own) == 2, out
        # the step's own variable on this node
        assert _resolve(cluster, node, tuple(int(i) for i in report["GPUS"].split(","))) == own
        jmap = json.loads(report["MAP"])
        assert jmap["job_id"] == str(jobid)
        assert [g["uuid"] for g in jmap["gpus"]] == own, (node, jmap)  # this node's GPUs, not the other's
        assert report["UUIDS"] == ",".join(own)  # the task prolog on this node
        assert {g["uuid"] for g in json.loads(report["PICK"])["gpus"]} == set(own)
        assert report["PICK3"] == "2"  # the job holds 2 GPUs on this node
        # Slurm's device cgroup on this node: its two GPUs' files open (ENXIO: no driver behind a
        # fake file), the node's others are denied (EPERM); minors are not indices on the L40S box
        minors = {g["minor"] for g in jmap["gpus"]}
        files = dict(re.findall(rf"^{node} DEV /dev/nvidia(\d+) (\w+)$", out, re.M))
        assert len(files) == len(uuids), out
        assert files == {m: "ENXIO" if int(m) in minors else "EPERM" for m in files}, (node, out)
        # after the job, this node's epilog removed its map and wrote its summary
        assert _wait_gone(cluster.job_map(node, jobid)), f"{node}: map left\n{cluster.log_tail()}"
        summary = json.loads(cluster.summary(node, jobid).read_text())
        assert [g["uuid"] for g in summary["gpus"]] == own
        # as it ran: Slurm's job cgroup on this node (v1: slurm_<node>; v2: the node's stepd scope
        # in its own cgroup namespace)
        assert report["CGROUP"].startswith(f"/sys/fs/cgroup/devices/slurm_{node}/" if not cluster.cgroup_v2
                                           else f"/system.slice/{node}_slurmstepd.scope/"), report
        assert not _job_cgroups_left(cluster, node, jobid)
    # the two nodes' GPU sets are their own bundles' (an H100's UUIDs and an L40S's)
    assert not set(cluster.uuids("mnode1")) & set(cluster.uuids("mnode2"))
    assert not cluster.summary("mnode3", jobid).exists()


def test_a_prolog_failing_on_one_node_leaves_the_other_clean_and_the_rest_serving(
        multinode_cluster: MultiNodeCluster) -> None:
    """mnode2's every GPU reports 97 C: its prolog (run when the job's ``srun`` step reaches mnode2)
    refuses the job and drains mnode2 naming the GPU; Slurm requeues the job, and mnode1, where its
    batch step had started, keeps no map of it; a two-node job then runs on mnode1 and mnode3."""
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
        # Slurm requeues the job (held) for the failed prolog: mnode1's epilog ends its share there
        deadline = time.monotonic() + 60
        while (state := cluster.job_field(jobid, "JobState")) in ("RUNNING", "COMPLETING") \
                and time.monotonic() < deadline:
            time.sleep(0.3)
        assert state == "PENDING", f"{state}\n{cluster.log_tail()}"
        assert _wait_gone(cluster.job_map("mnode1", jobid)), f"mnode1 kept the map\n{cluster.log_tail()}"
        assert cluster.summary("mnode1", jobid).exists()
        assert not _job_cgroups_left(cluster, "mnode1", jobid)
        cluster.client("/usr/bin/scancel", str(jobid))
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


def test_a_gpu_out_on_one_node_leaves_its_other_gpus_and_the_other_nodes_serving(
        multinode_cluster: MultiNodeCluster) -> None:
    """Every GPU of mnode1 reports Xid 79 and its hooks take such a GPU out (``[health.xid] action =
    "gpu_out"``): a two-node job's prolog on mnode1 takes its GPU out and requeues it; mnode2 and
    mnode3 serve a two-node job meanwhile; mnode1's monitor (run in its namespaces) holds the GPU
    out with a holder job and resumes mnode1, and the requeued job runs on another of its GPUs."""
    cluster = multinode_cluster
    node = "mnode1"
    config = cluster.node_dir(node) / "gpuslurm.toml"
    original = config.read_text()
    health = cluster.bundle(node) / "health.json"
    record = cluster.node_dir(node) / "state" / "out-of-service.json"
    health.write_text(json.dumps({uuid: {"xid": [79]} for uuid in cluster.uuids(node)}))
    config.write_text(original + '[health.xid]\naction = "gpu_out"\n[monitor]\nkmsg = ""\n')
    job = None
    try:
        job = cluster.sbatch(["-N2", "-w", "mnode1,mnode3", "--gres=gpu:1"], _step_script(cluster))
        deadline = time.monotonic() + 60
        while not record.exists():
            assert time.monotonic() < deadline, cluster.log_tail()
            time.sleep(0.5)
        cluster.wait_node(node, r"DRAIN")
        [gone] = json.loads(record.read_text())["gpus"]
        assert gone["by"] == "prolog" and "Xid 79" in gone["reason"]
        assert cluster.node_field(node, "Reason").startswith(f"gpuslurm: GPU out: index {gone['index']}")
        # requeued: through COMPLETING (both nodes' epilogs) to PENDING
        deadline = time.monotonic() + 60
        while (state := cluster.job_field(job, "JobState")) == "COMPLETING" and time.monotonic() < deadline:
            time.sleep(0.3)
        assert state == "PENDING", f"{state}\n{cluster.log_tail()}"
        assert "gpuslurm requeued this job" in cluster.job_field(job, "Comment")
        for other in ("mnode2", "mnode3"):
            assert not (cluster.node_dir(other) / "state" / "out-of-service.json").exists()
        serving = cluster.sbatch(["-N2", "-w", "mnode2,mnode3", "--gres=gpu:1"], _step_script(cluster))
        assert cluster.wait(serving) == "COMPLETED", f"{cluster.output(serving)}\n{cluster.log_tail()}"
        health.unlink()
        said = cluster.in_node(node, "env", f"GPUSLURM_CONFIG={config}", cluster.env["GPUSLURM_BIN"],
                               "monitor", "--once", "--from", str(cluster.bundle(node)))
        assert said.returncode == 0, said.stderr
        assert "held out by job" in said.stderr, said.stderr
        assert "DRAIN" not in cluster.node_field(node, "State"), said.stderr
        if cluster.job_field(job, "Reason") == "BeginTime":  # 22.05 delays a requeued batch job
            cluster.client("/usr/bin/scontrol", "update", f"JobId={job}", "StartTime=now")
        assert cluster.wait(job) == "COMPLETED", f"{cluster.output(job)}\n{cluster.log_tail()}"
        ran = {g["uuid"] for g in json.loads(cluster.summary(node, job).read_text())["gpus"]}
        assert ran and gone["uuid"] not in ran
    finally:
        config.write_text(original)
        health.unlink(missing_ok=True)
        if job is not None:
            cluster.client("/usr/bin/scancel", str(job), check=False)
        cluster.client("/usr/bin/scancel", f"--name=gpuslurm-gpu-out-{node}", check=False)
        record.unlink(missing_ok=True)
        cluster.client("/usr/bin/scontrol", "update", f"NodeName={node}", "Comment=", check=False)
        cluster.resume(node)


def test_uneven_and_typed_requests_land_on_the_nodes_that_have_them(
        multinode_cluster: MultiNodeCluster) -> None:
    """``--gpus=6 -N2`` over an 8-GPU and a 4-GPU node: each node's map holds its own share and the
    shares add up to 6; a MIG type only mnode3 has lands there, mapped to that MIG device."""
    cluster = multinode_cluster
    jobid = cluster.sbatch(["-N2", "-w", "mnode1,mnode2", "--gpus=6"], _step_script(cluster))
    assert cluster.wait(jobid) == "COMPLETED", f"{cluster.output(jobid)}\n{cluster.log_tail()}"
    out = cluster.output(jobid)
    seen = _per_node(out)
    shares = _shares(cluster, out)
    assert set(shares) == {"mnode1", "mnode2"}, out
    for node, own in shares.items():
        assert [g["uuid"] for g in json.loads(seen[node]["MAP"])["gpus"]] == own, (node, out)
        assert seen[node]["UUIDS"] == ",".join(own)
        if len(own) >= 2:
            assert {g["uuid"] for g in json.loads(seen[node]["PICK"])["gpus"]} <= set(own)
        else:  # 26.05 may split 6 as 5 + 1: pick 2 then refuses, as the job holds one GPU here
            assert seen[node]["PICK"] == "", (node, out)
    counts = {node: len(own) for node, own in shares.items()}
    assert sum(counts.values()) == 6 and counts["mnode1"] != counts["mnode2"], counts
    mig = cluster.sbatch(["--gres=gpu:nvidia_a100_1g.10gb:1"], _step_script(cluster))
    assert cluster.wait(mig) == "COMPLETED", f"{cluster.output(mig)}\n{cluster.log_tail()}"
    report = _per_node(cluster.output(mig))
    assert set(report) == {"mnode3"}
    [gpu] = json.loads(report["mnode3"]["MAP"])["gpus"]
    assert gpu["uuid"].startswith("MIG-") and gpu["parent_uuid"] in cluster.uuids("mnode3"), gpu


def test_a_two_node_job_of_nobody_is_confined_to_its_share_on_each_node(
        multinode_cluster: MultiNodeCluster) -> None:
    """The same two-node job as the real user ``nobody``: the task prolog runs as nobody on each
    node and names that node's GPUs; the step opens only those device files, whatever it tries."""
    cluster = multinode_cluster
    nobody = 65534
    probe = cluster.state_dir / "jobs" / "probe.py"
    probe.write_text(PROBE)
    nodes, python = cluster.state_dir / "nodes", cluster.users_python
    outdir = cluster.state_dir / "jobs" / str(nobody)  # sbatch(uid=) makes it nobody's
    script = _SHOW_SHARES + _each_node(outdir, f"""
/usr/bin/python3 {probe} | sed "s/^/$n /"
echo "$n ID=$(id -u)"
echo "$n UUIDS=$GPUSLURM_GPU_UUIDS"
echo "$n PICK=$({python} -m gpuslurm pick 1 --from {nodes}/$n/bundle --format json | tr -d "\\n")"
""")
    jobid = cluster.sbatch(["-N2", "-w", "mnode1,mnode2", "--gres=gpu:2"], script, uid=nobody)
    state = cluster.wait(jobid)
    out = cluster.output(jobid, uid=nobody)
    assert state == "COMPLETED", f"{out}\n{cluster.log_tail()}"
    seen = _per_node(out)
    shares = _shares(cluster, out)
    assert set(seen) == set(shares) == {"mnode1", "mnode2"}, out
    for node, own in shares.items():
        report = seen[node]
        assert report["ID"] == str(nobody)
        assert report["UUIDS"] == ",".join(own), (node, out)
        assert {g["uuid"] for g in json.loads(report["PICK"])["gpus"]} <= set(own)
        summary = json.loads(cluster.summary(node, jobid).read_text())
        assert [g["uuid"] for g in summary["gpus"]] == own and summary["user"] == "nobody"
        minors = {g["minor"] for g in summary["gpus"]}
        files = dict(re.findall(rf"^{node} DEV /dev/nvidia(\d+) (\w+)$", out, re.M))
        assert len(files) == len(cluster.uuids(node)), out
        assert files == {m: "ENXIO" if int(m) in minors else "EPERM" for m in files}, (node, out)
