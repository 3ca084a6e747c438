"""What the PBS end-to-end modules share: gpuslurm installed into the real test cluster (hooks or
classic scripts, the module fixture ``hooked``), pbs_mom restarted, vnodes waited for, and a job's
report read back.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import pytest
from tests.helpers.pbs_fixture import PREFIX, STATE_PARENT, PbsCluster

from gpuslurm.gres.pbs_vnodes import plan_vnodes
from gpuslurm.hw.source import bundle_path, load_node
from gpuslurm.pbs.install import HOOK_FILES

QMGR = str(PREFIX / "bin" / "qmgr")
PBSNODES = str(PREFIX / "bin" / "pbsnodes")
HOST = "pbshost"
ROOT = Path(__file__).resolve().parents[2]


def copy_bundle(dest: Path) -> None:
    """A copy of the cluster's replayed bundle at ``dest``, for one module's instance."""
    source = bundle_path(BUNDLE)
    assert source is not None
    shutil.copytree(source, dest)


@dataclass
class Installed:
    """gpuslurm installed with ``install --pbs`` and a config of its own (run/state dirs named by
    the subclass), replaying ``bundle``."""

    cluster: PbsCluster
    bundle: Path
    config: Path

    run_name: ClassVar[str] = "gs-run"
    state_name: ClassVar[str] = "gs-state"
    install_flags: ClassVar[tuple[str, ...]] = ()

    @property
    def jobs_dir(self) -> Path:
        return self.cluster.state_dir / self.run_name / "jobs"

    @property
    def summaries(self) -> Path:
        return self.cluster.state_dir / self.state_name / "jobs"

    @property
    def out(self) -> Path:  # the jobs write here as they run (PBS copies stdout only at the end)
        return self.cluster.state_dir / "jobs"

    def install(self, *extra: str) -> subprocess.CompletedProcess[str]:
        argv = ["/bin/bash", str(ROOT / "pbs-cluster" / "cluster.sh"), "exec", sys.executable, "-m",
                "gpuslurm", "install", "--pbs", *self.install_flags, "--config", str(self.config),
                "--replay", str(self.bundle), *extra]
        return subprocess.run(argv, env=self.cluster.env, capture_output=True, text=True, timeout=300,
                              check=False)

    def mom_log(self) -> str:
        logs = sorted((self.cluster.state_dir / "home" / "mom_logs").iterdir())
        return "".join(p.read_text(errors="replace") for p in logs[-2:])

    def vnodes(self) -> dict[str, dict[str, str]]:
        return _vnodes(self.cluster.run(PBSNODES, "-av"))

    def state(self, jobid: str) -> str:
        match = re.search(r"^\s*job_state = (\S+)", self.cluster.job(jobid), re.M)
        return match.group(1) if match else "?"

    def wait_state(self, jobid: str, states: str, timeout: float = 60) -> str:
        deadline = time.monotonic() + timeout
        while (state := self.state(jobid)) not in states:
            if time.monotonic() > deadline:
                raise TimeoutError(f"job {jobid} is {state}, not {states}:\n{self.cluster.job(jobid)}")
            time.sleep(0.5)
        return state


@dataclass
class Hooked(Installed):
    """The hooks installed (``install --pbs``)."""

    cgroup: Path | None  # the devices hierarchy's mount (v1), or the cgroup2 mount


def _restart_mom(cluster: PbsCluster) -> None:
    """Stop pbs_mom and start it again in a fresh `ip netns exec` (so it sees mounts made since)."""
    lock = cluster.state_dir / "home" / "mom_priv" / "mom.lock"
    pid = int(lock.read_text().split()[0])
    os.kill(pid, 15)
    for _ in range(100):
        if not Path(f"/proc/{pid}").exists():
            break
        time.sleep(0.1)
    cluster.run(str(PREFIX / "sbin" / "pbs_mom"))


def _wait_vnodes(cluster: PbsCluster, names: list[str], timeout: float = 90) -> dict[str, dict[str, str]]:
    deadline = time.monotonic() + timeout
    while True:
        nodes = _vnodes(cluster.run(PBSNODES, "-av", check=False))
        if all(nodes.get(n, {}).get("state") == "free" for n in names):
            return nodes
        if time.monotonic() > deadline:
            raise TimeoutError(f"vnodes {names} not free after {timeout}s: {nodes}")
        time.sleep(1)


@contextmanager
def hooks_installed(hooked: Hooked) -> Iterator[Hooked]:
    """Install the hooks, hand the NUMA vnodes from the vnode file ``cluster.sh up`` inserted over
    to the hook's exechost_startup (pbs_mom restarted), and at the end delete the hooks and put
    the vnode file back. The caller cleans up its bundle and cgroup mount after."""
    cluster = hooked.cluster
    numa = [f"{HOST}[{v.numa_node}]" for v in plan_vnodes(load_node(BUNDLE))]
    try:
        installed = hooked.install()
        assert installed.returncode == 0, installed.stderr
        # From now on the NUMA vnodes are the hook's: forget those the vnode file made.
        cluster.run(str(PREFIX / "sbin" / "pbs_mom"), "-s", "remove", "gpuslurm-numa")
        for name in numa:
            cluster.run(QMGR, "-c", f"delete node {name}")
        _restart_mom(cluster)
        _wait_vnodes(cluster, numa)
        yield hooked
    finally:
        for name in HOOK_FILES:  # every hook install --pbs made
            cluster.run(QMGR, "-c", f"delete hook {name}", check=False)
        cluster.run(str(PREFIX / "sbin" / "pbs_mom"), "-s", "insert", "gpuslurm-numa",
                    str(cluster.state_dir / "vnodes"), check=False)
        _restart_mom(cluster)
        _wait_vnodes(cluster, numa)


def _job_report(hooked: Installed, jobid: str, timeout: float = 60) -> dict[str, str]:
    """What the job wrote to ``out/<jobid>``: ``/dev/... what`` and ``KEY=value`` lines."""
    path = hooked.out / jobid
    deadline = time.monotonic() + timeout
    while not path.exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"job {jobid} wrote nothing:\n{hooked.cluster.job(jobid)}")
        time.sleep(0.3)
    report = {}
    for line in path.read_text().splitlines():
        if line.startswith("/dev/"):
            dev, _, what = line.partition(" ")
            report[dev] = what
        else:
            key, _, value = line.partition("=")
            report[key] = value
    return report


def _online(cluster: PbsCluster, vnode: str, timeout: float = 60) -> None:
    """Put ``vnode`` back online without a comment (a job refused there may still offline it once)."""
    deadline = time.monotonic() + timeout
    while True:  # pbsnodes -r names hosts, not vnodes ("Unknown node"): qmgr does
        cluster.run(QMGR, "-c", f"set node {vnode} state -= offline", check=False)
        cluster.run(QMGR, "-c", f"unset node {vnode} comment", check=False)
        if _vnodes(cluster.run(PBSNODES, "-av", check=False)).get(vnode, {}).get("state") == "free":
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"{vnode} did not come back online")
        time.sleep(1)


BUNDLE = os.environ.get("GPUSLURM_BUNDLE", "dgx-h100")


def _vnodes(text: str) -> dict[str, dict[str, str]]:
    """``pbsnodes -av`` text → {vnode: {attribute: value}}."""
    nodes: dict[str, dict[str, str]] = {}
    current: dict[str, str] = {}
    for line in text.splitlines():
        if line and not line.startswith(" "):
            current = nodes.setdefault(line.strip(), {})
        elif " = " in line:
            key, _, value = line.strip().partition(" = ")
            current[key] = value
    return nodes


V1_DEVICES = Path("/sys/fs/cgroup/devices/devices.deny")


@pytest.fixture(scope="module")
def hooked(pbs_cluster: PbsCluster) -> Iterator[Hooked]:
    state = pbs_cluster.state_dir
    bundle = state / "bundle"
    copy_bundle(bundle)
    cgroup = None
    if V1_DEVICES.exists():
        cgroup = Path(tempfile.mkdtemp(prefix="gpuslurm-pbs-cgroup-", dir=STATE_PARENT))
        (cgroup / "devices").mkdir()
        subprocess.run(["mount", "-t", "cgroup", "-o", "devices", "gpuslurm-pbs-test",
                        str(cgroup / "devices")], check=True, timeout=30)
    config = state / "gpuslurm.toml"
    config.write_text(f'[paths]\nrun_dir = "{state}/gs-run"\nstate_dir = "{state}/gs-state"\n'
                      f'cgroup_root = "{cgroup or state / "no-cgroup"}"\n')
    config.chmod(0o644)
    try:
        with hooks_installed(Hooked(pbs_cluster, bundle, config, cgroup)) as hooked:
            yield hooked
    finally:
        if cgroup is not None:
            subprocess.run(["umount", str(cgroup / "devices")], check=False, timeout=30)
            shutil.rmtree(cgroup, ignore_errors=True)
        shutil.rmtree(bundle, ignore_errors=True)  # another module's instance copies it again


JOB = """\
out={out}/$PBS_JOBID
echo "CVD=$CUDA_VISIBLE_DEVICES" > $out.tmp
echo "ORDER=$CUDA_DEVICE_ORDER" >> $out.tmp
for dev in /dev/nvidia[0-9]*; do
    err=$( (exec 3<"$dev") 2>&1 ) && echo "$dev opened" >> $out.tmp || echo "$dev ${{err##*: }}" >> $out.tmp
done
mv $out.tmp $out
while [ ! -e {out}/release-$PBS_JOBID ]; do sleep 0.2; done
"""
