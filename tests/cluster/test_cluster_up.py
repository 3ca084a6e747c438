"""End to end in a real Slurm: an emulated DGX H100 (8 fake GPUs) configured by gpuslurm.

The fake /dev/nvidiaN are real character devices with no driver behind them, so opening one the
job's devices cgroup allows fails with ENXIO, and one it denies fails with EPERM: the two errors
tell an allowed device from a blocked one without a GPU.
"""

from __future__ import annotations

import errno
import re
import subprocess
import sys
import time
from typing import TYPE_CHECKING

import pytest
from tests.helpers import slurm_roots

if TYPE_CHECKING:
    from tests.helpers.cluster_fixture import SlurmCluster

pytestmark = pytest.mark.slurm

GPUS = 8
# Prints one "DEV <path> <errno name or OK>" line per device it tries to open.
PROBE = f"""
echo "CUDA_VISIBLE_DEVICES=$CUDA_VISIBLE_DEVICES"
echo "SLURM_JOB_GPUS=$SLURM_JOB_GPUS"
{sys.executable} - <<'EOF'
import errno
for path in [f"/dev/nvidia{{i}}" for i in range({GPUS})] + ["/dev/nvidiactl", "/dev/nvidia-uvm"]:
    try:
        open(path, "rb").close()
        print("DEV", path, "OK")
    except OSError as exc:
        print("DEV", path, errno.errorcode.get(exc.errno, exc.errno))
EOF
"""


def _probe_results(output: str) -> tuple[dict[str, str], dict[str, str]]:
    env = dict(re.findall(r"^(CUDA_VISIBLE_DEVICES|SLURM_JOB_GPUS)=(.*)$", output, re.MULTILINE))
    devices = dict(re.findall(r"^DEV (\S+) (\S+)$", output, re.MULTILINE))
    return env, devices


def _run_probe(cluster: SlurmCluster, args: list[str]) -> tuple[dict[str, str], dict[str, str]]:
    jobid = cluster.sbatch(args, PROBE)
    state = cluster.wait(jobid, timeout=30)
    output = cluster.output(jobid)
    assert state == "COMPLETED", f"job {jobid} ended {state}:\n{output}\n{cluster.log_tail()}"
    return _probe_results(output)


def test_node_is_the_bundles_dgx_h100(slurm_cluster: SlurmCluster) -> None:
    out = subprocess.run(["/usr/bin/scontrol", "-o", "show", "node"], env=slurm_cluster.env,
                         capture_output=True, text=True, check=True, timeout=30).stdout
    # config_overrides: Slurm believes the node line from gpuslurm node-conf, not this small machine.
    assert "CPUTot=224" in out
    assert "Sockets=2" in out
    assert "Gres=gpu:nvidia_h100_80gb_hbm3:8(S:0-1)" in out
    assert "State=IDLE" in out


def test_clients_and_daemons_are_the_selected_release(slurm_cluster: SlurmCluster) -> None:
    """GPUSLURM_SLURM_RELEASE picks the Slurm every test talks to: the clients at /usr/bin that
    tests name and the daemons that answer them."""
    release = slurm_roots.selected()
    want = release.name if release else slurm_roots.HOST_RELEASE
    client = subprocess.run(["/usr/bin/scontrol", "--version"], env=slurm_cluster.env, capture_output=True,
                            text=True, check=True, timeout=30).stdout
    assert client.startswith(f"slurm-wlm {want}.") or client.startswith(f"slurm {want}."), client
    shown = subprocess.run(["/usr/bin/scontrol", "-o", "show", "node"], env=slurm_cluster.env,
                           capture_output=True, text=True, check=True, timeout=30).stdout
    assert re.search(rf"\bVersion={re.escape(want)}\.", shown), shown


_NO_DEVICE_CGROUP = slurm_roots.without_cgroups("no device cgroup, so every job opens every GPU")


@_NO_DEVICE_CGROUP
def test_four_gpu_job_opens_only_its_devices(slurm_cluster: SlurmCluster) -> None:
    env, devices = _run_probe(slurm_cluster, ["--gres=gpu:4"])
    job_gpus = [int(i) for i in env["SLURM_JOB_GPUS"].split(",")]
    assert len(job_gpus) == 4
    # ConstrainDevices renumbers what the job sees from 0.
    assert env["CUDA_VISIBLE_DEVICES"] == "0,1,2,3"
    # On the DGX H100 bundle the minor numbers equal the indices.
    mine = {f"/dev/nvidia{i}" for i in job_gpus}
    others = {f"/dev/nvidia{i}" for i in range(GPUS)} - mine
    # ENXIO: the cgroup let the open through to a device with no driver.
    assert {path: devices[path] for path in mine} == dict.fromkeys(mine, errno.errorcode[errno.ENXIO])
    assert {path: devices[path] for path in others} == dict.fromkeys(others, errno.errorcode[errno.EPERM])
    # Devices that are not GRES are left alone, as CUDA needs them.
    assert devices["/dev/nvidiactl"] == "ENXIO"
    assert devices["/dev/nvidia-uvm"] == "ENXIO"


@_NO_DEVICE_CGROUP
def test_concurrent_jobs_get_disjoint_gpus(slurm_cluster: SlurmCluster) -> None:
    release = slurm_cluster.state_dir / "release-holder"
    holder = slurm_cluster.sbatch(
        ["--gres=gpu:4"], f"while [ ! -e {release} ]; do sleep 0.1; done\necho HELD=$SLURM_JOB_GPUS\n")
    try:
        for _ in range(150):
            if slurm_cluster.state(holder) == "RUNNING":
                break
            time.sleep(0.1)
        env, devices = _run_probe(slurm_cluster, ["--gres=gpu:4"])
    finally:
        release.touch()
    assert slurm_cluster.wait(holder, timeout=30) == "COMPLETED"
    held = re.search(r"^HELD=(.*)$", slurm_cluster.output(holder), re.MULTILINE)
    assert held, slurm_cluster.output(holder)
    held_gpus = {int(i) for i in held.group(1).split(",")}
    probe_gpus = {int(i) for i in env["SLURM_JOB_GPUS"].split(",")}
    assert len(held_gpus) == len(probe_gpus) == 4
    assert held_gpus.isdisjoint(probe_gpus)
    for i in range(GPUS):
        assert devices[f"/dev/nvidia{i}"] == ("ENXIO" if i in probe_gpus else "EPERM"), devices


def test_more_gpus_than_the_node_has_is_refused(slurm_cluster: SlurmCluster) -> None:
    with pytest.raises(RuntimeError, match="Requested node configuration is not available"):
        slurm_cluster.sbatch([f"--gres=gpu:{GPUS + 1}"], "true\n")
