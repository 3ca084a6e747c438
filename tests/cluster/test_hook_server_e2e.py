"""The hook server in the real test cluster: slurmd's Prolog and Epilog (the executables
``gpuslurm install`` writes) served by ``gpuslurm hook-server``, the same jobs and verdicts as
without it, and without it again when it stops.

As tests/cluster/test_hooks_e2e.py: the session cluster gets ``Prolog=``, ``Epilog=`` and
``TaskProlog=`` lines for this module only. The server runs where slurmd runs (in the release's
root, for 24.11 and 26.05), listening where install told the hooks to look (the config's
run_dir is ours, so install wrote ``GPUSLURM_HOOK_SOCKET`` into the prolog and the epilog).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from tests.helpers import slurm_roots
from tests.helpers.cluster_fixture import install_hooks
from tests.helpers.slurm_helpers import (
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
class Served(NodeControl):
    cluster: SlurmCluster
    root: Path
    bundle: Path
    node: str
    uuids: list[str]
    server: subprocess.Popen[str] | None = None

    @property
    def sock(self) -> Path:
        return self.root / "run" / "hooks.sock"

    def start(self) -> None:
        python = sys.executable if slurm_roots.active() is None else slurm_roots.VENV_PYTHON
        self.server = subprocess.Popen(slurm_roots.on_node([python, "-m", "gpuslurm", "hook-server",
                                                             "--socket", str(self.sock)]),
                                       stderr=subprocess.PIPE, text=True)
        assert self.server.stderr is not None
        line = self.server.stderr.readline()
        assert "serving the prolog and the epilog" in line, line

    def stop(self, sig: int = signal.SIGTERM) -> str:
        """Stop the server; its stderr (the last line counts the hooks its forks ran)."""
        assert self.server is not None
        self.server.send_signal(sig)
        _, err = self.server.communicate(timeout=30)
        self.server = None
        return err

    def hook_log(self) -> str:
        path = self.cluster.log_dir / "slurmd.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def summary(self, jobid: int) -> Path:
        return self.root / "state" / "jobs" / f"{jobid}-summary.json"


@pytest.fixture(scope="module")
def served(slurm_cluster: SlurmCluster) -> Iterator[Served]:
    root, bundle = hooks_root("gpuslurm-hook-server-")
    config = root / "gpuslurm.toml"
    config.write_text(hooks_paths(root, slurm_cluster) + "[hooks]\ncommand_timeout_s = 20\n")
    prefix = install_hooks(root, config, bundle)
    assert f"GPUSLURM_HOOK_SOCKET={root / 'run' / 'hooks.sock'}" in (prefix / "gpuslurm-prolog").read_text()
    original = slurm_cluster.conf.read_text()
    sv = Served(slurm_cluster, root, bundle, short_hostname(), [g.uuid for g in load_node(str(bundle)).gpus])
    slurm_cluster.conf.write_text(conf_with(original, hook_lines(prefix)))
    try:
        sv.scontrol("reconfigure")
        sv.wait_node(r"^IDLE")
        yield sv
    finally:
        if sv.server is not None:
            sv.stop(signal.SIGKILL)
        sv.restore(original)
        if not os.environ.get("GPUSLURM_KEEP_CLUSTER"):
            shutil.rmtree(root, ignore_errors=True)


def _hooks_served(err: str) -> int:
    match = re.search(r"stopped after (\d+) hook\(s\)", err)
    assert match, err
    return int(match.group(1))


def _two_gpu_job(sv: Served) -> tuple[int, str]:
    script = f'cat {sv.root / "run" / "jobs"}/$SLURM_JOB_ID.json; echo\nenv | grep ^GPUSLURM_GPU_UUIDS=\n'
    jobid = sv.cluster.sbatch(["--gres=gpu:2"], script)
    state = sv.cluster.wait(jobid, timeout=60)
    out = sv.cluster.output(jobid)
    assert state == "COMPLETED", f"{out}\n{sv.hook_log()}\n{sv.cluster.log_tail()}"
    return jobid, out


def test_a_job_is_mapped_hinted_and_summarised_by_the_served_hooks(served: Served) -> None:
    served.start()
    try:
        jobid, out = _two_gpu_job(served)
    finally:
        err = served.stop()
    assert _hooks_served(err) == 2, err  # this job's prolog and epilog, nothing run beside
    jmap = json.loads(out.splitlines()[0])
    uuids = [g["uuid"] for g in jmap["gpus"]]
    assert len(uuids) == 2 and set(uuids) <= set(served.uuids)
    assert f"GPUSLURM_GPU_UUIDS={','.join(uuids)}" in out  # the task prolog read the served prolog's file
    assert [g["uuid"] for g in json.loads(served.summary(jobid).read_text())["gpus"]] == uuids
    assert not (served.root / "run" / "jobs" / f"{jobid}.json").exists()


def test_a_served_prolog_drains_the_node_for_a_sick_gpu_as_the_hook_does(served: Served) -> None:
    sick = 3
    (served.bundle / "health.json").write_text(json.dumps({served.uuids[sick]: {"temperature_c": 97}}))
    served.start()
    jobid = None
    try:
        jobid = served.cluster.sbatch(["--gres=gpu:8"], "echo should not run\n")
        served.wait_node(r"DRAIN", timeout=60)
        reason = served.node_field("Reason")
        assert f"{served.uuids[sick]}): temperature 97 C over limit 85 C" in reason, reason
        assert served.cluster.state(jobid) != "COMPLETED"
    finally:
        (served.bundle / "health.json").unlink(missing_ok=True)
        if jobid is not None:
            subprocess.run(["/usr/bin/scancel", str(jobid)], env=served.cluster.env, timeout=30, check=False)
        err = served.stop()
        served.scontrol("update", f"NodeName={served.node}", "State=RESUME")
        served.wait_node(r"^IDLE", timeout=60)
    assert _hooks_served(err) >= 1, err


def test_with_the_server_killed_the_hooks_run_on_their_own(served: Served) -> None:
    """SIGKILL leaves the socket behind with nobody listening: the next job's prolog and epilog
    find no server and run the hook themselves."""
    served.start()
    served.stop(signal.SIGKILL)
    assert served.sock.exists()
    jobid, out = _two_gpu_job(served)
    assert json.loads(served.summary(jobid).read_text())["gpus"]
    assert "GPUSLURM_GPU_UUIDS=" in out


def test_the_c_client_has_a_job_served(served: Served) -> None:
    """`gpuslurm install --c-client` (the host's Slurm: the releases' roots carry no C compiler):
    slurmd's prolog and epilog start the C client, which the server serves."""
    if slurm_roots.active() is not None:
        pytest.skip("the release's root has no C compiler for --c-client")
    config = served.root / "gpuslurm.toml"
    prefix = install_hooks(served.root, config, served.bundle, c_client=True)
    try:
        assert "gpuslurm-hook-client prolog " in (prefix / "gpuslurm-prolog").read_text()
        served.start()
        try:
            jobid, out = _two_gpu_job(served)
        finally:
            err = served.stop()
        assert _hooks_served(err) == 2, err
        assert json.loads(served.summary(jobid).read_text())["gpus"]
        assert "GPUSLURM_GPU_UUIDS=" in out
    finally:
        install_hooks(served.root, config, served.bundle)  # the module's hooks, as they were
