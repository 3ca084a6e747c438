"""``gpuslurm throttle auto`` in a real Slurm with accounting that enforces limits
(AccountingStorageTRES=gres/gpu, AccountingStorageEnforce=limits): under load, the user above
their fair share gets GrpTRES=gres/gpu=1; their next job stays PENDING with reason AssocGrpGRES;
when the load has stayed low for the back-off, the limit is lifted and the job runs."""

from __future__ import annotations

import os
import pwd
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from tests.helpers.cluster_fixture import SlurmCluster, _restart, skip_without_accounting
from tests.helpers.slurm_helpers import make_user

pytestmark = pytest.mark.slurm

SCONTROL = "/usr/bin/scontrol"
SCANCEL = "/usr/bin/scancel"
# The user over the limit: a real user made for the module, not nobody, whose uid (65534) 26.05's
# slurmctld finds no association for ("User 65534 not found": jobs refused as an invalid account).
MEMBER = f"gsadmit{os.getpid() % 100000}"
ENFORCE = "AccountingStorageTRES=gres/gpu\nAccountingStorageEnforce=limits\n"


@pytest.fixture(scope="module")
def enforcing(slurm_cluster: SlurmCluster) -> Iterator[SlurmCluster]:
    """The session cluster restarted with slurmdbd and limits enforced, for this module only."""
    skip_without_accounting()
    member = make_user(MEMBER)
    saved = dict(slurm_cluster.env)
    try:
        base = saved.get("GPUSLURM_CLUSTER_EXTRA_CONF")
        extra = slurm_cluster.state_dir / "admission-extra.conf"
        extra.write_text((Path(base).read_text() if base else "") + ENFORCE)
        slurm_cluster.env["GPUSLURM_CLUSTER_EXTRA_CONF"] = str(extra)
        _restart(slurm_cluster, "--with-slurmdbd")
        try:
            slurm_cluster.sacctmgr("add", "account", "gputeam", "Description=gpu team", "Organization=test")
            slurm_cluster.sacctmgr("add", "user", member.name, "account=gputeam")
            yield slurm_cluster
        finally:
            slurm_cluster.env.clear()
            slurm_cluster.env.update(saved)
            _restart(slurm_cluster,
                     *(["--with-slurmdbd"] if os.environ.get("GPUSLURM_CLUSTER_SLURMDBD") else []))
    finally:
        subprocess.run(["/usr/sbin/userdel", member.name], capture_output=True, timeout=30, check=False)


def _auto(cluster: SlurmCluster, state: Path) -> str:
    argv = [sys.executable, "-m", "gpuslurm", "throttle", "auto", "--once", "--backoff", "2s",
            "--state-dir", str(state)]
    result = subprocess.run(argv, env=cluster.env, capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode == 0, result.stderr
    return result.stdout


def _job(cluster: SlurmCluster, jobid: int) -> str:
    return subprocess.run([SCONTROL, "-o", "show", "job", str(jobid)], env=cluster.env, capture_output=True,
                          text=True, timeout=30, check=True).stdout


def _wait_for(cluster: SlurmCluster, jobid: int, text: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while text not in _job(cluster, jobid):
        assert time.monotonic() < deadline, f"{text} not in {_job(cluster, jobid)}\n{cluster.log_tail()}"
        time.sleep(0.5)


def test_a_user_over_the_limit_pends_and_runs_after_the_load_falls(enforcing: SlurmCluster,
                                                                   tmp_path: Path) -> None:
    cluster = enforcing
    member = pwd.getpwnam(MEMBER)
    as_member = [f"--uid={member.pw_uid}", f"--gid={member.pw_gid}", "--chdir=/tmp", "--output=/dev/null"]
    state = tmp_path / "state"
    big = cluster.sbatch([*as_member, "--gres=gpu:6"], "sleep 300\n")
    mine = cluster.sbatch(["--gres=gpu:1"], "sleep 300\n")  # root: exempt, and holds 1
    waiting = None
    try:
        _wait_for(cluster, big, "JobState=RUNNING")
        _wait_for(cluster, mine, "JobState=RUNNING")
        out = _auto(cluster, state)  # 7 of 8 GPUs: above 70 %; the member holds 6, fair share 4
        assert "tighten to tier 10% per user: load 88% of 8 GPUs > 70%" in out, out
        assert f"set GrpTRES=gres/gpu=1 for {MEMBER}" in out, out
        limits = cluster.sacctmgr("-nP", "show", "assoc", "where", f"user={MEMBER}", "format=User,GrpTRES")
        assert f"{MEMBER}|gres/gpu=1" in limits, limits

        waiting = cluster.sbatch([*as_member, "--gres=gpu:1"], "true\n")  # one GPU is free
        _wait_for(cluster, waiting, "Reason=AssocGrpGRES")
        assert "JobState=PENDING" in _job(cluster, waiting)

        subprocess.run([SCANCEL, str(big)], env=cluster.env, timeout=30, check=True)
        _wait_for(cluster, big, "JobState=CANCELLED")
        out = _auto(cluster, state)  # 1 of 8: low, but not yet for the back-off
        assert "lift" not in out, out
        time.sleep(2.5)
        out = _auto(cluster, state)
        assert "ease to no limit: load 12% of 8 GPUs" in out, out
        assert f"lift the GPU limit for {MEMBER}" in out, out
        assert "gres/gpu" not in cluster.sacctmgr("-nP", "show", "assoc", "where", f"user={MEMBER}",
                                                  "format=User,GrpTRES")
        assert cluster.wait(waiting, timeout=60) == "COMPLETED", _job(cluster, waiting)
    finally:
        for job in (big, mine, waiting):
            if job is not None:
                subprocess.run([SCANCEL, str(job)], env=cluster.env, timeout=30, check=False)


def test_a_limit_set_by_the_admin_is_left_alone(enforcing: SlurmCluster, tmp_path: Path) -> None:
    cluster = enforcing
    cluster.sacctmgr("modify", "user", "where", f"name={MEMBER}", "set", "GrpTRES=gres/gpu=6")
    member = pwd.getpwnam(MEMBER)
    as_member = [f"--uid={member.pw_uid}", f"--gid={member.pw_gid}", "--chdir=/tmp", "--output=/dev/null"]
    big = cluster.sbatch([*as_member, "--gres=gpu:6"], "sleep 300\n")
    mine = cluster.sbatch(["--gres=gpu:1"], "sleep 300\n")
    try:
        _wait_for(cluster, big, "JobState=RUNNING")
        _wait_for(cluster, mine, "JobState=RUNNING")
        out = _auto(cluster, tmp_path / "state")  # the policy wants the member at 1; the admin said 6
        assert f"leave {MEMBER} alone: gres/gpu=6 was not set by gpuslurm" in out, out
        limits = cluster.sacctmgr("-nP", "show", "assoc", "where", f"user={MEMBER}", "format=User,GrpTRES")
        assert f"{MEMBER}|gres/gpu=6" in limits, limits
    finally:
        for job in (big, mine):
            subprocess.run([SCANCEL, str(job)], env=cluster.env, timeout=30, check=False)
        cluster.sacctmgr("modify", "user", "where", f"name={MEMBER}", "set", "GrpTRES=gres/gpu=-1")
