"""A per-job MPS daemon inside the real test cluster: started by the prolog as the job's user,
reachable from the job, stopped by the epilog.

The session cluster has no ``gres/mps`` (that needs another gres.conf and a slurmd restart), so
jobs ask for MPS with the ``comment`` trigger; the ``gres`` trigger is tested on the prolog
environment Slurm 22.05 gave a ``--gres=mps:50`` job (tests/isolate/test_mps.py). Like
test_hooks_e2e, this module adds Prolog=/Epilog=/TaskProlog= to the running cluster, naming the
executables ``gpuslurm install`` writes (with an interpreter the job's user can run, for the task
prolog: ``cluster_fixture.users_python``), and restores slurm.conf afterwards. Jobs run as
``nobody`` (``sbatch --uid``), so the daemon's uid is not root's.
The MPS control program is the stand-in tests/helpers/fakes/nvidia-cuda-mps-control.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from tests.helpers import slurm_roots
from tests.helpers.cluster_fixture import install_hooks, users_python
from tests.helpers.mps_helpers import devices_cgroup, fake_control, live_with_pipe_under, probe_devices
from tests.helpers.mps_helpers import records as fake_records
from tests.helpers.slurm_helpers import restart_slurmd

from gpuslurm.hw.source import BUILTIN_DIR

if TYPE_CHECKING:
    from tests.helpers.cluster_fixture import SlurmCluster

pytestmark = pytest.mark.slurm

SCONTROL = "/usr/bin/scontrol"
NOBODY = 65534


@dataclass
class MpsCluster:
    cluster: SlurmCluster
    root: Path
    node: str

    @property
    def calls(self) -> Path:
        return self.root / "mps-calls.jsonl"

    @property
    def control(self) -> Path:
        return self.root / "bin" / "nvidia-cuda-mps-control"

    def records(self, event: str) -> list[dict[str, Any]]:
        return fake_records(self.calls, event)

    def scontrol(self, *args: str) -> str:
        return subprocess.run([SCONTROL, *args], env=self.cluster.env, capture_output=True, text=True,
                              check=True, timeout=30).stdout

    def submit(self, args: list[str], script: str) -> int:
        out = self.root / "out"
        as_nobody = [f"--uid={NOBODY}", f"--gid={NOBODY}", "--chdir=/tmp", f"--output={out}/%j.out"]
        return self.cluster.sbatch([*as_nobody, *args], script)

    def output(self, jobid: int) -> str:
        return (self.root / "out" / f"{jobid}.out").read_text()

    def hook_log(self) -> str:
        """What the hooks wrote to stderr, as slurmd logged it."""
        path = self.cluster.log_dir / "slurmd.log"
        return path.read_text(errors="replace") if path.exists() else ""


def _node_state(mc: MpsCluster) -> str:
    match = re.search(r"\bState=(\S+)", mc.scontrol("-o", "show", "node", mc.node))
    return match.group(1) if match else ""


def _wait_idle(mc: MpsCluster, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not _node_state(mc).startswith("IDLE"):
        if time.monotonic() > deadline:
            raise TimeoutError(f"node {mc.node} is {_node_state(mc)}\n{mc.cluster.log_tail()}\n"
                               f"{mc.hook_log()}")
        time.sleep(0.3)


@pytest.fixture(scope="module")
def mps_cluster(slurm_cluster: SlurmCluster) -> Iterator[MpsCluster]:
    root = Path(tempfile.mkdtemp(prefix="gpuslurm-mps-e2e-"))
    root.chmod(0o755)  # nobody reaches its pipe directory, the stand-in and its log through it
    (root / "out").mkdir(mode=0o777)
    (root / "out").chmod(0o777)
    bundle = root / "bundle"
    shutil.copytree(BUILTIN_DIR / "dgx-h100", bundle)
    node = subprocess.run(["/bin/hostname", "-s"], capture_output=True, text=True, check=True).stdout.strip()
    mc = MpsCluster(slurm_cluster, root, node)
    assert fake_control(root) == (mc.control, mc.calls)
    config = root / "gpuslurm.toml"
    config.write_text(
        "[paths]\n"
        f'run_dir = "{root / "run"}"\nstate_dir = "{root / "state"}"\nscontrol = "{SCONTROL}"\n'
        f'mps_control = "{mc.control}"\n'
        f'slurm_cgroup_conf = "{slurm_cluster.conf.parent / "cgroup.conf"}"\n'
        '[mps]\ntriggers = ["gres", "comment"]\nactive_thread_percentage = 60\n'
        "[hooks]\ncommand_timeout_s = 20\n")
    config.chmod(0o644)
    prefix = install_hooks(root, config, bundle, users_python(root))
    original = slurm_cluster.conf.read_text()
    lines = (f"Prolog={prefix}/gpuslurm-prolog\nEpilog={prefix}/gpuslurm-epilog\n"
             f"TaskProlog={prefix}/gpuslurm-task-prolog\n")
    slurm_cluster.conf.write_text(original.replace("\nNodeName=", f"\n{lines}NodeName=", 1))
    # slurmd restarted, not only reconfigured: on 26.05 with PrologFlags=RunInJob a `scontrol
    # reconfigure` once left no slurmd answering (restart_slurmd says why it is safe)
    try:
        _restart_slurmd(mc)
        yield mc
    finally:
        slurm_cluster.conf.write_text(original)
        for pid in live_with_pipe_under(str(root)):  # a failed run must not leave daemons behind
            os.kill(pid, signal.SIGKILL)
        try:
            _restart_slurmd(mc)
        except (AssertionError, TimeoutError) as exc:
            print(f"node did not come back: {exc}", file=sys.stderr)
        if not os.environ.get("GPUSLURM_KEEP_CLUSTER"):
            shutil.rmtree(root, ignore_errors=True)


JOB = """\
echo "UID=$(id -u)"
env | grep -E "^CUDA_MPS_" | sed "s/^/ENV /"
if [ -n "$CUDA_MPS_PIPE_DIRECTORY" ]; then
  stat -c "PIPE %a %u" "$CUDA_MPS_PIPE_DIRECTORY"
  echo "DAEMON $(cat "$CUDA_MPS_PIPE_DIRECTORY/nvidia-cuda-mps-control.pid")"
  echo get_default_active_thread_percentage | {control} | sed "s/^/ASKED /"
