"""``gpuslurm health --act`` as the real slurmd's HealthCheckProgram (issue 12, "Done when").

``gpuslurm install --health-check`` installs the wrapper and prints the slurm.conf lines; slurmd
runs the program every HealthCheckInterval (with $SLURMD_NODENAME) and ignores its exit status, so
the program acts itself: with the replayed GPU 5 reporting 3 uncorrectable ECC errors and
``[health.ecc] action = "drain"``, slurmd's own run of it drains the node with a reason naming
GPU 5. The session cluster's slurm.conf is restored and the node resumed at the end.
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
    from tests.helpers.cluster_fixture import SlurmCluster

pytestmark = pytest.mark.slurm

SCONTROL = "/usr/bin/scontrol"
HOST = socket.gethostname().split(".")[0]
GPU5 = load_node("dgx-h100").gpus[5]


def test_health_check_program_drains_the_node_naming_the_gpu(slurm_cluster: SlurmCluster) -> None:
    c = slurm_cluster
    root = Path(tempfile.mkdtemp(prefix="gpuslurm-hc-", dir="/run"))  # install refuses a /tmp prefix
    root.chmod(0o755)
    bundle = root / "bundle"
    src = bundle_path("dgx-h100")
    assert src is not None
    shutil.copytree(src, bundle)
    (bundle / "health.json").write_text(json.dumps({GPU5.uuid: {"ecc_uncorrectable": 3}}))
    # the test cluster's slurm.conf is not /etc/slurm's: scontrol is told where it is
    scontrol = root / "scontrol"
    scontrol.write_text(f'#!/bin/sh\nSLURM_CONF={c.conf} exec {SCONTROL} "$@"\n')
    scontrol.chmod(0o755)
    config = root / "gpuslurm.toml"
    config.write_text(f'[paths]\nstate_dir = "{root}/state"\nscontrol = "{scontrol}"\n'
                      '[scheduler]\nkind = "slurm"\n[health.ecc]\naction = "drain"\n')
    config.chmod(0o644)
    etc = root / "etc"
    etc.mkdir()
    installed = subprocess.run([sys.executable, "-m", "gpuslurm", "install", "--slurm-etc", str(etc),
                                "--prefix", str(root / "libexec"), "--config", str(config),
                                "--replay", str(bundle), "--health-check"],
                               capture_output=True, text=True, timeout=120, check=False)
    assert installed.returncode == 0, installed.stderr
    lines = [line for line in installed.stdout.splitlines() if line.startswith("HealthCheck")]
    assert lines == [f"HealthCheckProgram={root / 'libexec' / 'gpuslurm-health-check'}",
                     "HealthCheckInterval=300", "HealthCheckNodeState=ANY"], installed.stdout
    lines[1] = "HealthCheckInterval=2"  # the test waits seconds, not minutes
    saved = c.conf.read_text()
    try:
        c.conf.write_text(saved + "\n".join(lines) + "\n")  # slurmd runs the installed wrapper
        subprocess.run([SCONTROL, "reconfigure"], env=c.env, check=True, timeout=30)
        deadline = time.monotonic() + 60
        while True:
            node = subprocess.run([SCONTROL, "-o", "show", "node", HOST], env=c.env, capture_output=True,
                                  text=True, timeout=30, check=True).stdout
            if "DRAIN" in (m.group(1) if (m := re.search(r"\bState=(\S+)", node)) else ""):
                break
            assert time.monotonic() < deadline, f"slurmd's health check never drained the node: {node}"
            time.sleep(1)
        assert f"GPU index 5 (/dev/nvidia5, {GPU5.uuid}): 3 uncorrectable ECC errors" in node
    finally:
        c.conf.write_text(saved)
        subprocess.run([SCONTROL, "reconfigure"], env=c.env, capture_output=True, timeout=30, check=False)
        subprocess.run([SCONTROL, "update", f"NodeName={HOST}", "State=RESUME"], env=c.env,
                       capture_output=True, timeout=30, check=False)
        shutil.rmtree(root, ignore_errors=True)
