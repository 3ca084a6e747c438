"""``gpuslurm jobstats`` on a real PBS job (``123.pbshost`` ids): the monitor attributes the job of
the ordinary user gpuspbs1 through qstat and its session, stores its cycles and leaves the job's
file for its owner (root's, read through its ACL); root reads the store; gpuspbs1 reads their own
job's figures without the store; another user (the real ``nobody``) gets the unknown job's line
for that id, and after the job ends its owner reads the ended job's last figures."""

from __future__ import annotations

import json
import os
import pwd
import stat
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from tests.helpers.cluster_fixture import users_site
from tests.helpers.jobstats_helpers import JOBSTATS_AS_USER
from tests.helpers.pbs_fixture import PREFIX, PbsCluster
from tests.helpers.slurm_helpers import wait_for_line

from gpuslurm import safedir
from gpuslurm.gres.pbs_vnodes import plan_vnodes
from gpuslurm.hw.source import load_node

pytestmark = pytest.mark.pbs

BUNDLE = os.environ.get("GPUSLURM_BUNDLE", "dgx-h100")
COMMANDS = ("qstat", "pbsnodes", "qalter", "qhold", "qrerun", "qdel", "qmgr")  # conftest.py wraps these
NOBODY = 65534

@pytest.fixture
def site(pbs_bin: Path) -> Iterator[Path]:
    """A 0755 directory users reach: the users' interpreter, and a config for the PBS monitor."""
    with users_site("gpuslurm-pbs-jobstats-") as base:
        config = base / "gpuslurm.toml"
        config.write_text(f'[paths]\nrun_dir = "{base / "run"}"\nstate_dir = "{base / "state"}"\n'
                          f'violations_dir = "{base / "violations"}"\n'
                          + "".join(f'{name} = "{pbs_bin / name}"\n' for name in COMMANDS)
                          + '[monitor]\nnode_name = "pbshost"\ninterval_s = 1\n[scheduler]\nkind = "pbs"\n')
        config.chmod(0o644)
        yield base


def _qstat(cluster: PbsCluster, job: str) -> dict[str, object]:
    item: dict[str, object] = json.loads(cluster.run(str(PREFIX / "bin" / "qstat"), "-xf", "-F", "json",
                                                     job))["Jobs"][job]
    return item


def _vnode_gpus(exec_vnode: str) -> list[str]:
    """The GPUs of the NUMA vnode the one chunk ran on, ``(pbshost[N]:...)``, sorted."""
    node = load_node(BUNDLE)
    numa = int(exec_vnode.split("[", 1)[1].split("]", 1)[0])
    minors = next(v.gpu_minors for v in plan_vnodes(node) if v.numa_node == numa)
    return sorted(g.uuid for g in node.gpus if g.minor in minors)


def _as(uid: int, base: Path, job: str) -> subprocess.CompletedProcess[str]:
    gid = pwd.getpwuid(uid).pw_gid
    return subprocess.run([str(base / "users-venv" / "bin" / "python"), "-c", JOBSTATS_AS_USER, job],
                          user=uid, group=gid,
                          extra_groups=[], timeout=60, cwd="/", capture_output=True, text=True, check=False,
                          env={"PATH": "/usr/bin:/bin", "GPUSLURM_CONFIG": str(base / "gpuslurm.toml")})


def _gpuslurm(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gpuslurm", *args], env=env, capture_output=True, text=True,
                          timeout=120, check=False)


def _job_file(site: Path, job: str, want: Callable[[dict[str, Any]], bool], monitor: subprocess.Popen[str],
              timeout: float = 90) -> dict[str, Any]:
    """The job's file as the monitor left it, once ``want`` holds for it (read as root)."""
    path = site / "state" / "jobstats" / f"{job}.json"
    deadline = time.monotonic() + timeout
    while True:
        assert monitor.poll() is None, monitor.communicate()
        try:
            doc: dict[str, Any] = json.loads(path.read_text())
            if want(doc):
                return doc
        except (FileNotFoundError, json.JSONDecodeError):
            pass
        if time.monotonic() > deadline:
            raise TimeoutError(f"{path}: not as wanted after {timeout}s")
        time.sleep(0.5)


