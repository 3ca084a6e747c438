"""The docker-slurm image, built from a debootstrap base, runs a GPU job through gpuslurm's hooks.

Inside the container: ``gpuslurm install`` (as an admin runs it, config and replayed DGX H100
baked into the hooks), ``cluster.sh up`` with the installed Prolog/Epilog/TaskProlog in slurm.conf,
then ``sbatch --gres=gpu:1``. The job must get one GPU from Slurm, the prolog's job map must name
that GPU's UUID, the devices cgroup must let the job open only that GPU's fake device file (ENXIO:
allowed, no driver; EPERM: refused), and the epilog must have removed the map and written the
summary. Three set-ups: Slurm isolates (ConstrainDevices=yes), gpuslurm's prolog isolates
(ConstrainDevices=no, ``cgroup.devices = "auto"``), and a control where nothing isolates, in which
every GPU must open. Fixtures: tests/helpers/docker_fixture.py.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator

import pytest
from tests.helpers.docker_fixture import NODE, BuiltImage, DockerNode, compose_run_settings, compose_service

from gpuslurm.hw.source import BUILTIN_DIR, load_node

CLUSTER_SH = "/src/gpuslurm/docker-slurm/cluster.sh"
GPUSLURM = "/opt/gpuslurm/bin/gpuslurm"
ETC = "/etc/gpuslurm-test"
HOOKS = "/opt/gpuslurm-hooks"
RUN_DIR = "/run/gpuslurm-hooks"
STATE_DIR = "/var/lib/gpuslurm-hooks"
CLUSTER_DIR = "/run/gpuslurm-test-cluster"
ENV = {"SLURM_CONF": f"{CLUSTER_DIR}/etc/slurm.conf"}
FINAL = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL")

JOB = f"""#!/bin/bash
cat {RUN_DIR}/jobs/$SLURM_JOB_ID.json; echo
echo "JOB_GPUS=$SLURM_JOB_GPUS"
env | grep -E '^(GPUSLURM_|CUDA_)' | sed 's/^/ENV /'
/usr/bin/python3 - <<'EOF'
import errno, os
for n in range(8):
    try:
        os.close(os.open(f"/dev/nvidia{{n}}", os.O_RDONLY))
        print(f"OPEN {{n}} ok")
    except OSError as exc:
        print(f"OPEN {{n}} {{errno.errorcode[exc.errno]}}")
EOF
"""


CONFIG = (f'[paths]\nrun_dir = "{RUN_DIR}"\nstate_dir = "{STATE_DIR}"\nscontrol = "/usr/bin/scontrol"\n'
          f'slurm_cgroup_conf = "{CLUSTER_DIR}/etc/cgroup.conf"\n[hooks]\ncommand_timeout_s = 20\n')


@pytest.fixture(scope="module")
def hooked_node(docker_node: DockerNode) -> Iterator[DockerNode]:
    """gpuslurm's hooks installed in the container (``gpuslurm install``, config and bundle baked in)."""
    extra = (f"Prolog={HOOKS}/gpuslurm-prolog\nEpilog={HOOKS}/gpuslurm-epilog\n"
             f"TaskProlog={HOOKS}/gpuslurm-task-prolog\n")
    docker_node.sh(
        f"set -e; mkdir -p {ETC}/slurm-etc; cat > {ETC}/gpuslurm.toml <<'EOF'\n{CONFIG}EOF\n"
        f"cat > {ETC}/extra.conf <<'EOF'\n{extra}EOF\n"
        "cp -r \"$(/opt/gpuslurm/bin/python -c "
        "'from gpuslurm.hw.source import BUILTIN_DIR; print(BUILTIN_DIR)')"
        f"/dgx-h100\" {ETC}/bundle\n"
        f"{GPUSLURM} install --slurm-etc {ETC}/slurm-etc --prefix {HOOKS} --config {ETC}/gpuslurm.toml "
        f"--replay {ETC}/bundle")
    yield docker_node


def _cluster_up(node: DockerNode, constrain_devices: str, gpuslurm_devices: str) -> None:
    """``cluster.sh down`` then ``up`` with the hooks in slurm.conf, Slurm's ConstrainDevices and
    gpuslurm's ``cgroup.devices`` mode as given (the hooks read the config at every job)."""
    node.run([CLUSTER_SH, "down"])
    node.sh(f"cat > {ETC}/gpuslurm.toml <<'EOF'\n{CONFIG}[cgroup]\ndevices = \"{gpuslurm_devices}\"\nEOF\n")
    started = time.monotonic()
    node.run([CLUSTER_SH, "up"], env={"GPUSLURM_CLUSTER_EXTRA_CONF": f"{ETC}/extra.conf",
                                      "GPUSLURM_CLUSTER_CONSTRAIN_DEVICES": constrain_devices})
    print(f"cluster.sh up in the container: {time.monotonic() - started:.1f} s")


def _wait(node: DockerNode, jobid: int, timeout: float = 60) -> str:
    deadline = time.monotonic() + timeout
    state = ""
    while time.monotonic() < deadline:
        out = node.sh(f"scontrol -o show job {jobid}", env=ENV)
        match = re.search(r"\bJobState=(\S+)", out)
        state = match.group(1) if match else out
        if state in FINAL:
            return state
        time.sleep(0.3)
    raise TimeoutError(f"job {jobid} still {state} after {timeout} s\n"
                       + node.sh(f"tail -n 30 {CLUSTER_DIR}/log/slurmd.log", check=False))


