"""Real device files and processes for the cgroup tests (root only; no GPU needed).

A device file made with mknod for a major no driver registered opens with ENXIO when the cgroup
lets the open through and EPERM when the cgroup refuses it: the two errors tell allowed from
denied without a GPU.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

from tests.helpers.mps_helpers import PROBE as PROBE  # argv: device paths; "<path> <errno name or OK>" each

import gpuslurm
from gpuslurm.errors import HardwareError
from gpuslurm.isolate import bpf
from gpuslurm.isolate.cgroupfs import cgroup_version

NOBODY = 65534
# Readable by nobody (pyenv's interpreter under /root is not); the package is put on its path.
SYSTEM_PYTHON = "/usr/bin/python3"
SRC = str(Path(gpuslurm.__file__).resolve().parents[1])
# This host's hybrid cgroup2 mount, where BPF device programs attach and hold.
UNIFIED = "/sys/fs/cgroup/unified"


def unavailable(what: str) -> str | None:
    if os.geteuid() != 0:
        return f"{what} needs root (mknod, cgroups)"
    if not os.access(SYSTEM_PYTHON, os.X_OK):
        return f"{SYSTEM_PYTHON} is missing: the tests run processes as nobody with it"
    return None


def v2_unavailable(what: str) -> str | None:
    """Why the cgroup v2 tests cannot run here: no root, no cgroup2 mount at ``UNIFIED``, or a
    kernel that refuses to load a BPF device program."""
    reason = unavailable(what)
    if reason is None and cgroup_version(UNIFIED) != 2:
        return f"no cgroup2 hierarchy at {UNIFIED}"
    if reason is None:
        try:
            os.close(bpf.load_device_program(bpf.deny_program([])))
        except HardwareError as exc:
            return f"bpf(2) is not permitted here: {exc}"
    return reason


def make_gpu_files(minors: range | list[int], major: int = 195) -> Iterator[Path]:
    """A world-reachable temporary directory with ``nvidia<minor>`` character devices."""
    tmp = Path(tempfile.mkdtemp(prefix="gpuslurm-dev-"))
    try:
        tmp.chmod(0o755)
        for minor in minors:
            os.mknod(tmp / f"nvidia{minor}", 0o666 | stat.S_IFCHR, os.makedev(major, minor))
        yield tmp
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def parse_probe(output: str) -> dict[str, str]:
    return {Path(p).name: r for p, r in (line.split() for line in output.splitlines() if line.strip())}


def probe_as_nobody_in(cgroup_procs: str, minors: range = range(8)) -> dict[str, str]:
    """Fake ``nvidia<minor>`` files opened by ``nobody`` from inside the cgroup whose
    ``cgroup.procs`` is given: ``{"nvidia<minor>": "ENXIO" (let through) or "EPERM" (refused)}``."""
    from gpuslurm.runner import run_command

    gpus = make_gpu_files(minors)
    gpu_dir = next(gpus)
    try:
        out = run_command([SYSTEM_PYTHON, "-c", PROBE, *(str(gpu_dir / f"nvidia{m}") for m in minors)],
                          user=NOBODY, group=65534, cgroup_procs=cgroup_procs, timeout=30).stdout
    finally:
        gpus.close()
    return parse_probe(out)


def as_nobody(argv: list[str], **kwargs: object) -> subprocess.Popen[str]:
    env = {"PYTHONPATH": SRC, "PATH": "/usr/bin:/bin"}
    env.update(kwargs.pop("env", {}))  # type: ignore[arg-type]
    return subprocess.Popen(argv, user=NOBODY, group=65534, extra_groups=[], env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd="/", **kwargs)  # type: ignore[call-overload]
