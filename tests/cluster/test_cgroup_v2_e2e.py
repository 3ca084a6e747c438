"""gpuslurm under Slurm's own cgroup/v2 plugin, end to end (issue 19, item 2).

Runs where the session cluster runs Slurm's cgroup/v2 plugin: ``GPUSLURM_SLURM_RELEASE=24.11`` or
``26.05`` (docker-slurm/cluster.sh gives the root a cgroup2 tree of its own and slurmd the
tests/cgroup2_only.c preload: it stands in for a host booted without v1). The host's 22.05 runs
cgroup v1 and skips this module.

gpuslurm is installed as a site installs it on Debian's packages: the hooks with a config that sets
no ``[cgroup] v2_job_parent`` (found from cgroup.conf, not assumed). Each test says which cgroup.conf
it runs under (``ConstrainDevices``, 26.05's ``CgroupJobIdPaths``); slurmd is restarted to read it
and cgroup.conf and slurm.conf are restored afterwards. Jobs that probe devices run as nobody.
"""

from __future__ import annotations

import json
import os
import pwd
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from tests.helpers import slurm_roots
from tests.helpers.cluster_fixture import install_hooks, users_python
from tests.helpers.slurm_helpers import (
    SCONTROL,
    conf_with,
    hook_lines,
    hooks_root,
    restart_slurmd,
    short_hostname,
)

from gpuslurm.hw.source import load_node
from gpuslurm.slurm.hookenv import gres_devices

if TYPE_CHECKING:
    from tests.helpers.cluster_fixture import SlurmCluster

pytestmark = [
    pytest.mark.slurm,
    pytest.mark.skipif(not slurm_roots.runs_cgroup_v2(),
                       reason="Slurm's cgroup/v2 plugin runs here only from the 24.11 and 26.05 roots "
                              "(GPUSLURM_SLURM_RELEASE); the host's 22.05 cluster is cgroup v1 "
                              "(docs/compatibility.md)"),
]

NOBODY = pwd.getpwnam("nobody").pw_uid
GPUS = 8
# Opens every fake GPU: ENXIO where the device cgroup lets it through (no driver behind it),
# EPERM where it refuses.
PROBE = """{python} - <<'EOF'
import errno
for i in range({gpus}):
    try:
        open(f"/dev/nvidia{{i}}", "rb").close()
        print("{tag}", i, "OK")
    except OSError as exc:
        print("{tag}", i, errno.errorcode.get(exc.errno, exc.errno))
EOF
"""


def probe(tag: str) -> str:
    return PROBE.format(python="/usr/bin/python3", gpus=GPUS, tag=tag)


def opened(text: str, tag: str) -> dict[int, str]:
    return {int(i): what for i, what in re.findall(rf"^{tag} (\d+) (\S+)$", text, re.M)}


def allowed(text: str, tag: str) -> set[int]:
    """The GPUs the probe tagged ``tag`` could open (ENXIO: let through to a device with no driver)."""
    found = opened(text, tag)
    assert len(found) == GPUS and set(found.values()) <= {"ENXIO", "EPERM"}, text
    return {i for i, what in found.items() if what == "ENXIO"}


def job_gpus(text: str, name: str = "JOB_GPUS") -> set[int]:
    found = re.search(rf"^{name}=(.*)$", text, re.M)
    assert found and found.group(1), text
    return {int(i) for i in found.group(1).split(",")}


