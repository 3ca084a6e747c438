"""Real processes in real cgroups shaped like Slurm's, for the monitor's tests."""

from __future__ import annotations

import contextlib
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

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


@contextlib.contextmanager
def in_cgroup(root: Path, relative: str, pid: int) -> Iterator[Path]:
    """Create ``root/relative`` (only the missing parts), move ``pid`` in; undo it all after."""
    made: list[Path] = []
    path = root
    for part in relative.strip("/").split("/"):
        path = path / part
        if not path.exists():
            path.mkdir()
            made.append(path)
    (path / "cgroup.procs").write_text(f"{pid}\n")
    try:
        yield path
    finally:
        # the process must leave (or die) before rmdir; move it back to the root first
        with contextlib.suppress(OSError):
            (root / "cgroup.procs").write_text(f"{pid}\n")
        for p in reversed(made):
            for _ in range(50):
                try:
                    p.rmdir()
                    break
                except OSError:
                    time.sleep(0.05)
