"""plugins/job_submit.lua inside the real slurmctld: throttled users' GPU jobs are refused, capped
or niced; everyone else, and non-GPU jobs, pass; broken or missing files fail open.

The module installs the plugin beside the session cluster's slurm.conf, adds JobSubmitPlugins=lua
and runs ``scontrol reconfigure`` (which loads it); two real users are created with useradd and
submit through their own uid. Everything is undone afterwards: slurm.conf restored and
reconfigured, the plugin and throttle file removed, the users' jobs cancelled, the users deleted.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from tests.helpers.slurm_helpers import job_submit_plugin, slurm_release
from tests.helpers.throttle_helpers import SBATCH, SETTLE_S, Throttled

if TYPE_CHECKING:
    from tests.helpers.cluster_fixture import SlurmCluster

pytestmark = pytest.mark.slurm


@pytest.fixture(scope="module")
def throttled(slurm_cluster: SlurmCluster) -> Iterator[Throttled]:
    tag = os.getpid() % 100000
    with job_submit_plugin(slurm_cluster, f"gsthr{tag}") as (a, b):
        yield Throttled(slurm_cluster, slurm_cluster.conf.parent / "gpuslurm-throttle", a, b)


def test_throttled_users_gpu_jobs_are_refused_with_the_message(throttled: Throttled) -> None:
    t, a, b = throttled, throttled.a, throttled.b
    t.gpuslurm("add", a.name, "--for", "1h", "--reason", "rogue process on GPU-e2e",
               "--contact", "hpc-help@example.org")
    time.sleep(SETTLE_S)
    err = t.refused(a, "--gres=gpu:1")
    until = re.search(r"until (\d{4}-\d\d-\d\d \d\d:\d\d)", err)
    assert until, err
    assert a.name in err and "rogue process on GPU-e2e" in err and "hpc-help@example.org" in err
    for args in (["--gpus=1"], ["--gpus-per-node=1"], ["--gpus-per-task=1", "-n", "1"],
                 ["--gres=gpu:h100:2"]):
        assert "refused" in t.refused(a, *args), args
    t.accepted(a)  # no GPUs: passes
    t.accepted(b, "--gres=gpu:1")
    t.accepted(b, "--gpus=2")
    assert f"refused a GPU job of throttled user {a.name}" in t.ctld_log()


def test_after_expiry_the_user_submits_again(throttled: Throttled) -> None:
    t, a = throttled, throttled.a
    t.gpuslurm("add", a.name, "--for", f"{int(SETTLE_S) + 4}s")
    time.sleep(SETTLE_S)
    t.refused(a, "--gres=gpu:1")
    time.sleep(5)
    t.accepted(a, "--gres=gpu:1")
    assert "no user is throttled" in t.gpuslurm("list")


def test_junk_lines_and_a_missing_file_fail_open(throttled: Throttled) -> None:
    t, a, b = throttled, throttled.a, throttled.b
    t.file.write_text("complete nonsense\n\x01\x02 binary junk\t\t\nanother\tbad\tline\n")
    time.sleep(SETTLE_S)
    t.accepted(a, "--gres=gpu:1")
    t.accepted(b, "--gpus=1")
    assert re.search(r"gpuslurm: throttle file .*gpuslurm-throttle: skipped 3 junk line", t.ctld_log())
    # junk beside a valid line: the line still counts
    t.gpuslurm("add", a.name, "--for", "1h")
    with t.file.open("a") as fh:
        fh.write("junk after the valid line\n")
    time.sleep(SETTLE_S)
    t.refused(a, "--gres=gpu:1")
    t.accepted(b, "--gres=gpu:1")
    t.file.unlink()
    time.sleep(SETTLE_S)
    t.accepted(a, "--gres=gpu:1")
    assert re.search(r"gpuslurm: throttle file .* not readable", t.ctld_log())


def test_cap_reduces_the_gpus_and_priority_adds_nice(throttled: Throttled) -> None:
    t, a = throttled, throttled.a
    t.gpuslurm("add", a.name, "--cap", "1", "--for", "1h")
    time.sleep(SETTLE_S)
    proc = t.submit(a, "--gres=gpu:4")
    assert proc.returncode == 0, proc.stderr
    assert "reduced to 1 GPU" in proc.stderr
    gpu1 = re.escape(f"{slurm_release().gres_prefix}gpu:1")  # gres/gpu:1 from 23.11
    job = t.job(int(proc.stdout.strip()))
    assert re.search(rf"\bTresPerNode={gpu1}\b", job), job
    job = t.job(t.accepted(a, "--gpus=3"))
    assert re.search(rf"\bTresPerJob={gpu1}\b", job), job
    # 1 GPU per node and 2 tasks with no --nodes: Slurm would spread the tasks over nodes, each
    # with a GPU; the job is held to the one node its cap was judged on
    proc = t.submit(a, "--gres=gpu:1", "-n", "2")
    assert proc.returncode == 0 and "at most 1 node(s)" in proc.stderr, proc.stderr
    job = t.job(int(proc.stdout.strip()))
    assert re.search(r"\bNumNodes=1(-1)?\b", job) and "internal error" not in t.ctld_log(), job
    t.gpuslurm("add", a.name, "--nice", "4321", "--for", "1h")
    time.sleep(SETTLE_S)
    assert re.search(r"\bNice=4321\b", t.job(t.accepted(a, "--gres=gpu:1")))
    assert re.search(r"\bNice=0\b", t.job(t.accepted(a)))  # no GPUs, no penalty
    t.gpuslurm("remove", a.name)


# Every spelling of a GPU request we know of; which ones slurmctld itself takes is recorded by the
# test (an unthrottled user submits each), and each one it takes must be refused for a throttled user.
SPELLINGS = (
    ["--gres=gpu:1"], ["--gres=gpu"], ["--gres=GPU:1"], ["--gres=gpu:h100:1"], ["--gres=gpu:H100:1"],
    ["--gres=gpu:h100:1:foo"], ["--gres=gres:gpu:1"], ["--gres=gres/gpu:1"], ["--gres=gpu=1"],
    ["--gres=gpu:1,mps:10"], ["--gpus=1"], ["--gpus=h100:1"], ["--gpus=gpu:h100:1"],
    ["--gpus-per-node=h100:1"], ["--gpus-per-task=1", "-n", "2"],
    ["--gpus-per-socket=1", "--sockets-per-node=1"], ["--gpus-per-socket=1"],
)


def test_every_gpu_spelling_slurm_takes_is_refused_and_caps_are_per_job(throttled: Throttled) -> None:
    t, a, b = throttled, throttled.a, throttled.b
    taken = []
    for args in SPELLINGS:
        proc = t.submit(b, *args)
        print(f"slurmctld {'took' if proc.returncode == 0 else 'refused'} {' '.join(args)}: "
              f"{proc.stderr.strip()[:120]}")
        if proc.returncode == 0:
            taken.append(args)
    assert ["--gres=gpu:1"] in taken and len(taken) >= 8, taken
    t.gpuslurm("add", a.name, "--for", "1h")
    time.sleep(SETTLE_S)
    for args in taken:
        assert "refused" in t.refused(a, *args), args
    # cap per job; an unset socket or task count (NO_VAL) is never a count
    t.gpuslurm("add", a.name, "--cap", "4", "--for", "1h")
    time.sleep(SETTLE_S)
    for args in (["--gpus-per-socket=1", "--sockets-per-node=2"], ["--gpus-per-socket=1"]):
        if args in taken or args[:1] == ["--gpus-per-socket=1"]:
            proc = t.submit(a, *args)
            assert "4294967294" not in proc.stderr and "65534" not in proc.stderr, proc.stderr
            if args in taken:
                assert proc.returncode == 0, (args, proc.stderr)
    t.gpuslurm("add", a.name, "--cap", "1", "--for", "1h")
    time.sleep(SETTLE_S)
    err = t.refused(a, "--gpus-per-socket=1", "--sockets-per-node=2")
    assert "2 socket(s) with GPUs exceed the cap of 1" in err and "4294967294" not in err, err
    t.gpuslurm("remove", a.name)


def _capped_batch_job(t: Throttled, args: list[str], script: str) -> str:
    """A batch job of user a, capped at 1 GPU, with ``args`` lowered to it: its output, once it
    has completed."""
    a = t.a
    outdir = Path(tempfile.mkdtemp(prefix="gpuslurm-capenv-"))
    try:
        outdir.chmod(0o755)
        os.chown(outdir, a.uid, a.gid)
        proc = subprocess.run([SBATCH, "--parsable", "--chdir=/tmp", f"--output={outdir}/%j.out", *args,
                               "--wrap", script],
                              env=t.cluster.env, capture_output=True, text=True, timeout=60, check=False,
                              user=a.uid, group=a.gid, extra_groups=[], cwd="/tmp")
        assert proc.returncode == 0 and "reduced to 1 GPU" in proc.stderr, proc.stderr
        job = int(proc.stdout.strip().split(";")[0])
        state = t.cluster.wait(job, timeout=90)
        out = (outdir / f"{job}.out").read_text()
        assert state == "COMPLETED" and "srun ran" in out, (state, out)
        return out
    finally:
        shutil.rmtree(outdir, ignore_errors=True)


def test_a_capped_gpus_jobs_bare_srun_asks_for_what_the_job_has(throttled: Throttled) -> None:
    """sbatch writes SLURM_GPUS=3 into the job's environment before the cap lowers --gpus=3 to 1;
    the plugin rewrites it, so the job's bare srun asks for 1 (before: "Step requested gres=gpu:3
    is more than the job's"). srun itself, which keeps the request it sent, is refused."""
    t, a = throttled, throttled.a
    t.gpuslurm("add", a.name, "--cap", "1", "--for", "1h")
    time.sleep(SETTLE_S)
    try:
        out = _capped_batch_job(t, ["--gpus=3"],
                                'echo "SLURM_GPUS=$SLURM_GPUS"; srun true && echo "srun ran"')
        assert "SLURM_GPUS=1\n" in out, out
        srun = subprocess.run(["/usr/bin/srun", "--gpus=3", "true"], env=t.cluster.env, capture_output=True,
                              text=True, timeout=60, check=False, user=a.uid, group=a.gid, extra_groups=[],
                              cwd="/tmp")
        assert srun.returncode != 0 and "srun and salloc requests are not lowered" in srun.stderr, srun.stderr
    finally:
        t.gpuslurm("remove", a.name)