@dataclass
class V2Site:
    cluster: SlurmCluster
    root: Path
    bundle: Path
    original_conf: str
    original_cgroup: str

    @property
    def cgroup_conf(self) -> Path:
        return self.cluster.conf.parent / "cgroup.conf"

    @property
    def out(self) -> Path:
        return self.root / "out"

    def use_cgroup_conf(self, **settings: str) -> None:
        """cgroup.conf as the session's with ``settings`` (``ConstrainDevices="no"``, ...) set,
        and slurmd restarted to read it (running jobs stay)."""
        text = self.original_cgroup
        for key, value in settings.items():
            text = re.sub(rf"(?m)^{key}=.*\n", "", text) + f"{key}={value}\n"
        if text != self.cgroup_conf.read_text():
            self.cgroup_conf.write_text(text)
            restart_slurmd(self.cluster, reconfigure=False)

    def submit(self, args: list[str], script: str) -> int:
        return self.cluster.sbatch([f"--output={self.out}/slurm-%j.out", "--chdir=/", *args], script)

    def output(self, jobid: int) -> str:
        path = self.out / f"slurm-{jobid}.out"
        return path.read_text() if path.exists() else ""

    def run(self, args: list[str], script: str, timeout: float = 90) -> tuple[int, str]:
        """Submit, wait, and the job's output; the job must complete."""
        jobid = self.submit(args, script)
        state = self.cluster.wait(jobid, timeout=timeout)
        text = self.output(jobid)
        assert state == "COMPLETED", f"job {jobid} {state}\n{text}\n{self.detail(jobid)}"
        return jobid, text

    def wait_for(self, jobid: int, line: str, timeout: float = 60) -> str:
        """The job's output once it holds a line starting with ``line``."""
        deadline = time.monotonic() + timeout
        while not re.search(rf"^{re.escape(line)}", text := self.output(jobid), re.M):
            assert time.monotonic() < deadline, \
                f"job {jobid} never wrote {line!r}\n{text}\n{self.detail(jobid)}"
            time.sleep(0.2)
        return text

    def detail(self, jobid: int | None = None) -> str:
        job = ""
        if jobid is not None:
            job = subprocess.run([SCONTROL, "show", "job", str(jobid)], env=self.cluster.env,
                                 capture_output=True, text=True, timeout=30, check=False).stdout
        return f"{job}\n{self.cluster.log_tail(40)}"

    def cancel(self, *jobids: int) -> None:
        for jobid in jobids:
            subprocess.run(["/usr/bin/scancel", str(jobid)], env=self.cluster.env, capture_output=True,
                           timeout=30, check=False)
        for jobid in jobids:
            self.cluster.wait(jobid, timeout=60)


@pytest.fixture(scope="module")
def v2(slurm_cluster: SlurmCluster) -> Iterator[V2Site]:
    """The hooks installed with a config naming no v2_job_parent (a site's default)."""
    root, bundle = hooks_root("gpuslurm-v2-")
    python = users_python(root)
    (root / "out").mkdir()
    (root / "out").chmod(0o1777)  # jobs write their output there as nobody
    config = root / "gpuslurm.toml"
    cgroup_conf = slurm_cluster.conf.parent / "cgroup.conf"
    config.write_text(f'[paths]\nrun_dir = "{root / "run"}"\nstate_dir = "{root / "state"}"\n'
                      f'scontrol = "{SCONTROL}"\nslurm_cgroup_conf = "{cgroup_conf}"\n'
                      '[hooks]\ncommand_timeout_s = 20\n')
    prefix = install_hooks(root, config, bundle, python)
    site = V2Site(slurm_cluster, root, bundle, slurm_cluster.conf.read_text(), cgroup_conf.read_text())
    slurm_cluster.conf.write_text(conf_with(site.original_conf, hook_lines(prefix)))
    try:
        restart_slurmd(slurm_cluster)
        yield site
    finally:
        slurm_cluster.conf.write_text(site.original_conf)
        cgroup_conf.write_text(site.original_cgroup)
        try:
            restart_slurmd(slurm_cluster)
        finally:
            if not os.environ.get("GPUSLURM_KEEP_CLUSTER"):
                shutil.rmtree(root, ignore_errors=True)


def _sluid_layout(v2: V2Site) -> bool:
    """Whether Slurm names job cgroups by SLUID under the current cgroup.conf (26.05's default)."""
    release = slurm_roots.selected()
    on = re.search(r"(?m)^CgroupJobIdPaths=(\S+)", v2.cgroup_conf.read_text())
    return release is not None and release.has_jobid_paths and not (on and on.group(1).lower() == "yes")


