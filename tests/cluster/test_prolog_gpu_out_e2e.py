"""The installed prolog with ``[health.xid] action = "gpu_out"`` in the real cluster (issue 12).

Every replayed GPU reports Xid 79, so whichever GPU Slurm gives a one-GPU job is faulty. The prolog takes
that GPU out of service, drains the node for new jobs with the GPU-out reason and requeues the job
itself, exiting 0: Slurm does not drain the node for a prolog error. The monitor's next cycle puts
a holder job on the GPU and resumes the node, which then serves the other seven GPUs.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from tests.helpers.cluster_fixture import install_hooks

from gpuslurm.hw.source import BUILTIN_DIR, load_node

if TYPE_CHECKING:
    from tests.helpers.cluster_fixture import SlurmCluster

pytestmark = pytest.mark.slurm

SCONTROL, SCANCEL = "/usr/bin/scontrol", "/usr/bin/scancel"


def _field(text: str, name: str) -> str:
    m = re.search(rf"\b{name}=(.*?)(?= [A-Za-z]+=|$)", text.strip())
    return m.group(1) if m else ""


def test_prolog_takes_the_gpu_out_requeues_the_job_and_the_node_stays_up(
        slurm_cluster: SlurmCluster) -> None:
    c = slurm_cluster
    root = Path(tempfile.mkdtemp(prefix="gpuslurm-pgo-"))
    root.chmod(0o755)
    bundle = root / "bundle"
    shutil.copytree(BUILTIN_DIR / "dgx-h100", bundle)
    uuids = [g.uuid for g in load_node(str(bundle)).gpus]
    (bundle / "health.json").write_text(json.dumps({u: {"xid": [79]} for u in uuids}))
    config = root / "gpuslurm.toml"
    config.write_text(f'[paths]\nrun_dir = "{root / "run"}"\nstate_dir = "{root / "state"}"\n'
                      f'scontrol = "{SCONTROL}"\n'
                      f'slurm_cgroup_conf = "{c.conf.parent / "cgroup.conf"}"\n'
                      '[hooks]\ncommand_timeout_s = 20\n[health.xid]\naction = "gpu_out"\n'
                      '[monitor]\nkmsg = ""\n')
    prefix = install_hooks(root, config, bundle)
    node = subprocess.run(["/bin/hostname", "-s"], capture_output=True, text=True, check=True).stdout.strip()
    original = c.conf.read_text()
    env = {**c.env, "GPUSLURM_CONFIG": str(config)}
    job = None

    def show(kind: str, ident: str) -> str:
        return subprocess.run([SCONTROL, "-o", "show", kind, ident], env=c.env, capture_output=True,
                              text=True, timeout=30, check=True).stdout

    try:
        c.conf.write_text(original.replace("\nNodeName=", f"\nProlog={prefix}/gpuslurm-prolog\nNodeName=",
                                           1))
        subprocess.run([SCONTROL, "reconfigure"], env=c.env, check=True, timeout=30)
        time.sleep(2)
        job = c.sbatch(["--gres=gpu:1"], "echo ran\n")
        record = root / "state" / "out-of-service.json"
        deadline = time.monotonic() + 60
        while not record.exists():
            assert time.monotonic() < deadline, c.log_tail()
            time.sleep(0.5)
        time.sleep(2)
        [gone] = json.loads(record.read_text())["gpus"]
        assert gone["by"] == "prolog" and "Xid 79" in gone["reason"]
        shown = show("node", node)
        assert _field(shown, "Reason").startswith(f"gpuslurm: GPU out: index {gone['index']}"), shown
        assert "Prolog" not in _field(shown, "Reason")  # Slurm did not drain it for a failed prolog
        job_text = show("job", str(job))
        assert _field(job_text, "JobState") == "PENDING", job_text
        assert "gpuslurm requeued this job" in _field(job_text, "Comment")
        (bundle / "health.json").unlink()  # the other GPUs are healthy again for what follows
        said = subprocess.run([sys.executable, "-m", "gpuslurm", "monitor", "--once", "--from",
                               str(bundle)], env=env, capture_output=True, text=True, timeout=120,
                              check=False)
        assert said.returncode == 0, said.stderr
        shown = show("node", node)
        assert "DRAIN" not in _field(shown, "State"), f"{shown}\n{said.stderr}"
        assert "held out by job" in said.stderr, said.stderr
        job_text = show("job", str(job))
        why = _field(job_text, "Reason")
        print(f"requeued job: JobState={_field(job_text, 'JobState')} Reason={why} "
              f"EligibleTime={_field(job_text, 'EligibleTime')}", file=sys.stderr)
        assert "held" not in why.lower() and "Hold" not in why  # requeued, not held: not the user's fault
        if why == "BeginTime":  # 22.05 makes a requeued batch job wait before it is eligible again
            subprocess.run([SCONTROL, "update", f"JobId={job}", "StartTime=now"], env=c.env, check=True,
                           timeout=30)
        assert c.wait(job, timeout=90) == "COMPLETED"  # the requeued job ran on another GPU
    finally:
        if job is not None:
            subprocess.run([SCANCEL, str(job)], env=c.env, capture_output=True, timeout=30, check=False)
        subprocess.run([SCANCEL, f"--name=gpuslurm-gpu-out-{node}"], env=c.env, capture_output=True,
                       timeout=30, check=False)
        c.conf.write_text(original)
        subprocess.run([SCONTROL, "reconfigure"], env=c.env, capture_output=True, timeout=30, check=False)
        for args in (("State=RESUME",), ("Comment=",)):
            subprocess.run([SCONTROL, "update", f"NodeName={node}", *args], env=c.env, capture_output=True,
                           timeout=30, check=False)
        shutil.rmtree(root, ignore_errors=True)
