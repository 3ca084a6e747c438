"""``gpuslurm health --act`` as the real slurmd's HealthCheckProgram (issue 12, "Done when").

slurmd runs the program every HealthCheckInterval and ignores its exit status, so the program acts
itself: with the replayed GPU 5 reporting 3 uncorrectable ECC errors and ``[health.ecc] action =
"drain"``, slurmd's own run of it drains the node with a reason naming GPU 5. The session cluster's
slurm.conf is restored and the node resumed at the end.
"""

from __future__ import annotations

import json
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from gpuslurm.hw.source import bundle_path, load_node

if TYPE_CHECKING:
    from cluster_fixture import SlurmCluster

pytestmark = pytest.mark.slurm

SCONTROL = "/usr/bin/scontrol"
HOST = socket.gethostname().split(".")[0]
GPU5 = load_node("dgx-h100").gpus[5]


def test_health_check_program_drains_the_node_naming_the_gpu(slurm_cluster: SlurmCluster) -> None:
    c = slurm_cluster
    root = Path(tempfile.mkdtemp(prefix="gpuslurm-hc-"))
    root.chmod(0o755)
    bundle = root / "bundle"
    src = bundle_path("dgx-h100")
    assert src is not None
    shutil.copytree(src, bundle)
    (bundle / "health.json").write_text(json.dumps({GPU5.uuid: {"ecc_uncorrectable": 3}}))
    config = root / "gpuslurm.toml"
    config.write_text(f'[paths]\nstate_dir = "{root}/state"\n[health.ecc]\naction = "drain"\n')
    program = root / "gpuslurm-health"
    program.write_text(f"#!/bin/sh\nexport GPUSLURM_CONFIG={config} SLURM_CONF={c.conf}\n"
                       f"exec {sys.executable} -m gpuslurm health --act --from {bundle} --node-name {HOST} "
                       f">>{root}/health.log 2>&1\n")
    program.chmod(0o755)
    saved = c.conf.read_text()
    try:
        c.conf.write_text(saved + f"HealthCheckProgram={program}\nHealthCheckInterval=2\n"
                          "HealthCheckNodeState=ANY\n")
        subprocess.run([SCONTROL, "reconfigure"], env=c.env, check=True, timeout=30)
        deadline = time.monotonic() + 60
        while True:
            node = subprocess.run([SCONTROL, "-o", "show", "node", HOST], env=c.env, capture_output=True,
                                  text=True, timeout=30, check=True).stdout
            if "DRAIN" in (m.group(1) if (m := re.search(r"\bState=(\S+)", node)) else ""):
                break
            log = (root / "health.log").read_text() if (root / "health.log").exists() else "(no run yet)"
            assert time.monotonic() < deadline, f"slurmd's health check never drained the node: {log}"
            time.sleep(1)
        assert f"GPU index 5 (/dev/nvidia5, {GPU5.uuid}): 3 uncorrectable ECC errors" in node
        assert "unhealthy" in (root / "health.log").read_text()
    finally:
        c.conf.write_text(saved)
        subprocess.run([SCONTROL, "reconfigure"], env=c.env, capture_output=True, timeout=30, check=False)
        subprocess.run([SCONTROL, "update", f"NodeName={HOST}", "State=RESUME"], env=c.env,
                       capture_output=True, timeout=30, check=False)
        shutil.rmtree(root, ignore_errors=True)
