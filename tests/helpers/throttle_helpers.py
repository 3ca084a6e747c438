"""What the job_submit throttle tests on the real cluster share: the plugin's settle time and a
cluster with a throttle file and two users (``Throttled``)."""

from __future__ import annotations

import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from tests.helpers.slurm_helpers import PLUGIN, SCONTROL, User

if TYPE_CHECKING:
    from tests.helpers.cluster_fixture import SlurmCluster

SBATCH = "/usr/bin/sbatch"
_RELOAD = re.search(r"^local RELOAD_SECONDS = (\d+)", PLUGIN.read_text(), re.M)
# After the file changes, the plugin sees it within its reload interval.
SETTLE_S = (int(_RELOAD.group(1)) if _RELOAD else 3) + 1.0


@dataclass
class Throttled:
    cluster: SlurmCluster
    file: Path
    a: User
    b: User

    def gpuslurm(self, *args: str) -> str:
        proc = subprocess.run([sys.executable, "-m", "gpuslurm", "throttle", *args, "--file", str(self.file)],
                              capture_output=True, text=True, timeout=60, check=False)
        assert proc.returncode == 0, proc.stderr
        return proc.stdout

    def submit(self, user: User, *args: str) -> subprocess.CompletedProcess[str]:
        """sbatch as ``user`` (held, so the node is never the question); the job id is in stdout."""
        argv = [SBATCH, "--parsable", "--hold", "--chdir=/tmp", "--output=/dev/null", *args,
                "--wrap", "true"]
        return subprocess.run(argv, env=self.cluster.env, capture_output=True, text=True, timeout=60,
                              check=False, user=user.uid, group=user.gid, extra_groups=[], cwd="/tmp")

    def accepted(self, user: User, *args: str) -> int:
        proc = self.submit(user, *args)
        assert proc.returncode == 0, f"{user.name} {args}: {proc.stderr}\n{self.ctld_log()}"
        return int(proc.stdout.strip().split(";")[0])

    def refused(self, user: User, *args: str) -> str:
        proc = self.submit(user, *args)
        assert proc.returncode != 0, f"{user.name} {args} was accepted: job {proc.stdout}"
        return proc.stderr

    def job(self, jobid: int) -> str:
        return subprocess.run([SCONTROL, "-o", "show", "job", str(jobid)], env=self.cluster.env,
                              capture_output=True, text=True, timeout=30, check=True).stdout

    def ctld_log(self) -> str:
        path = self.cluster.log_dir / "slurmctld.log"
        return path.read_text(errors="replace") if path.exists() else ""
