"""``gpuslurm throttle auto`` reads ``squeue --json`` and ``scontrol -o show node`` as root: a job's
user controls its name and comment. Jobs of ``nobody`` with hostile names and comments (quotes,
backslashes, control characters, bytes that are not UTF-8, text that looks like ``Gres=`` or
``gres/gpu=``) in the real slurmctld: the load read from Slurm is still exact and a round runs."""

from __future__ import annotations

import pwd
import subprocess
import sys
import time
from pathlib import Path

import pytest
from tests.helpers.cluster_fixture import SlurmCluster

from gpuslurm.slurm.admission import configured_gpus, gpus_held
from gpuslurm.slurm.squeue import parse_squeue_json

pytestmark = pytest.mark.slurm

NOBODY = pwd.getpwnam("nobody")
HOSTILE = ['x" ,"user_name": "root', "a\\u0000b\\", "tab\there\x01\x1b[31m", "bad\udcff\udcfeutf8",
           "Gres=gpu:h100:99999 gres/gpu=0", "a\nNodeName=evil Gres=gpu:x:500"]


def test_hostile_job_names_and_comments_never_change_the_load(slurm_cluster: SlurmCluster,
                                                              tmp_path: Path) -> None:
    as_nobody = [f"--uid={NOBODY.pw_uid}", f"--gid={NOBODY.pw_gid}", "--chdir=/tmp", "--output=/dev/null"]
    jobs = []
    try:
        for i, text in enumerate(HOSTILE):
            args = [*as_nobody, f"--job-name={text}", f"--comment={text}", "--gres=gpu:1"]
            if i:  # one runs (holds a GPU), the others wait held
                args.append("--hold")
            jobs.append(slurm_cluster.sbatch(args, "sleep 60\n"))
        deadline = time.monotonic() + 60
        while (state := slurm_cluster.state(jobs[0])) != "RUNNING":  # one read: it may start between two
            shown = subprocess.run(["/usr/bin/scontrol", "-o", "show", "job", str(jobs[0])],
                                   env=slurm_cluster.env, capture_output=True, text=True, timeout=30).stdout
            assert time.monotonic() < deadline and state == "PENDING", \
                f"{shown}\n{slurm_cluster.log_tail()}"
            time.sleep(0.5)
        squeue = subprocess.run(["/usr/bin/squeue", "--json"], env=slurm_cluster.env, capture_output=True,
                                timeout=30, check=True).stdout.decode("utf-8", "replace")
        nodes = subprocess.run(["/usr/bin/scontrol", "-o", "show", "node"], env=slurm_cluster.env,
                               capture_output=True, text=True, timeout=30, check=True).stdout
        parsed = [j for j in parse_squeue_json(squeue) if int(j.job_id) in jobs]
        assert len(parsed) == len(HOSTILE) and {j.user for j in parsed} == {NOBODY.pw_name}
        assert gpus_held(parsed) == {NOBODY.pw_name: 1}
        total = configured_gpus(nodes)
        assert total == sum(int(line.split("Gres=gpu:")[1].split(":")[1].split("(")[0])
                            for line in nodes.splitlines() if "Gres=gpu:" in line)
        state = tmp_path / "state"
        result = subprocess.run([sys.executable, "-m", "gpuslurm", "throttle", "auto", "--once", "--dry-run",
                                 "--state-dir", str(state)], env=slurm_cluster.env, capture_output=True,
                                text=True, timeout=120, check=False)
        assert result.returncode == 0, result.stderr
    finally:
        for job in jobs:
            subprocess.run(["/usr/bin/scancel", str(job)], env=slurm_cluster.env, timeout=30, check=False)
