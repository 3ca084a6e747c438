"""``gpuslurm throttle auto`` on the real PBS, as real users: under load the user above their fair
share gets ``[u:NAME=1]`` in the server's ``max_run_res.ngpus``, their extra GPU job stays queued with
the scheduler naming the limit, and runs once the load eases and the limit is lifted. Every other
entry of the value is kept; an attacker's job fields never reach qmgr.
"""

from __future__ import annotations

import json
import pwd
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from tests.helpers.pbs_fixture import PBS_DIR, PREFIX, PbsCluster

pytestmark = pytest.mark.pbs

QMGR = str(PREFIX / "bin" / "qmgr")
QDEL = str(PREFIX / "bin" / "qdel")
QSTAT = str(PREFIX / "bin" / "qstat")
SECOND = "gpuspbs2"
HOSTILE = 'x"];[u:root=0],[u:' + SECOND + '=0]"; delete node pbshost #'


@pytest.fixture(scope="module")
def second_user(pbs_cluster: PbsCluster) -> Iterator[str]:
    """A second real user of the cluster (the attacker, and the one below fair share)."""
    try:
        home = Path(pwd.getpwnam(SECOND).pw_dir)
        made = False
        if not home.is_dir():  # left by a run that could not delete it: its home went with the cluster
            subprocess.run(["userdel", SECOND], check=True, timeout=30)
            raise KeyError(SECOND)
    except KeyError:
        home = pbs_cluster.state_dir / "users" / SECOND
        subprocess.run(["useradd", "--create-home", "--home-dir", str(home), "--shell", "/bin/bash", SECOND],
                       check=True, timeout=30)
        made = True
    yield SECOND
    deadline = time.monotonic() + 90
    while made and (gone := subprocess.run(["userdel", SECOND], capture_output=True, text=True,
                                           check=False, timeout=30)).returncode:
        if time.monotonic() > deadline:  # its jobs' processes may take a moment to go
            print(f"could not delete user {SECOND}: {gone.stderr.strip()}", file=sys.stderr)
            break
        time.sleep(1)


def _auto(cluster: PbsCluster, *args: str) -> subprocess.CompletedProcess[str]:
    config = cluster.state_dir / "gpuslurm-throttle.toml"
    config.write_text(f'[paths]\nstate_dir = "{cluster.state_dir}/gs-admission"\n[scheduler]\nkind = "pbs"\n')
    env = dict(cluster.env, GPUSLURM_CONFIG=str(config))
    argv = ["/bin/bash", str(PBS_DIR / "cluster.sh"), "exec", sys.executable, "-m", "gpuslurm",
            "throttle", "auto", "--once", "--backoff", "1s", *args]
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120, check=False)


def _limit(cluster: PbsCluster) -> str:
    """The server's max_run_res.ngpus entries as qmgr lists them (one line each), joined."""
    lines = cluster.run(QMGR, "-c", "list server max_run_res").splitlines()
    return ",".join(line.split(" = ", 1)[1] for line in lines if "max_run_res.ngpus = " in line)


def _state(cluster: PbsCluster, job: str) -> tuple[str, str]:
    doc = json.loads(cluster.run(QSTAT, "-x", "-f", "-F", "json", job))
    (item,) = doc["Jobs"].values()
    return item["job_state"], str(item.get("comment", ""))


def _wait(cluster: PbsCluster, job: str, ok: set[str], timeout: float = 60) -> tuple[str, str]:
    deadline = time.monotonic() + timeout
    while (got := _state(cluster, job))[0] not in ok:
        assert time.monotonic() < deadline, (job, got)
        time.sleep(0.5)
    return got


def test_a_loaded_cluster_keeps_the_heavy_users_next_job_queued_until_the_load_eases(
        pbs_cluster: PbsCluster, second_user: str) -> None:
    cluster = pbs_cluster
    jobs: list[str] = []
    cluster.run(QMGR, "-c", 'set server max_run_res.ngpus = "[g:gpuslurm-site=5]"')  # the site's own
    try:
        heavy = [cluster.qsub(["-l", "select=1:ncpus=1:ngpus=3"], "sleep 600\n") for _ in range(2)]
        # the attacker: every field of the job a user controls holds qmgr syntax
        light = cluster.qsub(["-A", HOSTILE, "-P", "p#q", "-l", "select=1:ncpus=1:ngpus=1"],
                             "sleep 600\n", user=second_user)
        jobs += [*heavy, light]
        for job in jobs:
            _wait(cluster, job, {"R"})
        # 7 of 8 GPUs: above 70 %, 10 % per user (1 GPU) for those above the fair share (4)
        first = _auto(cluster)
        assert first.returncode == 0, first.stderr
        assert f"set max_run_res.ngpus [u:NAME=1] for {cluster.user}" in first.stdout, first.stdout
        assert _limit(cluster) == f"[g:gpuslurm-site=5],[u:{cluster.user}=1]"
        extra = cluster.qsub(["-l", "select=1:ncpus=1:ngpus=1"], "sleep 1\n")  # 1 GPU is free
        jobs.append(extra)
        time.sleep(3)
        state, comment = _state(cluster, extra)
        assert state == "Q" and "limit" in comment and "ngpus" in comment, (state, comment)

        # the load eases: past the back-off the limit is lifted, the site's entry kept, the job runs
        for job in heavy:
            cluster.run(QDEL, "-W", "force", job, check=False)
        for job in heavy:
            _wait(cluster, job, {"F"})
        assert _auto(cluster).returncode == 0  # below every tier: the back-off starts
        time.sleep(1.5)
        eased = _auto(cluster)
        assert eased.returncode == 0 and f"lift the GPU limit for {cluster.user}" in eased.stdout, eased
        assert _limit(cluster) == "[g:gpuslurm-site=5]"
        _wait(cluster, extra, {"R", "E", "F"})
        # the attacker's job fields reached no qmgr command: the cluster is whole
        assert "pbshost" in cluster.run(str(PREFIX / "bin" / "pbsnodes"), "-a")
    finally:
        cluster.run(QMGR, "-c", "unset server max_run_res.ngpus", check=False)
        for job in jobs:
            cluster.run(QDEL, "-W", "force", job, check=False)
        for job in jobs:  # gone before the user is deleted
            try:
                _wait(cluster, job, {"F"})
            except AssertionError:
                pass
