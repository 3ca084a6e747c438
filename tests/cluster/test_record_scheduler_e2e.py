"""What the Scheduler contract test (tests/state/test_scheduler_contract.py) replays, recorded
from the real cluster: ``squeue --json`` of a node running a GPU job, that job's ``scontrol show -d
job``, the node's ``scontrol -o show node``, the job's batch step's ``/proc/self/cgroup`` (and,
where the release gives jobs a SLUID,
``scontrol show -d job <SLUID>``); then the Slurm adapter run against the same
cluster (its job list, its job details, its cancel).

With ``GPUSLURM_RECORD_SCHEDULER=<dir>`` the outputs are written to ``<dir>/<release>/``: that is
how tests/slurm/scheduler/ was captured (``GPUSLURM_SLURM_RELEASE`` picks the release,
docs/compatibility.md)::

    GPUSLURM_RECORD_SCHEDULER=tests/slurm/scheduler pytest tests/cluster/test_record_scheduler_e2e.py
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from gpuslurm.hw.source import load_node
from gpuslurm.slurm.adapter import SlurmScheduler

if TYPE_CHECKING:
    from tests.helpers.cluster_fixture import SlurmCluster

pytestmark = pytest.mark.slurm

SQUEUE, SCONTROL, SCANCEL = "/usr/bin/squeue", "/usr/bin/scontrol", "/usr/bin/scancel"


def _run(cluster: SlurmCluster, *argv: str) -> str:
    # decoded as gpuslurm's runner decodes (errors="replace"): other tests' jobs on the session's
    # cluster have names that are not UTF-8, and 22.05's squeue --json lists every job
    return subprocess.run(argv, env=cluster.env, capture_output=True, encoding="utf-8",
                          errors="replace", timeout=30, check=True).stdout


def _running(job: dict[str, object]) -> bool:
    state = job.get("job_state")  # a string up to 23.02, a list of flags from 23.11
    return state == "RUNNING" or (isinstance(state, list) and "RUNNING" in state)


def _printed(cluster: SlurmCluster, job: int) -> str:
    """What ``job`` printed, once it has printed a whole line."""
    deadline = time.monotonic() + 30
    while True:
        try:
            text = cluster.output(job)
        except FileNotFoundError:
            text = ""
        if text.endswith("\n"):
            return text
        assert time.monotonic() < deadline, f"job {job} printed nothing\n{cluster.log_tail()}"
        time.sleep(0.2)


def test_the_slurm_adapter_lists_and_cancels_a_real_gpu_job(slurm_cluster: SlurmCluster,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    release = os.environ.get("GPUSLURM_SLURM_RELEASE", "22.05")
    job = slurm_cluster.sbatch(["--gres=gpu:2", "--time=5", "--job-name=train"],
                               "cat /proc/self/cgroup\nexec sleep 300")
    try:
        deadline = time.monotonic() + 30
        while slurm_cluster.state(job) != "RUNNING":
            assert time.monotonic() < deadline, f"job {job} never started\n{slurm_cluster.log_tail()}"
            time.sleep(0.2)
        shown = _run(slurm_cluster, SCONTROL, "show", "-d", "job", str(job))
        node_name = next(w.split("=", 1)[1] for w in shown.split() if w.startswith("BatchHost="))
        listed = _run(slurm_cluster, SQUEUE, "--json", f"--nodelist={node_name}", "--states=RUNNING")
        node_shown = _run(slurm_cluster, SCONTROL, "-o", "show", "node", node_name)
        sluid = next((w.split("=", 1)[1] for w in shown.split() if w.startswith("SLUID=")), None)
        cgroup = _printed(slurm_cluster, job)  # the batch step's /proc/self/cgroup
        # 22.05's squeue --json ignores --nodelist and --states (it lists every job the controller
        # remembers, other tests' ended ones too), as the adapter knows: the running ones on this
        # node are this test's job alone
        assert [str(j["job_id"]) for j in json.loads(listed)["jobs"]
                if _running(j) and j.get("nodes") == node_name] == [str(job)]
        if record := os.environ.get("GPUSLURM_RECORD_SCHEDULER"):
            out = Path(record) / release
            out.mkdir(parents=True, exist_ok=True)
            (out / "squeue-running.json").write_text(listed)
            (out / "show-job.txt").write_text(shown)
            (out / "show-node.txt").write_text(node_shown)
            (out / "job").write_text(f"{job}\n{node_name}\n")
            (out / "cgroup").write_text(cgroup)
            if sluid:  # 25.11+: the job's SLUID, and scontrol's answer by it (26.05's cgroup names)
                (out / "sluid").write_text(f"{sluid}\n")
                (out / "show-job-by-sluid.txt").write_text(_run(slurm_cluster, SCONTROL, "show", "-d",
                                                                "job", sluid))
        for key, value in slurm_cluster.env.items():  # the adapter's commands read SLURM_CONF
            monkeypatch.setenv(key, value)
        sched = SlurmScheduler(squeue=SQUEUE, scontrol=SCONTROL, scancel=SCANCEL, timeout=30)
        node = load_node(os.environ.get("GPUSLURM_BUNDLE", "dgx-h100"))
        found = sched.node_allocations(node_name, node)
        assert [(a.job_id, len(a.uuids)) for a in found] == [(str(job), 2)]
        assert [d.job_id for d in sched.running_job_details(node_name) or ()] == [str(job)]
        if sluid:
            assert sched.job_of_sluid(sluid) == str(job)
        named = sched.job_of_cgroup(cgroup)
        assert named is not None and named.label in (str(job), sluid), cgroup
        assert sched.cancel_job(str(job)) == "cancelled"
        assert slurm_cluster.wait(job) == "CANCELLED"
    finally:
        subprocess.run([SCANCEL, str(job)], env=slurm_cluster.env, check=False, timeout=30)
