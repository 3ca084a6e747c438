"""Real processes in real cgroups shaped like Slurm's, for the monitor's tests."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from tests.helpers.cgroup_paths import in_cgroup as in_cgroup

V1_ROOT = Path("/sys/fs/cgroup/freezer")
V2_ROOT = Path("/sys/fs/cgroup/unified")


def cgroup_unavailable(root: Path) -> str | None:
    if os.geteuid() != 0:
        return "moving a process into a cgroup needs root"
    if not (root / "cgroup.procs").exists():
        return f"{root} is not a cgroup hierarchy here"
    return None


def sleeper(seconds: int = 120) -> subprocess.Popen[bytes]:
    return subprocess.Popen(["/bin/sleep", str(seconds)])


def stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.kill()
    proc.wait()
