"""Watch and act, end to end in the real cluster (issue 4 §4).

Two real users. B's job holds one GPU; A's job holds another, and the replay scenario puts A's
real process on B's GPU as well. The monitor (a real process, 1 s cycles) must name A, the PID and
B's GPU within two cycles; ``gpuslurm throttle sync`` turns that into a throttle; slurmctld, through
plugins/job_submit.lua, refuses A's next ``sbatch --gres=gpu:1`` with the message while B still
submits; after the throttle expires A submits again. B's second job holds 2 GPUs with nothing on
them and is flagged idle once the (shortened) window has passed.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

import pytest
from tests.helpers import slurm_roots
from tests.helpers.slurm_helpers import SCANCEL, User, job_submit_plugin

from gpuslurm.hw.source import load_node
from gpuslurm.slurm.hookenv import gres_devices

if TYPE_CHECKING:
    from tests.helpers.cluster_fixture import SlurmCluster

pytestmark = pytest.mark.slurm

SBATCH = "/usr/bin/sbatch"
SETTLE_S = 4.5  # the plugin re-reads its file at most every 3 s
THROTTLE_MIN = 0.4  # sync throttles last 24 s after the violation was last seen
IDLE_WINDOW_S = 3


class Running(NamedTuple):
    job: int
    pid: int
    gres_index: int


class Scene:
    def __init__(self, cluster: SlurmCluster, root: Path, a: User, b: User) -> None:
        self.cluster, self.root, self.a, self.b = cluster, root, a, b
        self.throttle_file = cluster.conf.parent / "gpuslurm-throttle"
        self.config = root / "gpuslurm.toml"
        self.violations = root / "violations"

    def sbatch(self, user: User, *args: str, script: str = "true") -> subprocess.CompletedProcess[str]:
        argv = [SBATCH, "--parsable", "--chdir=/tmp", "--output=/dev/null", *args, "--wrap", script]
        return subprocess.run(argv, env=self.cluster.env, capture_output=True, text=True, timeout=60,
                              check=False, user=user.uid, group=user.gid, extra_groups=[], cwd="/tmp")

    def start(self, user: User, gpus: int) -> Running:
        """A running job of ``user`` whose process records its PID and its first GRES index."""
        mark = self.root / f"mark-{user.name}-{gpus}"
        record = f'echo "$$ $SLURM_JOB_GPUS" > {mark}.tmp; mv {mark}.tmp {mark}'
        proc = self.sbatch(user, f"--gres=gpu:{gpus}", "--time=5", script=f"{record}; exec sleep 300")
        assert proc.returncode == 0, proc.stderr
        job = int(proc.stdout.strip().split(";")[0])
        deadline = time.monotonic() + 30
        while not mark.exists():
            assert time.monotonic() < deadline, f"job {job} of {user.name} never started"
            time.sleep(0.1)
        pid, gpus_text = mark.read_text().split()
        return Running(job, int(pid), int(gpus_text.split(",")[0]))

    def gpuslurm(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        env = {**self.cluster.env, "GPUSLURM_CONFIG": str(self.config)}
        proc = subprocess.run([sys.executable, "-m", "gpuslurm", *args], env=env, capture_output=True,
                              text=True, timeout=60, check=False)
        assert not check or proc.returncode == 0, proc.stderr
        return proc

    def violation_records(self) -> list[dict[str, object]]:
        if not self.violations.is_dir():
            return []
        return [json.loads(line) for f in sorted(self.violations.iterdir())
                for line in f.read_text().splitlines() if line.strip()]


@pytest.fixture
def scene(slurm_cluster: SlurmCluster) -> Iterator[Scene]:
    tag = os.getpid() % 100000
    with job_submit_plugin(slurm_cluster, f"gswa{tag}") as (a, b):
        # Not pytest's tmp_path: its parents are 0700 and the users' jobs write their marks here.
        root = slurm_cluster.state_dir / f"watch-act-{os.getpid()}"
        root.mkdir()
        root.chmod(0o1777)
        yield Scene(slurm_cluster, root, a, b)


@slurm_roots.without_cgroups("the monitor attributes a process by its Slurm job cgroup, which is not made")
def test_a_rogue_process_gets_its_user_throttled_until_expiry(scene: Scene) -> None:
    bundle = os.environ.get("GPUSLURM_BUNDLE", "dgx-h100")
    node = load_node(bundle)
    uuid_of = {d.gres_index: d.uuid for d in gres_devices(node)}
    a, b = scene.a, scene.b
    job_b = scene.start(b, 1)
    job_a = scene.start(a, 1)
    idle_b = scene.start(b, 2)  # nothing of it ever runs on its GPUs
    gpu_a, gpu_b = uuid_of[job_a.gres_index], uuid_of[job_b.gres_index]
    assert gpu_a != gpu_b
    scenario = scene.root / "scenario.json"
    scenario.write_text(json.dumps({
        "gpus": {gpu_a: {"util": 40, "mem_mib": 1000}, gpu_b: {"util": 99, "mem_mib": 50000}},
        "procs": [{"pid": job_b.pid, "gpu": gpu_b, "mem_mib": 20000, "sm": 60},
                  {"pid": job_a.pid, "gpu": gpu_a, "mem_mib": 1000, "sm": 40},
                  {"pid": job_a.pid, "gpu": gpu_b, "mem_mib": 30000, "sm": 39}]}))  # A on B's GPU
    scene.config.write_text(
        f'[paths]\nrun_dir = "{scene.root / "run"}"\nstate_dir = "{scene.root / "state"}"\n'
        f'violations_dir = "{scene.violations}"\n'
        f'[monitor]\nnode_name = "{socket.gethostname().split(".")[0]}"\n'
        f'[detect.idle]\nwindow_s = {IDLE_WINDOW_S}\ngrace_s = 0\nmin_samples = 2\nmin_coverage = 0.5\n'
        f'[throttle]\nfile = "{scene.throttle_file}"\nsync_kinds = ["rogue"]\n'
        f'sync_minutes = {THROTTLE_MIN}\ncontact = "hpc-help@example.org"\n')

    env = {**scene.cluster.env, "GPUSLURM_CONFIG": str(scene.config),
           "GPUSLURM_SCENARIO": str(scenario), "GPUSLURM_CAPTURE": bundle}
    monitor = subprocess.Popen([sys.executable, "-m", "gpuslurm", "monitor", "--interval", "1", "--json",
                                "--db", str(scene.root / "state" / "monitor.db")],
                               env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        cycles: list[dict[str, object]] = []
        assert monitor.stdout is not None
        for line in monitor.stdout:
            cycles.append(json.loads(line))
            if len(cycles) >= IDLE_WINDOW_S + 3:
                break
    finally:
        monitor.send_signal(signal.SIGTERM)
        _, err = monitor.communicate(timeout=30)
    assert monitor.returncode == 0, err

    records = scene.violation_records()
    rogue = [v for v in records if v["kind"] == "rogue"]
    assert rogue, f"no rogue violation after {len(cycles)} cycles: {records}\n{err}"
    first = rogue[0]
    assert (first["user"], first["pid"], first["gpu_uuid"], first["job_id"]) == \
        (a.name, job_a.pid, gpu_b, str(job_a.job))
    second_cycle = float(cycles[1]["ts"])  # type: ignore[arg-type]
    assert float(first["start"]) <= second_cycle, "the rogue was not named within two cycles"  # type: ignore[arg-type]
    assert not any(v["user"] == b.name for v in rogue), rogue
    idle = [v for v in records if v["kind"] == "idle"]
    assert idle and {v["job_id"] for v in idle} == {str(idle_b.job)}, records

    sync = scene.gpuslurm("throttle", "sync")
    assert a.name in sync.stdout, sync.stdout
    listed = scene.gpuslurm("throttle", "list", "--json").stdout
    assert [t["user"] for t in json.loads(listed)["throttles"]] == [a.name], listed
    for job in (job_a, job_b, idle_b):
        subprocess.run([SCANCEL, str(job.job)], env=scene.cluster.env, check=False, timeout=30)

    time.sleep(SETTLE_S)
    refused = scene.sbatch(a, "--gres=gpu:1", "--hold")
    assert refused.returncode != 0, f"A's GPU job was accepted: {refused.stdout}"
    assert a.name in refused.stderr and "hpc-help@example.org" in refused.stderr, refused.stderr
    assert "until" in refused.stderr, refused.stderr
    ok = scene.sbatch(b, "--gres=gpu:1", "--hold")
    assert ok.returncode == 0, ok.stderr

    until = json.loads(listed)["throttles"][0]["until"]
    time.sleep(max(0.0, until - time.time()) + SETTLE_S)
    again = scene.sbatch(a, "--gres=gpu:1", "--hold")
    assert again.returncode == 0, f"still refused after expiry: {again.stderr}"
