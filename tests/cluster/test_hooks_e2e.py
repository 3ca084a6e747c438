"""The prolog, epilog and task prolog inside the real test cluster (an emulated DGX H100).

The session cluster is reconfigured for this module only: ``Prolog=``, ``Epilog=`` and
``TaskProlog=`` lines are added to its slurm.conf and ``scontrol reconfigure`` applies them; the
original file is restored (and the node resumed) afterwards, so other modules see the cluster
as it was. The hooks are the executables ``gpuslurm install`` writes, into a root-owned prefix of
ours, with our config (run and state directories of ours) and the replay bundle baked in
(``--config``, ``--replay``): slurmd passes them only SLURM_* variables, as on a real node.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from tests.helpers.cluster_fixture import install_hooks
from tests.helpers.slurm_helpers import (
    SCONTROL,
    NodeControl,
    conf_with,
    hook_lines,
    hooks_paths,
    hooks_root,
    short_hostname,
)

from gpuslurm.hw.source import load_node

if TYPE_CHECKING:
    from tests.helpers.cluster_fixture import SlurmCluster

pytestmark = pytest.mark.slurm



@dataclass
class HookedCluster(NodeControl):
    cluster: SlurmCluster
    root: Path
    bundle: Path
    node: str
    uuids: list[str]

    @property
    def jobs_dir(self) -> Path:
        return self.root / "run" / "jobs"

    def summary(self, jobid: int) -> Path:
        return self.root / "state" / "jobs" / f"{jobid}-summary.json"

    def hook_log(self) -> str:
        """What the hooks wrote to stderr, as slurmd logged it."""
        path = self.cluster.log_dir / "slurmd.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def node_detail(self) -> str:
        return f"{self.cluster.log_tail()}\n{self.hook_log()}"


@pytest.fixture(scope="module")
def hooked(slurm_cluster: SlurmCluster) -> Iterator[HookedCluster]:
    root, bundle = hooks_root("gpuslurm-hooks-")
    config = root / "gpuslurm.toml"
    config.write_text(hooks_paths(root, slurm_cluster) + '[hooks]\ncommand_timeout_s = 20\n')
    prefix = install_hooks(root, config, bundle)
    original = slurm_cluster.conf.read_text()
    hc = HookedCluster(slurm_cluster, root, bundle, short_hostname(),
                       [g.uuid for g in load_node(str(bundle)).gpus])
    slurm_cluster.conf.write_text(conf_with(original, hook_lines(prefix)))
    try:
        hc.scontrol("reconfigure")
        hc.wait_node(r"^IDLE")
        yield hc
    finally:
        hc.restore(original)
        if not os.environ.get("GPUSLURM_KEEP_CLUSTER"):
            shutil.rmtree(root, ignore_errors=True)


def test_four_gpu_job_is_mapped_hinted_and_summarised(hooked: HookedCluster) -> None:
    script = (f'cat {hooked.jobs_dir}/$SLURM_JOB_ID.json; echo\n'
              'echo "JOB_GPUS=$SLURM_JOB_GPUS"\n'
              'env | grep -E "^(GPUSLURM_|CUDA_)" | sed "s/^/ENV /"\n')
    # without slurmdbd Slurm takes any account name; the prolog sees it as SLURM_JOB_ACCOUNT
    jobid = hooked.cluster.sbatch(["--gres=gpu:4", "--account=physics"], script)
    state = hooked.cluster.wait(jobid, timeout=60)
    out = hooked.cluster.output(jobid)
    assert state == "COMPLETED", f"{out}\n{hooked.hook_log()}\n{hooked.cluster.log_tail()}"
    jmap = json.loads(out.splitlines()[0])
    assert jmap["account"] == "physics"
    indices = [int(i) for i in re.search(r"^JOB_GPUS=(.*)$", out, re.M).group(1).split(",")]  # type: ignore[union-attr]
    expected = [hooked.uuids[i] for i in indices]
    assert len(expected) == 4
    assert [g["uuid"] for g in jmap["gpus"]] == expected
    assert jmap["job_id"] == str(jobid) and jmap["user"] == "root"
    env = dict(re.findall(r"^ENV (\w+)=(.*)$", out, re.M))
    assert env["CUDA_VISIBLE_DEVICES"] == "0,1,2,3"  # Slurm's own value, kept
    assert env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    assert env["GPUSLURM_GPU_UUIDS"] == ",".join(expected)
    assert env["GPUSLURM_GPU_UUID"] == expected[0]
    assert env["GPUSLURM_NUMA_NODE"] == ("0" if indices[0] < 4 else "1")
    # after the job: the epilog removed the map and wrote the summary
    assert not (hooked.jobs_dir / f"{jobid}.json").exists()
    summary = json.loads(hooked.summary(jobid).read_text())
    assert [g["uuid"] for g in summary["gpus"]] == expected
    assert summary["start"] <= summary["end"]


def test_unhealthy_gpu_drains_the_node_with_a_reason_naming_it(hooked: HookedCluster) -> None:
    sick = 5
    (hooked.bundle / "health.json").write_text(json.dumps({hooked.uuids[sick]: {"temperature_c": 97}}))
    jobid = None
    try:
        jobid = hooked.cluster.sbatch(["--gres=gpu:8"], "echo should not run\n")
        hooked.wait_node(r"DRAIN", timeout=60)
        reason = hooked.node_field("Reason")
        named = f"GPU index {sick} (/dev/nvidia{sick}, {hooked.uuids[sick]})"  # dgx-h100: minor == index
        assert f"gpuslurm: {named}: temperature 97 C over limit 85 C" in reason, \
            f"{reason}\n{hooked.hook_log()}"
        assert hooked.cluster.state(jobid) != "COMPLETED"
        assert not (hooked.jobs_dir / f"{jobid}.json").exists()
    finally:
        (hooked.bundle / "health.json").unlink(missing_ok=True)
        if jobid is not None:
            subprocess.run(["/usr/bin/scancel", str(jobid)], env=hooked.cluster.env, timeout=30, check=False)
        hooked.scontrol("update", f"NodeName={hooked.node}", "State=RESUME")
        hooked.wait_node(r"^IDLE", timeout=60)


def test_epilog_kills_a_leftover_and_tries_the_admin_comment(hooked: HookedCluster,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """A process recorded on the job's GPU in health.json (a real ``sleep`` run as nobody, outside
    the job so Slurm does not reap it) is killed by the epilog; the AdminComment attempt is
    refused by Slurm 22.05 for a finished job and only logged; on a live job it is taken as is."""
    import select
    import signal

    from gpuslurm.slurm.scontrol import MAX_ADMIN_COMMENT, set_admin_comment

    config = hooked.root / "gpuslurm.toml"
    original = config.read_text()
    out = subprocess.run(["/bin/sh", "-c", '/bin/sleep 300 </dev/null >/dev/null 2>&1 & echo $!'], user=65534,
                         group=65534, extra_groups=[], capture_output=True, text=True, check=True, timeout=10)
    pid = int(out.stdout)
    pidfd = os.pidfd_open(pid)
    health = hooked.bundle / "health.json"
    try:
        config.write_text(original + "[epilog]\nadmin_comment = true\nkill_grace_s = 1\n")
        facts = json.dumps({hooked.uuids[2]: {"processes": [{"pid": pid, "user": "nobody"}]}})
        # the job itself records the process, so the prolog's health gate saw a clean GPU
        jobid = hooked.cluster.sbatch(["--gres=gpu:8"], f"cat > {health} <<'EOF'\n{facts}\nEOF\n")
        state = hooked.cluster.wait(jobid, timeout=60)
        assert state == "COMPLETED", f"{hooked.hook_log()}\n{hooked.cluster.log_tail()}"
        deadline = time.monotonic() + 30
        while not hooked.summary(jobid).exists() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert select.select([pidfd], [], [], 10)[0], f"pid {pid} still runs\n{hooked.hook_log()}"
        summary = json.loads(hooked.summary(jobid).read_text())
        assert summary["leftovers"] == [{"gpu": hooked.uuids[2], "pid": pid, "user": "nobody",
                                         "outcome": "exited after SIGTERM"}]
        assert summary["faults"] == [] and summary["monitor"] == "no monitor data"
        assert "DRAIN" not in hooked.node_field("State")
        # Slurm 22.05 refuses job updates once the job finished, and the epilog runs after that:
        # never fatal (the node is not drained, above), and the finished job keeps no comment.
        # slurmd does not log what a successful epilog writes to stderr, so the info line itself
        # ("Slurm does not update a finished job") is checked in tests/hooks/test_epilog_admin_comment.py.
        shown = hooked.scontrol("show", "job", str(jobid))
        assert re.search(r"^\s*AdminComment=\(null\)\s*$", shown, re.M) or "AdminComment=" not in shown, shown
        # on a live job, Slurm takes one argv item as it is: quotes, %, =, commas, the full length
        live = hooked.cluster.sbatch([], "sleep 60\n")
        try:
            odd = "gpuslurm: it's \"quoted\" 100% a=b, c;d " + "x" * MAX_ADMIN_COMMENT
            monkeypatch.setenv("SLURM_CONF", str(hooked.cluster.conf))  # as slurmd gives the hooks
            set_admin_comment(str(live), odd, scontrol=SCONTROL, timeout=30)
            shown = hooked.scontrol("show", "job", str(live))
            match = re.search(r"^\s*AdminComment=(.*)$", shown, re.M)
            assert match is not None, shown
            assert match.group(1).rstrip() == odd[: MAX_ADMIN_COMMENT - 3] + "...", repr(match.group(1)[-20:])
        finally:
            subprocess.run(["/usr/bin/scancel", str(live)], env=hooked.cluster.env, timeout=30, check=False)
    finally:
        config.write_text(original)
        health.unlink(missing_ok=True)
        try:  # through the pidfd: never a reused PID
            signal.pidfd_send_signal(pidfd, signal.SIGKILL)
        except ProcessLookupError:
            pass
        os.close(pidfd)
