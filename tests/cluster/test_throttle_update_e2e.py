"""`scontrol update` by a throttled user, inside the real slurmctld with plugins/job_submit.lua:
the owner of a held job cannot lift the throttle by updating it after submission (issue 18), in
every mode; root's update of the same job passes, so each refusal is the plugin's, not Slurm's.

What differs between Slurm releases (whether the plugin's message reaches ``scontrol``, how
``show job`` spells a gres) comes from ``slurm_helpers.slurm_release``: on 22.05 Slurm drops the
message of a refused update, so the refusal is checked by its effect (scontrol fails, the job is
unchanged) and by slurmctld's log.
"""

from __future__ import annotations

import os
import re
import subprocess
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest
from tests.helpers.slurm_helpers import SCONTROL, SlurmRelease, User, job_submit_plugin, slurm_release
from tests.helpers.throttle_helpers import SETTLE_S, Throttled

if TYPE_CHECKING:
    from tests.helpers.cluster_fixture import SlurmCluster

pytestmark = pytest.mark.slurm


class Updates(Throttled):
    release: SlurmRelease

    def update(self, user: User | None, jobid: int, *fields: str) -> subprocess.CompletedProcess[str]:
        """``scontrol update JobId=JOBID FIELDS`` as ``user`` (None: root)."""
        argv = [SCONTROL, "update", f"JobId={jobid}", *fields]
        if user is None:
            return subprocess.run(argv, env=self.cluster.env, capture_output=True, text=True, timeout=60,
                                  check=False)
        return subprocess.run(argv, env=self.cluster.env, capture_output=True, text=True, timeout=60,
                              check=False, cwd="/tmp", user=user.uid, group=user.gid, extra_groups=[])

    def refused_update(self, jobid: int, *fields: str) -> None:
        """The throttled user's update fails and leaves the job as it was; root's same update passes."""
        before = self.job(jobid)
        proc = self.update(self.a, jobid, *fields)
        assert proc.returncode != 0, f"{self.a.name}'s {fields} of job {jobid} passed:\n{self.job(jobid)}"
        assert self.job(jobid) == before, f"{fields}: job {jobid} changed:\n{before}\n{self.job(jobid)}"
        if self.release.shows_update_message:
            assert "gpuslurm:" in proc.stderr, proc.stderr
        assert f"refused an update of job {jobid} of throttled user {self.a.name}" in self.ctld_log()
        root = self.update(None, jobid, *fields)
        assert root.returncode == 0, f"root's update {fields} of job {jobid} failed: {root.stderr}"

    def field(self, jobid: int, name: str) -> str:
        match = re.search(rf"\b{name}=(\S*)", self.job(jobid))
        return match.group(1) if match else ""

    def gpus(self, count: int) -> str:
        """A GPU gres of ``count`` as ``show job`` spells it in this release."""
        return f"{self.release.gres_prefix}gpu:{count}"


@pytest.fixture(scope="module")
def updates(slurm_cluster: SlurmCluster) -> Iterator[Updates]:
    tag = os.getpid() % 100000
    with job_submit_plugin(slurm_cluster, f"gsupd{tag}") as (a, b):
        u = Updates(slurm_cluster, slurm_cluster.conf.parent / "gpuslurm-throttle", a, b)
        u.release = slurm_release()
        yield u


def _throttle(u: Updates, *args: str) -> None:
    u.gpuslurm("add", u.a.name, *args, "--for", "1h", "--reason", "issue 18")
    time.sleep(SETTLE_S)


def test_reject_mode_the_owner_cannot_add_gpus_by_update(updates: Updates) -> None:
    u = updates
    before_throttle = u.accepted(u.a, "--gres=gpu:1")   # a GPU job from before the throttle
    _throttle(u)
    cpu = u.accepted(u.a)
    u.refused_update(cpu, "Gres=gpu:8")
    assert u.field(cpu, "TresPerNode") == u.gpus(8)     # root's update went through
    cpu = u.accepted(u.a)
    u.refused_update(cpu, "TresPerNode=gres:gpu:1")
    cpu = u.accepted(u.a)
    u.refused_update(cpu, "TresPerTask=gres:gpu:1", "NumTasks=1")
    # more of the GPUs the job had before the throttle: refused too
    u.refused_update(before_throttle, "NumNodes=1-1", "NumTasks=2")
    # an update that leaves the GPU count alone passes
    assert u.update(u.a, before_throttle, "TimeLimit=5").returncode == 0
    assert u.update(u.a, u.accepted(u.a), "NumTasks=2").returncode == 0  # no GPUs after it
    u.gpuslurm("remove", u.a.name)


def test_cap_mode_the_owner_cannot_update_past_the_cap(updates: Updates) -> None:
    u = updates
    _throttle(u, "--cap", "1")
    cpu = u.accepted(u.a)
    u.refused_update(cpu, "Gres=gpu:8")
    assert u.field(cpu, "TresPerNode") == u.gpus(8)
    one = u.accepted(u.a, "--gpus-per-task=1", "-n", "1")   # 1 GPU: within the cap
    u.refused_update(one, "NumTasks=8")                      # NumTasks-only: 8 GPUs
    assert u.field(one, "NumTasks") == "8"
    capped = u.accepted(u.a, "--gres=gpu:4")                  # capped to 1 at submission
    assert u.field(capped, "TresPerNode") == u.gpus(1)
    u.refused_update(capped, "Gres=gpu:2")
    # no node maximum: Slurm could spread it over more nodes, one GPU each, so the count is unknown
    open_nodes = u.accepted(u.a)
    u.refused_update(open_nodes, "Gres=gpu:1")
    # within the cap on one node, or not about GPUs: passes
    within = u.accepted(u.a, "-N", "1")
    assert u.update(u.a, within, "Gres=gpu:1").returncode == 0
    assert u.field(within, "TresPerNode") == u.gpus(1)
    assert u.update(u.a, within, "TimeLimit=5").returncode == 0
    u.gpuslurm("remove", u.a.name)


def test_priority_mode_the_owner_cannot_lower_the_nice(updates: Updates) -> None:
    u = updates
    _throttle(u, "--nice", "4321")
    gpu = u.accepted(u.a, "--gres=gpu:1")
    assert u.field(gpu, "Nice") == "4321"
    u.refused_update(gpu, "Nice=0")
    assert u.field(gpu, "Nice") == "0"                       # root may
    gpu = u.accepted(u.a, "--gres=gpu:1")
    u.refused_update(gpu, "Nice=100")
    # GPUs added to a job without the penalty bring the penalty with them
    cpu = u.accepted(u.a)
    assert u.field(cpu, "Nice") == "0"
    assert u.update(u.a, cpu, "Gres=gpu:1").returncode == 0
    assert u.field(cpu, "Nice") == "4321" and u.field(cpu, "TresPerNode") == u.gpus(1)
    # a larger nice, and another user's update, pass
    gpu = u.accepted(u.a, "--gres=gpu:1")
    assert u.update(u.a, gpu, "Nice=5000").returncode == 0
    b_job = u.accepted(u.b, "--gres=gpu:1")
    assert u.update(u.b, b_job, "Nice=0").returncode == 0
    u.gpuslurm("remove", u.a.name)
