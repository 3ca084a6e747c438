"""An idle job is warned N times, then cancelled by the monitor through the real scancel (issue 4 §3).

A real job holds 2 GPUs of the test cluster and runs nothing on them; the monitor (a real
process, 1 s cycles, the squeue fallback since no prolog maps exist here) flags both GPUs idle
after the shortened window, warns twice through a sendmail stand-in, and on the next interval
runs ``scancel``: slurmctld ends the job as CANCELLED. The job's user (root: the fixture submits
as root) is mailed the warnings too.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from tests.helpers.cluster_fixture import SlurmCluster

pytestmark = pytest.mark.slurm

SCANCEL = "/usr/bin/scancel"
WARNINGS = 2


def _actions(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_an_idle_job_is_cancelled_after_its_warnings(slurm_cluster: SlurmCluster) -> None:
    root = slurm_cluster.state_dir / f"act-scancel-{os.getpid()}"
    root.mkdir()
    mail = root / "mail.log"
    sendmail = root / "sendmail"
    sendmail.write_text(f'#!/bin/sh\necho "ARGS $*" >> {mail}\ncat >> {mail}\necho "--END--" >> {mail}\n')
    sendmail.chmod(0o755)
    jobs: list[int] = []
    try:
        idle_job = slurm_cluster.sbatch(["--gres=gpu:2", "--time=5"], "exec sleep 300")
        jobs.append(idle_job)
        deadline = time.monotonic() + 30
        while slurm_cluster.state(idle_job) != "RUNNING":
            assert time.monotonic() < deadline, f"job {idle_job} never started\n{slurm_cluster.log_tail()}"
            time.sleep(0.2)
        scenario = root / "scenario.json"
        scenario.write_text(json.dumps({"procs": []}))  # every GPU at 0 %, nothing on them
        state = root / "state"
        config = root / "gpuslurm.toml"
        config.write_text(
            f'[paths]\nrun_dir = "{root / "run"}"\nstate_dir = "{state}"\n'
            f'violations_dir = "{root / "violations"}"\nsendmail = "{sendmail}"\nscancel = "{SCANCEL}"\n'
            f'[monitor]\nnode_name = "{socket.gethostname().split(".")[0]}"\nsqueue_interval_s = 1\n'
            f'[detect.idle]\nwindow_s = 2\ngrace_s = 0\nmin_samples = 2\nmin_coverage = 0.5\n'
            f'[act]\ndry_run = false\nsyslog = ""\nmail_to = ["hpc@example.org"]\n'
            f'[act.idle]\nscancel = true\nalert_user = true\nwarnings = {WARNINGS}\nwarning_interval_s = 1\n')
        env = {**slurm_cluster.env, "GPUSLURM_CONFIG": str(config), "GPUSLURM_SCENARIO": str(scenario),
               "GPUSLURM_CAPTURE": os.environ.get("GPUSLURM_BUNDLE", "dgx-h100")}
        monitor = subprocess.Popen([sys.executable, "-m", "gpuslurm", "monitor", "--interval", "1", "--json",
                                    "--db", str(state / "monitor.db")],
                                   env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        cycles = 0
        try:
            assert monitor.stdout is not None
            for _line in monitor.stdout:
                cycles += 1
                if any(r["action"] == "scancel" for r in _actions(state / "actions.jsonl")) or cycles >= 20:
                    break
        finally:
            monitor.send_signal(signal.SIGTERM)
            _, err = monitor.communicate(timeout=30)
        assert monitor.returncode == 0, err

        done = [(r["action"], r["event"], r["violation"]["job_id"]) for r in _actions(state / "actions.jsonl")
                if r["action"] in ("warn", "scancel")]
        assert done == [("warn", "1/2", str(idle_job)), ("warn", "2/2", str(idle_job)),
                        ("scancel", f"after {WARNINGS} warning(s)", str(idle_job))], f"{done}\n{err}"
        assert slurm_cluster.wait(idle_job, timeout=30) == "CANCELLED"
        scancel = next(r for r in _actions(state / "actions.jsonl") if r["action"] == "scancel")
        assert scancel["outcome"].startswith(f"cancelled job {idle_job}"), scancel
        text = mail.read_text()
        assert text.count("--END--") == WARNINGS + 1, text  # two warnings and the notice
        assert "warning 1/2" in text and "warning 2/2" in text and "was cancelled" in text
        assert "To: hpc@example.org, root\n" in text  # the job's user (root here) is told too
    finally:
        for job in jobs:
            subprocess.run([SCANCEL, str(job)], env=slurm_cluster.env, capture_output=True, timeout=30,
                           check=False)
