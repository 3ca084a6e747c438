"""One GPU out of service in the real Slurm 22.05 cluster (issue 12, "Done when").

An Xid 79 for GPU 3 (bus 00000000:61:00.0 of the replayed DGX H100) is written to the real
/dev/kmsg in the driver's format while eight one-GPU jobs run (one of them on GPU 3). The real
monitor (``gpuslurm monitor --once``, replayed hardware) takes GPU 3 out within one cycle: the
node is drained for new jobs with a reason naming GPU 3 and the Xid, the running jobs are not
disturbed, and once they end the next cycle rewrites gres.conf and the node's ``Gres=`` without
GPU 3 and resumes the node with 7 GPUs. That survives restarts of slurmctld and slurmd; a monitor
restart does not count the line twice; ``gpu online`` brings GPU 3 back. The session cluster's
gres.conf and slurm.conf are restored at the end.
"""

from __future__ import annotations

import json
import os
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
    from cluster_fixture import SlurmCluster

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
        self.config.write_text(
            f'[paths]\nstate_dir = "{self.state}"\nrun_dir = "{root}/run"\n'
            f'[monitor]\nnode_name = "{HOST}"\nkmsg = "/dev/kmsg"\n'
            '[health.xid]\naction = "gpu_out"\n'
            f'[gpu_out]\ngres_conf = "{self.etc}/gres.conf"\nslurm_conf = "{cluster.conf}"\n')
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


def test_xid_79_takes_gpu_3_out_the_node_serves_7_and_online_brings_it_back(
        slurm_cluster: SlurmCluster) -> None:
    root = Path(tempfile.mkdtemp(prefix="gpuslurm-gpu-out-"))
    root.chmod(0o755)
    site = Site(slurm_cluster, root)
    c = slurm_cluster
    saved = {p: p.read_text() for p in (site.etc / "gres.conf", c.conf)}
    jobs: list[int] = []
    try:
        jobs = [c.sbatch(["--gres=gpu:1", "--cpus-per-task=1"], "sleep 12") for _ in range(8)]
        deadline = time.monotonic() + 30
        while not _running(c, jobs):
            assert time.monotonic() < deadline, c.log_tail()
            time.sleep(0.3)
        site.cycle()  # the boot's log so far is read and its cursor committed
        assert site.record() == {}
        tag = uuid.uuid4().hex[:10]
        with open("/dev/kmsg", "w") as kmsg:
            kmsg.write(f"<3>NVRM: Xid (PCI:0000:61:00): 79, pid='<unknown>', name={tag}, "
                       "GPU has fallen off the bus.\n")
        said = site.cycle()
        rec = site.record()
        assert list(rec) == [GPU3.uuid], said
        assert rec[GPU3.uuid]["by"] == "monitor" and "Xid 79" in str(rec[GPU3.uuid]["reason"])
        node = site.node()
        drained_at = time.monotonic()
        assert "DRAIN" in _field(node, "State")
        assert _field(node, "Reason").startswith(
            f"gpuslurm: GPU out: index 3 (/dev/nvidia3, {GPU3.uuid}): Xid 79")
        assert GPU3.uuid in _field(node, "Comment")
        assert _running(c, jobs)  # nobody disturbed, the job on GPU 3 included
        late = c.sbatch(["--gres=gpu:1"], "sleep 1")
        time.sleep(2)
        assert c.state(late) == "PENDING"
        since = rec[GPU3.uuid]["since"]
        site.gpuslurm("monitor", "--once", "--from", "dgx-h100")  # a restarted monitor: counted once
        assert site.record()[GPU3.uuid]["since"] == since
        for j in jobs:
            c.wait(j, timeout=60)
        said = site.cycle()  # the node is empty: gres.conf and Gres= without GPU 3, resumed
        node = site.wait_node(lambda n: "DRAIN" not in _field(n, "State"))
        lost_s = time.monotonic() - drained_at
        gres = (site.etc / "gres.conf").read_text()
        assert "/dev/nvidia3 " not in gres and gres.count("Name=gpu") == 7, said
        assert re.search(r"Gres=gpu:nvidia_h100_80gb_hbm3:7\b", c.conf.read_text())
        assert re.match(r"gpu:nvidia_h100_80gb_hbm3:7\b", _field(node, "Gres")), node
        assert GPU3.uuid in _field(node, "Comment")
        c.wait(late, timeout=60)
        seven = [c.sbatch(["--gres=gpu:1"], "sleep 3") for _ in range(7)]
        deadline = time.monotonic() + 30
        while not _running(c, seven):
            assert time.monotonic() < deadline, c.log_tail()
            time.sleep(0.3)
        eighth = c.sbatch(["--gres=gpu:1"], "true")
        time.sleep(2)
        assert c.state(eighth) == "PENDING"  # 7 GPUs, no more
        for j in [*seven, eighth]:
            c.wait(j, timeout=60)
        site.restart("slurmctld")
        site.restart("slurmd")
        node = site.wait_node(
            lambda n: "DRAIN" not in _field(n, "State") and "INVAL" not in _field(n, "State"))
        assert re.match(r"gpu:nvidia_h100_80gb_hbm3:7\b", _field(node, "Gres")), node
        assert GPU3.uuid in _field(node, "Comment")
        print(f"capacity: node drained for new jobs {lost_s:.1f} s (until its running jobs ended), "
              "then serving 7 of 8 GPUs", file=sys.stderr)
        out = site.gpuslurm("gpu", "online", "index:3", "--node-name", HOST, "--from", "dgx-h100")
        node = site.wait_node(lambda n: re.match(r"gpu:nvidia_h100_80gb_hbm3:8\b", _field(n, "Gres"))
                              and "DRAIN" not in _field(n, "State"))
        assert site.record() == {}, out.stdout
        assert (site.etc / "gres.conf").read_text().count("Name=gpu") == 8
        assert GPU3.uuid not in _field(node, "Comment")
    finally:
        subprocess.run([SCANCEL, *map(str, jobs)], env=c.env, capture_output=True, timeout=30, check=False)
        for path, text in saved.items():
            path.write_text(text)
        subprocess.run([SCONTROL, "reconfigure"], env=c.env, capture_output=True, timeout=30, check=False)
        subprocess.run([SCONTROL, "update", f"NodeName={HOST}", "State=RESUME"], env=c.env,
                       capture_output=True, timeout=30, check=False)
        subprocess.run([SCONTROL, "update", f"NodeName={HOST}", "Comment="], env=c.env,
                       capture_output=True, timeout=30, check=False)
        shutil.rmtree(root, ignore_errors=True)
