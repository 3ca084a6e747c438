"""One GPU out of service in the real Slurm 22.05 cluster (issue 12, "Done when").

An Xid 79 for GPU 3 (bus 00000000:61:00.0 of the replayed DGX H100), a kernel record in the
driver's format, is added to the kernel log the monitor reads (a recorded /dev/kmsg: a line written
to the real /dev/kmsg from user space is LOG_USER, never the driver's, and is refused, as
tests/hw/test_kmsg_reader.py shows) while eight one-GPU jobs run (one of them on GPU 3). The real
monitor (``gpuslurm monitor --once``, replayed hardware) records GPU 3 out of service within one
cycle, with the Xid in the reason and in the node's Comment; the node is never drained and the
running jobs are not disturbed. Once GPU 3 is free the next cycle puts a holder job on it: seven
one-GPU jobs then run at once and an eighth pends, so new jobs never get GPU 3 while the node
serves the other seven. The holder survives restarts of slurmctld and slurmd; a monitor restart
does not count the line twice; ``gpu online`` brings GPU 3 back (an 8-GPU job runs).
"""

from __future__ import annotations

import json
import os
import pwd
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from gpuslurm.hw.source import load_node

if TYPE_CHECKING:
    from tests.helpers.cluster_fixture import SlurmCluster

pytestmark = pytest.mark.slurm

SCONTROL, SQUEUE, SCANCEL = "/usr/bin/scontrol", "/usr/bin/squeue", "/usr/bin/scancel"
GPU3 = load_node("dgx-h100").gpus[3]
HOST = socket.gethostname().split(".")[0]


def _field(text: str, name: str) -> str:
    m = re.search(rf"\b{name}=(.*?)(?= [A-Za-z]+=|$)", text.strip())
    return m.group(1) if m else ""


class Site:
    def __init__(self, cluster: SlurmCluster, root: Path) -> None:
        self.c = cluster
        self.root = root
        self.etc = cluster.conf.parent
        self.state = root / "state"
        self.config = root / "gpuslurm.toml"
        self.kmsg = root / "kmsg"  # the kernel log as /dev/kmsg gives it, one record a line
        self.kmsg.write_bytes(b"")
        self.config.write_text(
            f'[paths]\nstate_dir = "{self.state}"\nrun_dir = "{root}/run"\n'
            f'[monitor]\nnode_name = "{HOST}"\nkmsg = "{self.kmsg}"\n'
            '[health.xid]\naction = "gpu_out"\n'
            '[gpu_out]\njob_on_gpu = "notify"\n')
        self.env = {**cluster.env, "GPUSLURM_CONFIG": str(self.config)}

    def gpuslurm(self, *args: str, ok: bool = True) -> subprocess.CompletedProcess[str]:
        done = subprocess.run([sys.executable, "-m", "gpuslurm", *args], env=self.env, capture_output=True,
                              text=True, timeout=120, check=False)
        if ok and done.returncode != 0:
            pytest.fail(f"gpuslurm {' '.join(args)} exited {done.returncode}: {done.stderr}"
                        f"{self.c.log_tail()}")
        return done

    def cycle(self) -> str:
        return self.gpuslurm("monitor", "--once", "--from", "dgx-h100").stderr

    def node(self) -> str:
        return subprocess.run([SCONTROL, "-o", "show", "node", HOST], env=self.c.env, capture_output=True,
                              text=True, timeout=30, check=True).stdout

    def record(self) -> dict[str, dict[str, object]]:
        path = self.state / "out-of-service.json"
        return {g["uuid"]: g for g in json.loads(path.read_text())["gpus"]} if path.exists() else {}

    def restart(self, name: str) -> None:
        run = self.c.state_dir / "run"
        pid = int((run / f"{name}.pid").read_text())
        os.kill(pid, 15)
        for _ in range(100):
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                break
            time.sleep(0.1)
        args = ["-N", HOST] if name == "slurmd" else []
        subprocess.run([f"/usr/sbin/{name}", "-f", str(self.c.conf), *args], check=True, timeout=60,
                       env={**self.c.env, "GPUSLURM_TEST_CLUSTER": str(self.c.state_dir)})
        self.wait_node(lambda n: "NOT_RESPONDING" not in _field(n, "State") and "*" not in _field(n, "State"))

    def wait_node(self, ok: object, timeout: float = 40) -> str:
        deadline = time.monotonic() + timeout
        while True:
            try:
                text = self.node()
                if ok(text):  # type: ignore[operator]
                    return text
            except subprocess.CalledProcessError:
                text = ""
            if time.monotonic() > deadline:
                pytest.fail(f"node never reached the state wanted: {text}\n{self.c.log_tail()}")
            time.sleep(0.5)