def test_image_is_built_on_the_debootstrap_base(cluster_image: BuiltImage, docker_node: DockerNode) -> None:
    assert cluster_image.base.startswith("gpuslurm-debootstrap:bookworm-")
    # gpuslurm, installed from this checkout's source, and Slurm 22.05 from Debian 12
    assert docker_node.sh(f"{GPUSLURM} --help").startswith("Usage: gpuslurm")
    assert docker_node.sh("slurmd -V").strip().startswith("slurm-wlm 22.05")


def test_the_container_is_the_one_compose_yaml_describes(docker_node: DockerNode) -> None:
    """What Docker made of compose.yaml's service (through the SDK, as the fixture creates it)."""
    docker_node.container.reload()
    host, config = docker_node.container.attrs["HostConfig"], docker_node.container.attrs["Config"]
    want = compose_run_settings(compose_service(), list(host["CapAdd"] or []))
    assert config["Hostname"] == want["hostname"]
    assert host["ExtraHosts"] == [f"{k}:{v}" for k, v in want["extra_hosts"].items()]
    assert (host["Init"], host["NetworkMode"], host["CgroupnsMode"]) == (
        want["init"], want["network_mode"], want["cgroupns"])
    assert host["Binds"] == [f"{s}:{v['bind']}:{v['mode']}" for s, v in want["volumes"].items()]
    assert sorted(host["SecurityOpt"]) == sorted(want["security_opt"])
    devices = {f"{d['PathOnHost']}:{d['PathInContainer']}:{d['CgroupPermissions']}" for d in host["Devices"]}
    assert devices == set(want["devices"])
    assert set(host["CapAdd"]) >= {"SYS_ADMIN", "MKNOD"} and not host["Privileged"]
    assert {f"{k}={v}" for k, v in want["environment"].items()} <= set(config["Env"])


@pytest.mark.parametrize(("constrain_devices", "gpuslurm_devices", "isolated"), [
    ("yes", "auto", True),    # Slurm's devices cgroup isolates (gpuslurm's auto mode leaves it to Slurm)
    ("no", "auto", True),     # gpuslurm's prolog isolates, in the host's cgroup tree, from the container
    ("no", "never", False),   # control: nothing isolates, every GPU opens (ENXIO): the check can fail
], ids=["slurm-isolates", "gpuslurm-isolates", "control-nothing-isolates"])
def test_gpu_job_gets_its_gpu_through_the_installed_hooks(hooked_node: DockerNode, constrain_devices: str,
                                                         gpuslurm_devices: str, isolated: bool) -> None:
    _cluster_up(hooked_node, constrain_devices, gpuslurm_devices)
    uuids = [gpu.uuid for gpu in load_node(str(BUILTIN_DIR / "dgx-h100")).gpus]
    # The fake devices were passed in from the host, not made in the container by cluster.sh.
    assert {f"/dev/nvidia{n}" for n in range(8)} <= set(hooked_node.devices)
    # (cluster.sh records each device file it makes as a directory of its ledger)
    assert hooked_node.sh("find /run/gpuslurm-fake-devices -mindepth 1 -type d").strip() == ""
    submitted = hooked_node.sh(f"cat > /tmp/job.sh <<'EOS'\n{JOB}EOS\n"
                               "sbatch --parsable --gres=gpu:1 --chdir=/tmp --output=/tmp/job-%j.out "
                               "/tmp/job.sh",
                               env=ENV)
    jobid = int(submitted.strip().split(";")[0])
    state = _wait(hooked_node, jobid)
    out = hooked_node.sh(f"cat /tmp/job-{jobid}.out")
    log = hooked_node.sh(f"tail -n 40 {CLUSTER_DIR}/log/slurmd.log", check=False)
    assert state == "COMPLETED", f"{out}\n{log}"

    index = int(re.search(r"^JOB_GPUS=(\d+)$", out, re.M).group(1))  # type: ignore[union-attr]
    job_map = json.loads(out.splitlines()[0])
    assert [gpu["uuid"] for gpu in job_map["gpus"]] == [uuids[index]]
    assert job_map["job_id"] == str(jobid)
    env = dict(re.findall(r"^ENV (\w+)=(.*)$", out, re.M))
    assert env["CUDA_VISIBLE_DEVICES"] == "0"
    assert env["GPUSLURM_GPU_UUID"] == uuids[index]
    # dgx-h100: minor == index. Isolated: the job's GPU only (ENXIO: allowed, no driver; EPERM: refused).
    opened = dict(re.findall(r"^OPEN (\d) (\S+)$", out, re.M))
    assert opened == {str(n): ("ENXIO" if n == index or not isolated else "EPERM") for n in range(8)}, out

    # The epilog ran: the map is gone, the summary names the same GPU.
    summary_path = f"{STATE_DIR}/jobs/{jobid}-summary.json"
    deadline = time.monotonic() + 30
    while hooked_node.run(["test", "-e", summary_path], check=False)[0] != 0:
        assert time.monotonic() < deadline, f"no {summary_path}\n{log}"
        time.sleep(0.3)
    assert hooked_node.run(["test", "-e", f"{RUN_DIR}/jobs/{jobid}.json"], check=False)[0] != 0
    summary = json.loads(hooked_node.sh(f"cat {summary_path}"))
    assert [gpu["uuid"] for gpu in summary["gpus"]] == [uuids[index]]
    assert summary["node"] == NODE