fi
"""


def test_mps_job_gets_its_own_daemon_as_its_user_and_the_epilog_stops_it(mps_cluster: MpsCluster) -> None:
    mc = mps_cluster
    jobid = mc.submit(["--gres=gpu:2", "--comment=train gpuslurm:mps"], JOB.format(control=mc.control))
    state = mc.cluster.wait(jobid, timeout=60)
    out = mc.output(jobid)
    assert state == "COMPLETED", f"{out}\n{mc.hook_log()}\n{mc.cluster.log_tail()}"
    pipe = mc.root / "run" / "mps" / str(jobid) / "pipe"
    env = dict(re.findall(r"^ENV (\w+)=(.*)$", out, re.M))
    assert "UID=65534" in out
    assert env["CUDA_MPS_PIPE_DIRECTORY"] == str(pipe), out
    assert env["CUDA_MPS_LOG_DIRECTORY"] == str(pipe.parent / "log")
    assert f"PIPE 700 {NOBODY}" in out  # the job's own private pipe directory
    assert "ASKED 60.0" in out  # the job reached its daemon, configured by the prolog

    start, = mc.records("start")
    daemon, = mc.records("daemon")
    assert (start["uid"], start["gid"], start["groups"]) == (NOBODY, NOBODY, [])
    assert start["env"]["CUDA_MPS_PIPE_DIRECTORY"] == str(pipe)
    assert len(start["env"]["CUDA_VISIBLE_DEVICES"].split(",")) == 2
    assert all(u.startswith("GPU-") for u in start["env"]["CUDA_VISIBLE_DEVICES"].split(","))
    assert f"DAEMON {daemon['pid']}" in out and daemon["uid"] == NOBODY
    commands = [r["command"] for r in mc.records("command")]
    assert commands[0] == "set_default_active_thread_percentage 60"
    # after the job: the epilog sent quit as the user, the daemon is gone, so are its directories
    assert commands[-1] == "quit" and mc.records("client")[-1]["uid"] == NOBODY
    deadline = time.monotonic() + 10
    while live_with_pipe_under(str(pipe)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert live_with_pipe_under(str(pipe)) == []
    assert not pipe.parent.exists()


def test_a_gpu_job_that_did_not_ask_gets_no_daemon(mps_cluster: MpsCluster) -> None:
    mc = mps_cluster
    before = len(mc.records("start"))
    jobid = mc.submit(["--gres=gpu:1", "--comment=gpuslurm:mpsx"], JOB.format(control=mc.control))
    assert mc.cluster.wait(jobid, timeout=60) == "COMPLETED", mc.hook_log()
    out = mc.output(jobid)
    assert "UID=65534" in out and "ENV CUDA_MPS" not in out
    assert len(mc.records("start")) == before


def _show_job(mc: MpsCluster, jobid: int) -> str:
    return mc.scontrol("-o", "show", "job", str(jobid))


def _wait_held(mc: MpsCluster, jobid: int, timeout: float = 60) -> str:
    deadline = time.monotonic() + timeout
    while not ("Reason=job_requeued_in_held_state" in (shown := _show_job(mc, jobid))
               and "JobState=PENDING" in shown):  # REQUEUE_HOLD first, while the job is put back
        if time.monotonic() > deadline or re.search(r"JobState=(COMPLETED|FAILED|CANCELLED)", shown):
            raise AssertionError(f"job {jobid} not held: {shown}\n{mc.hook_log()}\n{mc.cluster.log_tail()}")
        time.sleep(0.3)
    return shown


def _refused_and_node_up(mc: MpsCluster, jobid: int, why: str) -> None:
    try:
        shown = _wait_held(mc, jobid)
        assert "JobState=PENDING" in shown
        assert re.search(rf"Comment=gpuslurm refused this job: .*{why}", shown), shown
        squeue = subprocess.run(["/usr/bin/squeue", "-h", "-j", str(jobid), "-o", "%T %r"],
                                env=mc.cluster.env, capture_output=True, text=True, timeout=30,
                                check=True).stdout
        assert squeue.split() == ["PENDING", "job", "requeued", "in", "held", "state"], squeue
        assert not (mc.root / "out" / f"{jobid}.out").exists() or "UID=" not in mc.output(jobid)
        node = mc.scontrol("-o", "show", "node", mc.node)
        assert "DRAIN" not in node and "Reason=" not in node, node
    finally:
        subprocess.run(["/usr/bin/scancel", str(jobid)], env=mc.cluster.env, capture_output=True, timeout=30,
                       check=False)
    _wait_idle(mc)


def test_a_users_malformed_mps_request_holds_the_job_and_leaves_the_node_up(mps_cluster: MpsCluster) -> None:
    mc = mps_cluster
    jobid = mc.submit(["--gres=gpu:1", "--comment=train gpuslurm:mps=lots"], JOB.format(control=mc.control))
    _refused_and_node_up(mc, jobid, "bad MPS request")


def test_an_mps_daemon_failing_as_the_user_holds_the_job_and_leaves_the_node_up(
        mps_cluster: MpsCluster) -> None:
    mc = mps_cluster
    wrapper = mc.control.read_text()
    mc.control.write_text(wrapper.replace("exec ", "GPUSLURM_FAKE_MPS_FAIL_START=1 exec ", 1))
    try:
        jobid = mc.submit(["--gres=gpu:1", "--comment=gpuslurm:mps"], JOB.format(control=mc.control))
        _refused_and_node_up(mc, jobid, "MPS daemon did not start")
    finally:
        mc.control.write_text(wrapper)


def _restart_slurmd(mc: MpsCluster) -> None:
    """slurmd restarted (slurmctld stays; PrologFlags is read when it starts) and the node idle."""
    restart_slurmd(mc.cluster)
    _wait_idle(mc, timeout=60)


# Not run where it cannot pass: without cgroups there is no extern step cgroup, and on v2 it would
# look for the v1 devices hierarchy (each run costs two slurmd restarts).
@slurm_roots.without_cgroups("it looks for Slurm's extern step cgroup", run=False)
@slurm_roots.v1_only("it reads the v1 devices hierarchy; an MPS daemon under Slurm's own v2 job cgroup "
                     "is issue 19's open item", run=False)
def test_with_prolog_contain_the_daemon_runs_inside_the_jobs_device_limits(mps_cluster: MpsCluster) -> None:
    """Slurm constrains devices here (ConstrainDevices=yes), gpuslurm does not. Slurm 22.05 makes
    the job's cgroups only after the prolog, also with PrologFlags=Contain (slurmd restarted with
    it: by the time the job runs, Slurm's extern step cgroup exists, but the daemon started
    before it). So the prolog starts the daemon in a devices cgroup of its own for the daemon
    (``gpuslurm/mps_<id>``, the job's GPUs only): its /proc/PID/cgroup names it, and a process
    there, as the user, cannot open another GPU's device file (the fake /dev/nvidiaN open with
    ENXIO where allowed, EPERM where the cgroup refuses). The job's tasks stay in Slurm's."""
    mc = mps_cluster
    conf = mc.cluster.conf
    before = conf.read_text()
    conf.write_text(before.replace("\nNodeName=", "\nPrologFlags=Contain\nNodeName=", 1))
    jobid = None
    try:
        _restart_slurmd(mc)
        script = ('echo "GPUS=$SLURM_JOB_GPUS"\n'
                  'echo "DAEMON $(cat "$CUDA_MPS_PIPE_DIRECTORY/nvidia-cuda-mps-control.pid")"\nsleep 30\n')
        jobid = mc.submit(["--gres=gpu:1", "--comment=gpuslurm:mps"], script)
        deadline = time.monotonic() + 60
        while "DAEMON " not in (out := (mc.root / "out" / f"{jobid}.out").read_text()
                                if (mc.root / "out" / f"{jobid}.out").exists() else ""):
            assert time.monotonic() < deadline, f"{mc.hook_log()}\n{mc.cluster.log_tail()}"
            time.sleep(0.3)
        pid = int(re.search(r"^DAEMON (\d+)$", out, re.M).group(1))  # type: ignore[union-attr]
        gpu = int(re.search(r"^GPUS=(\d+)$", out, re.M).group(1))  # type: ignore[union-attr]
        devices = devices_cgroup(pid)
        assert devices == f"/gpuslurm/mps_{jobid}", devices
        slurms = list(Path("/sys/fs/cgroup/devices").glob(f"slurm*/uid_{NOBODY}/job_{jobid}/step_extern"))
        assert slurms, "Contain is on: Slurm's extern step cgroup exists once the job runs"
        files = sorted(Path("/dev").glob("nvidia[0-9]*"), key=lambda p: int(p.name[6:]))
        opened = probe_devices(list(map(str, files)), NOBODY, NOBODY,
                               f"/sys/fs/cgroup/devices{devices}/cgroup.procs")
        got = str(opened)
        assert opened.pop(f"/dev/nvidia{gpu}") == "ENXIO", got  # the job's own GPU (minor = index here)
        assert set(opened.values()) == {"EPERM"}, got  # every other GPU refused by Slurm's cgroup
    finally:
        if jobid is not None:
            subprocess.run(["/usr/bin/scancel", str(jobid)], env=mc.cluster.env, capture_output=True,
                           timeout=30, check=False)
            mc.cluster.wait(jobid, timeout=60)
        conf.write_text(before)
        _restart_slurmd(mc)
