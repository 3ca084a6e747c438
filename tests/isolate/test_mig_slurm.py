"""``mig apply`` in the real test cluster: the node is drained while nvidia-smi runs (seen from
inside the stand-in), waits for running jobs, is resumed afterwards, and stays drained with a
reason when a step fails. nvidia-smi is the stand-in; scontrol and squeue are Slurm's own.

gres.conf is regenerated into a file of this test, not the cluster's: the cluster's slurm.conf
names 8 whole H100s, and other test modules share the cluster.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from tests.helpers.mig_helpers import make_bundle, smi_env, smi_log, write_config

from gpuslurm.gres.conf_parse import parse_gres_conf
from gpuslurm.slurm.mig_apply import node_field

if TYPE_CHECKING:
    from tests.helpers.cluster_fixture import SlurmCluster

pytestmark = pytest.mark.slurm

SCONTROL = "/usr/bin/scontrol"
SCANCEL = "/usr/bin/scancel"


@dataclass
class MigCluster:
    cluster: SlurmCluster
    root: Path
    bundle: Path
    node: str
    env: dict[str, str]

    def show(self) -> str:
        return subprocess.run([SCONTROL, "-o", "show", "node", self.node], env=self.cluster.env,
                              capture_output=True, text=True, check=True, timeout=30).stdout

    def state(self) -> str:
        return node_field(self.show(), "State")

    def wait_state(self, want_drain: bool, timeout: float = 30) -> str:
        deadline = time.monotonic() + timeout
        state = ""
        while time.monotonic() < deadline:
            state = self.state()
            if ("DRAIN" in state.split("+")) is want_drain and "COMPLETING" not in state:
                return state
            time.sleep(0.3)
        raise TimeoutError(f"node {self.node} is {state}\n{self.cluster.log_tail()}")

    def apply(self, layout: str, *args: str, **smi: str) -> subprocess.CompletedProcess[str]:
        path = self.root / "layout.toml"
        path.write_text(layout)
        env = {**self.env, **smi_env(self.bundle, self.root / "smi.log", **smi)}
        return subprocess.run(
            [sys.executable, "-m", "gpuslurm", "mig", "apply", str(path), "--from", str(self.bundle),
             "--node", self.node, "--poll-s", "0.3", *args],
            env=env, capture_output=True, text=True, timeout=120, check=False)

    def resume(self) -> None:
        subprocess.run([SCONTROL, "update", f"NodeName={self.node}", "State=RESUME"], env=self.cluster.env,
                       capture_output=True, timeout=30, check=False)

    def wait_running(self, jobid: int, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while self.cluster.state(jobid) != "RUNNING":
            if time.monotonic() > deadline:
                raise TimeoutError(f"job {jobid} is {self.cluster.state(jobid)}\n{self.cluster.log_tail()}")
            time.sleep(0.2)


@pytest.fixture(scope="module")
def mc(slurm_cluster: SlurmCluster) -> Iterator[MigCluster]:
    root = Path(tempfile.mkdtemp(prefix="gpuslurm-mig-"))
    root.chmod(0o755)
    bundle = make_bundle(root, "dgx-h100")
    node = subprocess.run(["/bin/hostname", "-s"], capture_output=True, text=True, check=True).stdout.strip()
    snoop = root / "snoop.sh"  # run by the stand-in on every call: the node's state at that moment
    snoop.write_text(f"#!/bin/sh\nexec {SCONTROL} -o show node {node}\n")
    snoop.chmod(0o755)
    config = write_config(root / "gpuslurm.toml", scontrol=SCONTROL, squeue="/usr/bin/squeue")
    config.write_text(config.read_text() + "[hooks]\ncommand_timeout_s = 20\n")
    env = {**slurm_cluster.env, "GPUSLURM_CONFIG": str(config), "FAKE_NVIDIA_SMI_SNOOP": str(snoop)}
    env.pop("GPUSLURM_CAPTURE", None)
    mc = MigCluster(slurm_cluster, root, bundle, node, env)
    mc.wait_state(want_drain=False)
    try:
        yield mc
    finally:
        mc.resume()
        try:
            mc.wait_state(want_drain=False)
        except TimeoutError as exc:
            print(f"node did not come back: {exc}", file=sys.stderr)
        if not os.environ.get("GPUSLURM_KEEP_CLUSTER"):
            shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def fresh_log(mc: MigCluster) -> Iterator[Path]:
    log = mc.root / "smi.log"
    log.unlink(missing_ok=True)
    yield log
    mc.resume()
    mc.wait_state(want_drain=False)


def test_apply_waits_for_jobs_reconfigures_drained_and_resumes(mc: MigCluster, fresh_log: Path) -> None:
    jobid = mc.cluster.sbatch(["--gres=gpu:1"], "sleep 3\n")
    mc.wait_running(jobid)
    gres = mc.root / "gres.conf"
    result = mc.apply('[gpus."0-1"]\nprofiles = ["3g.40gb", "3g.40gb"]\n', "--wait-s", "60",
                      "--gres-conf", str(gres))
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"waiting for jobs {jobid} to end" in result.stdout
    assert mc.cluster.state(jobid) == "COMPLETED"
    calls = smi_log(fresh_log)
    assert len(calls) == 6  # per GPU: mode, mode check, create
    for call in calls:  # at every nvidia-smi call the node was drained and held no job
        state = node_field(str(call["snoop"]), "State")
        assert state.split("+")[:2] == ["IDLE", "DRAIN"], (call["argv"], state)
        assert node_field(str(call["snoop"]), "Reason").startswith("gpuslurm: MIG reconfiguration")
    assert "DRAIN" not in mc.wait_state(want_drain=False)
    entries = parse_gres_conf(gres.read_text(), str(gres), None)
    mig = [e for e in entries if len(e.files) == 3]
    assert len(mig) == 4 and all(str(e.type).endswith("_3g.39gb") for e in mig)
    assert {e.files[0] for e in mig} == {"/dev/nvidia0", "/dev/nvidia1"}
    assert len([e for e in entries if len(e.files) == 1]) == 6  # GPUs 2-7 stay whole
    check = subprocess.run([sys.executable, "-m", "gpuslurm", "mig", "assert", str(mc.root / "layout.toml"),
                            "--from", str(mc.bundle)], env=mc.env, capture_output=True, text=True,
                           timeout=60, check=False)
    assert check.returncode == 0, check.stdout + check.stderr


def test_a_failed_create_leaves_the_node_drained_with_the_reason(mc: MigCluster, fresh_log: Path) -> None:
    layout = '[gpus.2]\nprofiles = ["3g.40gb", "3g.40gb"]\n'
    result = mc.apply(layout, fail="cgi")
    assert result.returncode == 4, result.stdout + result.stderr
    assert "GPU 2: create failed" in result.stderr and "left DRAINED" in result.stdout
    time.sleep(1)  # give a wrong resume the chance to show
    shown = mc.show()
    assert "DRAIN" in node_field(shown, "State").split("+")
    assert node_field(shown, "Reason").startswith(
        "gpuslurm: MIG reconfiguration failed: GPU 2: create failed: nvidia-smi exited 3: Unable to "
        "create a GPU instance on GPU 2 using profile 3g.40gb")
    # Once the cause is gone, a second apply takes over its own drain, finishes and resumes.
    again = mc.apply(layout)
    assert again.returncode == 0, again.stdout + again.stderr
    assert [c["argv"] for c in smi_log(fresh_log)][-3:] == [  # the half-built GPU is rebuilt
        ["mig", "-i", "2", "-dci"], ["mig", "-i", "2", "-dgi"],
        ["mig", "-i", "2", "-cgi", "3g.40gb,3g.40gb", "-C"]]
    assert "DRAIN" not in mc.wait_state(want_drain=False)


def test_jobs_that_outlast_wait_s_abort_the_apply_and_resume_the_node(mc: MigCluster,
                                                                       fresh_log: Path) -> None:
    jobid = mc.cluster.sbatch(["--gres=gpu:1"], "sleep 60\n")
    try:
        mc.wait_running(jobid)
        result = mc.apply('[gpus.4]\nprofiles = ["7g.80gb"]\n', "--wait-s", "1")
        assert result.returncode == 4, result.stdout + result.stderr
        assert f"jobs {jobid} still run after 1 s; MIG not changed" in result.stderr
        assert smi_log(fresh_log) == []
        state = mc.state()
        assert "DRAIN" not in state.split("+") and mc.cluster.state(jobid) == "RUNNING"
    finally:
        subprocess.run([SCANCEL, str(jobid)], env=mc.cluster.env, capture_output=True, timeout=30,
                       check=False)
        mc.cluster.wait(jobid)


def test_a_node_drained_by_someone_else_stays_drained(mc: MigCluster, fresh_log: Path) -> None:
    subprocess.run([SCONTROL, "update", f"NodeName={mc.node}", "State=DRAIN", "Reason=admin: new PSU"],
                   env=mc.cluster.env, capture_output=True, timeout=30, check=True)
    result = mc.apply('[gpus.5]\nprofiles = ["4g.40gb"]\n')
    assert result.returncode == 0, result.stdout + result.stderr
    assert "left drained, as it was before mig apply" in result.stdout
    shown = mc.show()
    assert "DRAIN" in node_field(shown, "State").split("+")
    assert node_field(shown, "Reason").startswith("admin: new PSU")
    assert len(smi_log(fresh_log)) == 3