def _running(c: SlurmCluster, jobs: list[int]) -> bool:
    return all(c.state(j) == "RUNNING" for j in jobs)


def _holder(c: SlurmCluster) -> list[tuple[str, str]]:
    """(job id, GRES detail) of the running holder jobs."""
    out = subprocess.run(["/usr/bin/squeue", "-h", "-t", "RUNNING", f"--name=gpuslurm-gpu-out-{HOST}",
                          "-o", "%i"], env=c.env, capture_output=True, text=True, timeout=30,
                         check=True).stdout
    found = []
    for job in out.split():
        detail = subprocess.run([SCONTROL, "-o", "show", "job", "-d", job], env=c.env, capture_output=True,
                                text=True, timeout=30, check=True).stdout
        m = re.search(r"GRES=(\S+)", detail.split(" Nodes=")[-1])
        found.append((job, m.group(1) if m else ""))
    return found


def _wait_running(c: SlurmCluster, jobs: list[int], timeout: float = 40) -> None:
    deadline = time.monotonic() + timeout
    while not _running(c, jobs):
        assert time.monotonic() < deadline, c.log_tail()
        time.sleep(0.3)


def test_xid_79_takes_gpu_3_out_and_the_node_serves_the_other_7(slurm_cluster: SlurmCluster) -> None:
    root = Path(tempfile.mkdtemp(prefix="gpuslurm-gpu-out-"))
    root.chmod(0o755)
    site = Site(slurm_cluster, root)
    c = slurm_cluster
    jobs: list[int] = []
    try:
        jobs = [c.sbatch(["--gres=gpu:1", "--cpus-per-task=1"], "sleep 10") for _ in range(8)]
        _wait_running(c, jobs)
        with open(site.kmsg, "ab") as kmsg:  # an earlier record of this boot, not an Xid
            kmsg.write(b"6,1,1000,-;nvidia 0000:61:00.0: enabling device (0000 -> 0002)\n")
        site.cycle()
        assert site.record() == {}
        tag = uuid.uuid4().hex[:10]
        with open(site.kmsg, "ab") as kmsg:  # the driver's record: kernel facility, level 3
            kmsg.write(f"3,2,2000,-;NVRM: Xid (PCI:0000:61:00): 79, pid='<unknown>', name={tag}, "
                       "GPU has fallen off the bus.\n".encode())
        said = site.cycle()
        rec = site.record()
        assert list(rec) == [GPU3.uuid], said
        assert rec[GPU3.uuid]["by"] == "monitor" and "Xid 79" in str(rec[GPU3.uuid]["reason"])
        node = site.node()
        assert "DRAIN" not in _field(node, "State")  # the node is never closed
        assert GPU3.uuid in _field(node, "Comment") and "Xid 79" in _field(node, "Comment")
        assert _running(c, jobs)  # nobody disturbed, the job on GPU 3 included
        assert "in use by job" in said, said
        since = rec[GPU3.uuid]["since"]
        site.cycle()  # a restarted monitor: the line is counted once
        assert site.record()[GPU3.uuid]["since"] == since
        for j in jobs:
            c.wait(j, timeout=60)
        said = site.cycle()  # GPU 3 is free: a holder takes it
        [(holder, gres)] = _holder(c)
        assert "(IDX:3)" in gres, (gres, said)
        seven = [c.sbatch(["--gres=gpu:1"], "sleep 20") for _ in range(7)]
        _wait_running(c, seven)  # the other seven GPUs serve at once
        eighth = c.sbatch(["--gres=gpu:1"], "true")
        time.sleep(3)
        assert c.state(eighth) == "PENDING"  # and GPU 3 is nobody's
        site.restart("slurmctld")
        site.restart("slurmd")
        assert [h for h, _ in _holder(c)] == [holder]
        assert GPU3.uuid in _field(site.node(), "Comment")
        for j in seven:
            c.wait(j, timeout=60)
        c.wait(eighth, timeout=60)
        out = site.gpuslurm("gpu", "online", "index:3", "--node-name", HOST, "--from", "dgx-h100")
        assert site.record() == {} and _holder(c) == [], out.stdout
        assert GPU3.uuid not in _field(site.node(), "Comment")
        eight = c.sbatch(["--gres=gpu:8"], "true")
        assert c.wait(eight, timeout=60) == "COMPLETED"
        print(f"gpu out: {said.strip()}", file=sys.stderr)
    finally:
        subprocess.run([SCANCEL, *map(str, jobs)], env=c.env, capture_output=True, timeout=30, check=False)
        subprocess.run([SCANCEL, f"--name=gpuslurm-gpu-out-{HOST}"], env=c.env, capture_output=True,
                       timeout=30, check=False)
        subprocess.run([SCONTROL, "update", f"NodeName={HOST}", "Comment="], env=c.env,
                       capture_output=True, timeout=30, check=False)
        shutil.rmtree(root, ignore_errors=True)