def test_jobstats_of_a_real_pbs_job_for_its_owner_and_not_for_another_user(
        pbs_cluster: PbsCluster, site: Path) -> None:
    owner = pwd.getpwnam(pbs_cluster.user).pw_uid
    mark = pbs_cluster.state_dir / "jobs" / f"jobstats-{os.getpid()}-{time.monotonic_ns()}"
    job = pbs_cluster.qsub(["-l", "select=1:ncpus=4:ngpus=4"], f'echo "$$" > {mark}\nexec sleep 300\n')
    assert job.endswith(".pbshost"), job  # the id PBS prints, server part and all
    env = {**os.environ, "GPUSLURM_CONFIG": str(site / "gpuslurm.toml"),
           "GPUSLURM_SCENARIO": str(site / "scenario.json"), "GPUSLURM_CAPTURE": BUNDLE}
    monitor = None
    try:
        pid = int(wait_for_line(mark, 60))
        deadline = time.monotonic() + 60  # the session reaches the server with pbs_mom's next update
        while "session_id" not in (item := _qstat(pbs_cluster, job)) and time.monotonic() < deadline:
            time.sleep(0.5)
        given = _vnode_gpus(str(item["exec_vnode"]))
        gpu = given[0]
        (site / "scenario.json").write_text(json.dumps({
            "procs": [{"pid": pid, "gpu": gpu, "mem_mib": 3000}],
            "gpus": {gpu: {"util": 0, "mem_mib": 3000, "power_w": 90}}}))
        monitor = subprocess.Popen([sys.executable, "-m", "gpuslurm", "monitor"], env=env, text=True,
                                   stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        _job_file(site, job, lambda doc: bool(doc["gpus"]), monitor)
        deadline = time.monotonic() + 60
        while True:  # two cycles of the job in the store
            as_root = _gpuslurm(env, "jobstats", job, "--json")
            if as_root.returncode == 0 and min(g["samples"] for g in json.loads(as_root.stdout)["gpus"]) >= 2:
                break
            assert time.monotonic() < deadline, as_root.stderr
            time.sleep(0.5)
        as_owner = _as(owner, site, job)
        as_nobody = _as(NOBODY, site, job)
        store_as_owner = subprocess.run(["/bin/cat", str(site / "state" / "monitor.db")], user=owner,
                                        capture_output=True, timeout=30, check=False)
        pbs_cluster.run(str(PREFIX / "bin" / "qdel"), job)
        deadline = time.monotonic() + 60
        while _qstat(pbs_cluster, job)["job_state"] != "F":
            assert time.monotonic() < deadline, _qstat(pbs_cluster, job)
            time.sleep(0.5)
        # the job ended: the monitor writes its last figures for its owner when it sees that
        _job_file(site, job, lambda doc: doc["job"]["running"] is False, monitor)
        ended = _as(owner, site, job)
    finally:
        pbs_cluster.run(str(PREFIX / "bin" / "qdel"), "-W", "force", job, check=False)
        if monitor is not None:
            monitor.terminate()
            monitor.communicate(timeout=60)
    doc = json.loads(as_root.stdout)
    assert (doc["job"]["id"], doc["job"]["uid"], doc["job"]["source"], doc["job"]["running"]) == \
        (job, owner, "qstat", True)
    gpus = {g["uuid"]: g for g in doc["gpus"]}
    assert sorted(gpus) == given  # the 4 GPUs of the vnode qstat's exec_vnode names
    assert gpus[gpu]["samples"] >= 2 and gpus[gpu]["util_mean_pct"] == 0.0
    assert gpus[gpu]["mem_peak_mib"] >= 3000.0
    assert [(p["pid"], p["name"]) for p in doc["processes"]] == [(pid, "sleep")]
    assert doc["verdict"] == "idle GPUs"

    assert store_as_owner.returncode != 0  # the store stays root's: the owner reads their file
    assert as_owner.returncode == 0, as_owner.stderr
    mine = json.loads(as_owner.stdout)
    assert (mine["job"]["id"], mine["job"]["uid"], sorted(g["uuid"] for g in mine["gpus"])) == \
        (job, owner, given)
    path = site / "state" / "jobstats" / f"{job}.json"
    f = path.stat()  # root's, read by its owner through the file's ACL (the mask shows as 0440)
    assert (f.st_uid, stat.S_IMODE(f.st_mode)) == (0, 0o440)
    assert (safedir.ACL_USER, 0o4, owner) in safedir.acl_entries(os.getxattr(path, safedir.ACL_XATTR))

    assert as_nobody.returncode == 2
    assert as_nobody.stderr.strip() == f"job {job}: not in this node's monitor store, or not yours"

    assert ended.returncode == 0, ended.stderr
    last = json.loads(ended.stdout)
    assert (last["job"]["id"], last["job"]["running"], sorted(g["uuid"] for g in last["gpus"])) == \
        (job, False, given)
    assert min(g["samples"] for g in last["gpus"]) >= 2