def _sluid_dir(sluid: str) -> str:
    """The job directory Slurm names by SLUID (its text form, ``s`` and 13 digits, as
    SLURM_JOB_SLUID gives it)."""
    return sluid if sluid.startswith("s") else f"s{sluid}"


def _job_dir(cgroup: str) -> str:
    """The job directory the unified line of a /proc/PID/cgroup text names."""
    unified = next(line for line in cgroup.splitlines() if line.startswith("0::"))
    found = re.search(r"_?slurmstepd\.scope/([^/]+)/", unified)
    assert found, cgroup
    return found.group(1)


def test_the_default_config_runs_jobs_on_debians_packages(v2: V2Site) -> None:
    """gpuslurm installed with no ``v2_job_parent``: a GPU job runs, as nobody, under both
    device settings; it is never held (``launch_failed_requeued_held``: the prolog failing closed
    on a guessed ``slurmstepd.scope`` that Debian's multiple-slurmd build names
    ``<node>_slurmstepd.scope``)."""
    for constrain in ("yes", "no"):
        v2.use_cgroup_conf(ConstrainDevices=constrain)
        jobid = v2.submit(["--gres=gpu:2", f"--uid={NOBODY}"], 'echo "JOB_GPUS=$SLURM_JOB_GPUS"\n')
        state = v2.cluster.wait(jobid, timeout=90)
        shown = subprocess.run([SCONTROL, "-o", "show", "job", str(jobid)], env=v2.cluster.env,
                               capture_output=True, text=True, timeout=30, check=True).stdout
        assert "launch_failed_requeued_held" not in shown, f"ConstrainDevices={constrain}\n{v2.detail(jobid)}"
        assert state == "COMPLETED", f"ConstrainDevices={constrain}: {state}\n{v2.detail(jobid)}"
        assert len(job_gpus(v2.output(jobid))) == 2


def test_gpuslurms_own_isolation_confines_a_job_to_its_gpus(v2: V2Site) -> None:
    """``ConstrainDevices=no``: gpuslurm's own v2 device program is the isolation. A job of nobody
    given 3 GPUs opens those and no other (EPERM), in the job directory Slurm really uses (26.05:
    ``s<SLUID>``; a program attached to a ``job_<id>`` directory of its own confines nothing)."""
    v2.use_cgroup_conf(ConstrainDevices="no")
    _, out = v2.run(["--gres=gpu:3", f"--uid={NOBODY}"],
                    'echo "JOB_GPUS=$SLURM_JOB_GPUS"\ngrep ^0:: /proc/self/cgroup | sed "s/^/CGROUP /"\n'
                    + probe("BATCH"))
    mine = job_gpus(out)  # dgx-h100: minor = index
    assert allowed(out, "BATCH") == mine, out


def test_without_any_device_confinement_every_gpu_opens(v2: V2Site) -> None:
    """The negative control of the test above: ``ConstrainDevices=no`` and gpuslurm's own
    isolation off (``[cgroup] devices = "never"``): the job opens all 8."""
    config = v2.root / "gpuslurm.toml"
    original = config.read_text()
    v2.use_cgroup_conf(ConstrainDevices="no")
    try:
        config.write_text(original + '[cgroup]\ndevices = "never"\n')
        _, out = v2.run(["--gres=gpu:1", f"--uid={NOBODY}"], probe("BATCH"))
    finally:
        config.write_text(original)
    assert allowed(out, "BATCH") == set(range(GPUS)), out