def _gres_of(c: SlurmCluster, job: int) -> str:
    detail = subprocess.run([SCONTROL, "-o", "show", "job", "-d", str(job)], env=c.env, capture_output=True,
                            text=True, timeout=30, check=True).stdout
    m = re.search(r"GRES=(\S+)", detail.split(" Nodes=")[-1])
    return m.group(1) if m else ""


def test_a_users_job_named_as_the_holder_is_neither_cancelled_nor_counted_as_it(
        slurm_cluster: SlurmCluster) -> None:
    """As the attacker (nobody): eight one-GPU jobs named as root's holder (``gpuslurm-gpu-out-<node>``)
    fill the node. ``gpu offline index:3`` neither scancels the seven on GPUs in service nor counts
    the one on GPU 3 as its holder (that job is the GPU's user, told, and when it ends a real holder
    takes the GPU); ``gpu online index:3`` cancels none of them either. Only root's job of that name
    is the holder."""
    root = Path(tempfile.mkdtemp(prefix="gpuslurm-gpu-out-"))
    root.chmod(0o755)
    site = Site(slurm_cluster, root)
    c = slurm_cluster
    # the uid, not the name: 26.05's sbatch refuses --uid=nobody ("Invalid --uid specification")
    attacker = [f"--uid={pwd.getpwnam('nobody').pw_uid}", "--chdir=/", "--output=/dev/null", "--gres=gpu:1",
                f"--job-name=gpuslurm-gpu-out-{HOST}"]
    jobs: list[int] = []
    try:
        jobs = [c.sbatch(attacker, "sleep 300") for _ in range(8)]
        _wait_running(c, jobs)
        [on_gpu3] = [j for j in jobs if "(IDX:3)" in _gres_of(c, j)]
        out = site.gpuslurm("gpu", "offline", "index:3", "--reason", "test", "--node-name", HOST,
                            "--from", "dgx-h100").stdout
        assert f"in use by job(s) {on_gpu3}" in out and "held out by" not in out, out
        assert _running(c, jobs), [(j, c.state(j)) for j in jobs]
        out = site.gpuslurm("gpu", "online", "index:3", "--node-name", HOST, "--from", "dgx-h100").stdout
        assert site.record() == {}, out
        assert _running(c, jobs), ([(j, c.state(j)) for j in jobs], out)
    finally:
        subprocess.run([SCANCEL, *map(str, jobs)], env=c.env, capture_output=True, timeout=30, check=False)
        for j in jobs:
            c.wait(j, timeout=60)
        subprocess.run([SCONTROL, "update", f"NodeName={HOST}", "Comment="], env=c.env,
                       capture_output=True, timeout=30, check=False)
        shutil.rmtree(root, ignore_errors=True)
