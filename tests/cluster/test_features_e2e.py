"""Hardware features in a real Slurm: the node line cluster.sh takes from ``gpuslurm node-conf``
carries ``Features=`` (an emulated DGX H100: h100, gpumem_80g, cc_9.0, nvlink, nvswitch), and jobs
ask for capabilities with ``--constraint``: a satisfiable one runs, one no node offers is refused
at submission with Slurm's reason, and one the node offers but is busy with stays PENDING."""

from __future__ import annotations

import re
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from tests.helpers.cluster_fixture import SlurmCluster

pytestmark = pytest.mark.slurm

SCONTROL = "/usr/bin/scontrol"
SCANCEL = "/usr/bin/scancel"


def _node_features(cluster: SlurmCluster) -> set[str]:
    out = subprocess.run([SCONTROL, "-o", "show", "node"], env=cluster.env, capture_output=True, text=True,
                         timeout=30, check=True).stdout
    match = re.search(r"\bAvailableFeatures=(\S+)", out)
    assert match, out
    return set(match.group(1).split(","))


def _reason(cluster: SlurmCluster, jobid: int) -> str:
    out = subprocess.run([SCONTROL, "-o", "show", "job", str(jobid)], env=cluster.env, capture_output=True,
                         text=True, timeout=30, check=True).stdout
    match = re.search(r"\bReason=(\S+)", out)
    return match.group(1) if match else ""


def test_the_node_has_its_hardware_features(slurm_cluster: SlurmCluster) -> None:
    features = _node_features(slurm_cluster)
    wanted = {"h100", "gpumem_80g", "gpumem_ge_40g", "gpumem_ge_80g", "cc_9.0", "nvlink", "nvswitch"}
    assert wanted <= features
    assert "gpumem_ge_94g" not in features and "mig" not in features


@pytest.mark.parametrize("constraint", ["gpumem_80g", "h100&cc_9.0&nvswitch", "gpumem_ge_40g",
                                        "gpumem_ge_48g", "h100|gpumem_ge_48g"])
def test_a_satisfiable_constraint_runs(slurm_cluster: SlurmCluster, constraint: str) -> None:
    job = slurm_cluster.sbatch(["--gres=gpu:1", f"--constraint={constraint}"], "echo ran\n")
    assert slurm_cluster.wait(job) == "COMPLETED", slurm_cluster.log_tail()
    assert "ran" in slurm_cluster.output(job)


# The last: an OR naming a feature no node has is refused too (Slurm 22.05), which is why "at
# least N GiB" is one gpumem_ge_ feature rather than an OR of the memory classes.
@pytest.mark.parametrize("constraint", ["gpumem_ge_94g", "l40s", "cc_8.0", "l40s|gpumem_ge_48g"])
def test_a_constraint_no_node_offers_is_refused_at_submission(slurm_cluster: SlurmCluster,
                                                              constraint: str) -> None:
    with pytest.raises(RuntimeError, match="Invalid feature specification"):
        slurm_cluster.sbatch(["--gres=gpu:1", f"--constraint={constraint}"], "true\n")


def test_a_satisfiable_constraint_waits_while_the_node_is_busy(slurm_cluster: SlurmCluster) -> None:
    holder = slurm_cluster.sbatch(["--gres=gpu:8", "--exclusive"], "sleep 30\n")
    try:
        deadline = time.monotonic() + 30
        while slurm_cluster.state(holder) != "RUNNING":
            assert time.monotonic() < deadline, slurm_cluster.log_tail()
            time.sleep(0.2)
        waiter = slurm_cluster.sbatch(["--gres=gpu:1", "--constraint=gpumem_ge_80g"], "echo ran\n")
        time.sleep(2)
        assert slurm_cluster.state(waiter) == "PENDING"
        assert _reason(slurm_cluster, waiter) in ("Resources", "Priority")
    finally:
        subprocess.run([SCANCEL, str(holder)], env=slurm_cluster.env, timeout=30, check=False)
    assert slurm_cluster.wait(waiter, timeout=60) == "COMPLETED", slurm_cluster.log_tail()


SBATCH = "/usr/bin/sbatch"
PLUGIN = Path(__file__).resolve().parents[2] / "plugins" / "job_submit.lua"


@pytest.fixture(scope="module")
def with_plugin(slurm_cluster: SlurmCluster) -> Iterator[SlurmCluster]:
    """gpuslurm's job_submit.lua beside slurm.conf (JobSubmitPlugins=lua), for this module."""
    etc = slurm_cluster.conf.parent
    original = slurm_cluster.conf.read_text()
    try:
        (etc / "job_submit.lua").write_text(PLUGIN.read_text())
        slurm_cluster.conf.write_text(original.replace("\nNodeName=", "\nJobSubmitPlugins=lua\nNodeName=", 1))
        subprocess.run([SCONTROL, "reconfigure"], env=slurm_cluster.env, timeout=60, check=True)
        yield slurm_cluster
    finally:
        slurm_cluster.conf.write_text(original)
        subprocess.run([SCONTROL, "reconfigure"], env=slurm_cluster.env, timeout=60, check=False)
        (etc / "job_submit.lua").unlink(missing_ok=True)


def _submit(cluster: SlurmCluster, comment: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([SBATCH, "--parsable", "--gres=gpu:1", f"--comment={comment}", "--output=/dev/null",
                           "--wrap=true"], env=cluster.env, capture_output=True, text=True, timeout=30,
                          check=False)


def test_a_memory_request_in_the_comment_becomes_the_constraint(with_plugin: SlurmCluster) -> None:
    ok = _submit(with_plugin, "train gpuslurm:mem>=40G")
    assert ok.returncode == 0, ok.stderr
    assert "gpuslurm: gpuslurm:mem>=40G asks for --constraint=gpumem_ge_40g" in ok.stderr
    job = int(ok.stdout.strip().split(";")[0])
    out = subprocess.run([SCONTROL, "-o", "show", "job", str(job)], env=with_plugin.env, capture_output=True,
                         text=True, timeout=30, check=True).stdout
    assert re.search(r"\bFeatures=gpumem_ge_40g\b", out), out
    assert with_plugin.wait(job) == "COMPLETED"

    beyond_the_node = _submit(with_plugin, "gpuslurm:mem>=100G")  # gpumem_ge_128g: no node has it
    assert beyond_the_node.returncode != 0 and "Invalid feature specification" in beyond_the_node.stderr
    malformed = _submit(with_plugin, "gpuslurm:mem>=40")
    assert malformed.returncode != 0 and "malformed GPU memory request" in malformed.stderr, malformed.stderr