def test_slurm_confines_each_step_to_its_gpus(v2: V2Site) -> None:
    """``ConstrainDevices=yes``: Slurm's own v2 plugin confines each step (gpuslurm's is per job:
    docs/compatibility.md). The batch step of a 2-GPU job opens both, an ``srun --gres=gpu:1``
    step only its one."""
    v2.use_cgroup_conf(ConstrainDevices="yes")
    script = ('echo "JOB_GPUS=$SLURM_JOB_GPUS"\n' + probe("BATCH")
              + "srun --gres=gpu:1 -n1 /bin/bash -c 'echo \"STEP_GPUS=$SLURM_STEP_GPUS\"\n"
              + probe("STEP").replace("'", "'\\''") + "'\n")
    _, out = v2.run(["--gres=gpu:2", f"--uid={NOBODY}"], script)
    mine = job_gpus(out)
    assert len(mine) == 2 and allowed(out, "BATCH") == mine, out
    step = allowed(out, "STEP")
    assert len(step) == 1 and step < mine, out
    assert job_gpus(out, "STEP_GPUS") == step, out


def _monitor_once(v2: V2Site, tmp_path: Path, procs: list[dict[str, object]]) -> dict[str, object]:
    """One monitor cycle on this node, NVML replayed with ``procs`` on the bundle's GPUs, the hooks'
    job maps in its run directory."""
    scenario = tmp_path / "scenario.json"
    scenario.write_text(json.dumps({"procs": procs}))
    config = tmp_path / "gpuslurm.toml"
    config.write_text(f'[paths]\nrun_dir = "{v2.root / "run"}"\nstate_dir = "{tmp_path / "state"}"\n'
                      f'violations_dir = "{tmp_path / "violations"}"\nscontrol = "{SCONTROL}"\n'
                      f'[monitor]\nnode_name = "{short_hostname()}"\n')
    env = {**v2.cluster.env, "GPUSLURM_CONFIG": str(config), "GPUSLURM_SCENARIO": str(scenario),
           "GPUSLURM_CAPTURE": str(v2.bundle)}
    done = subprocess.run([sys.executable, "-m", "gpuslurm", "monitor", "--once", "--json",
                           "--db", str(tmp_path / "state" / "monitor.db")],
                          env=env, capture_output=True, text=True, timeout=90, check=False)
    assert done.returncode == 0, done.stderr
    cycle: dict[str, object] = json.loads(done.stdout)
    return cycle


SLEEPER = 'echo "PID=$$ JOB_GPUS=$SLURM_JOB_GPUS SLUID=${SLURM_JOB_SLUID:-}"\nexec sleep 300\n'


def _sleeper(text: str) -> tuple[int, int, str]:
    found = re.search(r"^PID=(\d+) JOB_GPUS=(\d+)\S* SLUID=(\S*)$", text, re.M)
    assert found, text
    return int(found.group(1)), int(found.group(2)), found.group(3)