def test_a_capped_gpus_per_task_jobs_bare_srun_asks_for_what_the_job_has(throttled: Throttled) -> None:
    """The same for --gpus-per-task=3 lowered to 1: sbatch writes SLURM_GPUS_PER_TASK=3 (22.05) or,
    on releases that fold it into --tres-per-task, SLURM_TRES_PER_TASK=gres/gpu=3 (24.11, 26.05;
    before the fix their bare srun failed: "Invalid generic resource (gres) specification"); the
    plugin rewrites either, and the job's bare srun runs."""
    t = throttled
    t.gpuslurm("add", t.a.name, "--cap", "1", "--for", "1h")
    time.sleep(SETTLE_S)
    try:
        out = _capped_batch_job(t, ["-n1", "--gpus-per-task=3"],
                                'echo "PER_TASK=$SLURM_GPUS_PER_TASK TRES=${SLURM_TRES_PER_TASK-unset}"; '
                                'srun true && echo "srun ran"')
        line = next(x for x in out.splitlines() if x.startswith("PER_TASK="))
        per_task, tres = line.removeprefix("PER_TASK=").split(" TRES=", 1)
        # 22.05 writes SLURM_GPUS_PER_TASK; 24.11 and 26.05 write SLURM_TRES_PER_TASK instead
        assert (per_task, tres) in {("1", "unset"), ("", "gres/gpu=1")}, out
    finally:
        t.gpuslurm("remove", t.a.name)
