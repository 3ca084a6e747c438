"""The epilog's leftovers on Slurm 26.05's SLUID layout: a process in the job's own ``s<SLUID>``
cgroup is its leftover; one in another SLUID's is another job's, never killed (real processes in
real cgroup2 directories)."""

from __future__ import annotations

import os
import subprocess
import time

import pytest
from tests.helpers.watch_helpers import V2_ROOT, cgroup_unavailable, in_cgroup

from gpuslurm.hooks.leftovers import plan_kills
from gpuslurm.hw.model.health import GpuProcess
from gpuslurm.slurm.cgroup_paths import parse_cgroup

SLUID, OTHER = "s6Z5M8CB6N7P00", "sB3XM8CSC8S200"
SCOPE = "system.slice/gpuslurmtest_slurmstepd.scope"
GPU = "GPU-x"

_WHY = cgroup_unavailable(V2_ROOT)
pytestmark = pytest.mark.skipif(_WHY is not None, reason=str(_WHY))


def _orphan() -> int:
    """nobody's sleep, no child of this test (the epilog spares its own children)."""
    out = subprocess.run(["/bin/sh", "-c", "/bin/sleep 120 >/dev/null 2>&1 & echo $!"], user=65534,
                         group=65534, extra_groups=[], cwd="/", capture_output=True, text=True, check=True,
                         timeout=30)
    return int(out.stdout)


def _kill(pid: int) -> None:
    try:
        os.kill(pid, 9)
    except ProcessLookupError:
        pass


def test_the_jobs_sluid_directory_is_the_job_and_another_sluid_is_not() -> None:
    mine, theirs = _orphan(), _orphan()
    try:
        with in_cgroup(V2_ROOT, f"{SCOPE}/{SLUID}/step_0/user/task_0", mine), \
                in_cgroup(V2_ROOT, f"{SCOPE}/{OTHER}/step_0/user/task_0", theirs):
            listed = [(GPU, GpuProcess(mine, "nobody")), (GPU, GpuProcess(theirs, "nobody"))]
            now = time.clock_gettime(time.CLOCK_BOOTTIME)
            # the GPU is this job's alone (no other holder known): the other SLUID's process is
            # still not killed, it is in another job's cgroup
            targets, skipped = plan_kills(listed, "42", 65534, {GPU: []}, (), now, job_sluid=SLUID,
                                          job_of_cgroup=parse_cgroup)
            assert [t.pid for t in targets] == [mine]
            assert skipped[(GPU, theirs)] == ("other", f"it is in job {OTHER}'s cgroup")
            # the job's SLUID unknown (no SLURM_JOB_SLUID, no map): no SLUID process is killed
            targets, skipped = plan_kills(listed, "42", 65534, {GPU: []}, (), now, job_of_cgroup=parse_cgroup)
            assert targets == [] and skipped[(GPU, mine)][0] == "other"
    finally:
        _kill(mine)
        _kill(theirs)