def test_both_layouts_on_one_node_are_attributed(v2: V2Site, tmp_path: Path) -> None:
    """An upgrade with running jobs: job A starts under ``CgroupJobIdPaths=yes`` (``job_<id>``),
    slurmd restarts with ``no`` (``s<SLUID>``: 26.05's default) and job B starts. One monitor
    cycle attributes each job's GPU process to its own job: neither is rogue, neither "no job"."""
    release = slurm_roots.selected()
    if release is None or not release.has_jobid_paths:
        pytest.skip(f"Slurm {release.name if release else '22.05'} has one layout (job_<id>): "
                    "CgroupJobIdPaths and SLUID directories are 26.05's")
    node = load_node(str(v2.bundle))
    jobs: list[int] = []
    try:
        v2.use_cgroup_conf(CgroupJobIdPaths="yes")
        jobs.append(v2.submit(["--gres=gpu:1", "--time=5"], SLEEPER))
        pid_a, gpu_a, _ = _sleeper(v2.wait_for(jobs[0], "PID="))
        v2.use_cgroup_conf(CgroupJobIdPaths="no")
        assert v2.cluster.state(jobs[0]) == "RUNNING", v2.detail(jobs[0])
        jobs.append(v2.submit(["--gres=gpu:1", "--time=5"], SLEEPER))
        pid_b, gpu_b, sluid_b = _sleeper(v2.wait_for(jobs[1], "PID="))
        cgroup_a = Path(f"/proc/{pid_a}/cgroup").read_text()
        cgroup_b = Path(f"/proc/{pid_b}/cgroup").read_text()
        assert _job_dir(cgroup_a) == f"job_{jobs[0]}", cgroup_a
        assert sluid_b and _job_dir(cgroup_b) == _sluid_dir(sluid_b), cgroup_b
        uuids = [g.uuid for g in gres_devices(node)]
        cycle = _monitor_once(v2, tmp_path, [{"pid": pid_a, "gpu": uuids[gpu_a], "mem_mib": 100},
                                             {"pid": pid_b, "gpu": uuids[gpu_b], "mem_mib": 100}])
    finally:
        v2.cancel(*jobs)
    procs = {p["gpu_uuid"]: p for p in cycle["procs"]}  # type: ignore[attr-defined]
    got = (procs[uuids[gpu_a]]["job_id"], procs[uuids[gpu_b]]["job_id"])
    assert got == (str(jobs[0]), str(jobs[1])), cycle
    violations = tmp_path / "violations"
    rogue = [line for f in violations.iterdir() for line in f.read_text().splitlines()] \
        if violations.exists() else []
    assert rogue == [], rogue


def test_the_epilog_spares_another_jobs_process_in_its_layout(v2: V2Site) -> None:
    """Job B (nobody, sleeping on its GPU) runs in the session's layout (26.05: ``s<SLUID>``).
    Job A's GPU lists B's process (health.json, as NVML would for a process on a GPU it was not
    given); A's epilog must read B's cgroup as B's and leave it alone. Read as "in no job", the
    process on a GPU that was A's alone would be A's leftover, and killed."""
    v2.use_cgroup_conf()  # the session's cgroup.conf: Slurm's default layout
    health = v2.bundle / "health.json"
    jobs: list[int] = []
    try:
        jobs.append(v2.submit(["--gres=gpu:1", "--time=5", f"--uid={NOBODY}"], SLEEPER))
        pid_b, _, sluid_b = _sleeper(v2.wait_for(jobs[0], "PID="))
        cgroup_b = Path(f"/proc/{pid_b}/cgroup").read_text()
        if _sluid_layout(v2):
            assert _job_dir(cgroup_b) == _sluid_dir(sluid_b), cgroup_b
        node = load_node(str(v2.bundle))
        uuids = [g.uuid for g in node.gpus]
        facts = json.dumps({uuid: {"processes": [{"pid": pid_b, "user": "nobody"}]} for uuid in uuids})
        # the job itself records the process, so that its prolog's health gate saw clean GPUs
        job_a, _ = v2.run(["--gres=gpu:1"], f"cat > {health} <<'EOF'\n{facts}\nEOF\n")
        summary_path = v2.root / "state" / "jobs" / f"{job_a}-summary.json"
        deadline = time.monotonic() + 30
        while not summary_path.exists():
            assert time.monotonic() < deadline, v2.detail(job_a)
            time.sleep(0.2)
        summary = json.loads(summary_path.read_text())
        assert Path(f"/proc/{pid_b}").exists() and v2.cluster.state(jobs[0]) == "RUNNING", summary
        assert summary["leftovers"] == [], summary
        node = subprocess.run([SCONTROL, "-o", "show", "node", short_hostname()], env=v2.cluster.env,
                              capture_output=True, text=True, timeout=30, check=True).stdout
        assert "DRAIN" not in node, f"{summary}\n{node}"  # nor counted by the release check
    finally:
        health.unlink(missing_ok=True)
        v2.cancel(*jobs)
        # after a failure above, the node back for the tests after this one
        subprocess.run([SCONTROL, "update", f"NodeName={short_hostname()}", "State=RESUME"],
                       env=v2.cluster.env, capture_output=True, timeout=30, check=False)
