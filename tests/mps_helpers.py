"""Helpers the per-job MPS tests share, on Slurm (tests/cluster/test_mps_e2e.py) and on PBS
(tests/pbs/test_pbs_mps_e2e.py): the stand-in MPS control program, its call log, the daemon's
processes, and a probe of which GPU device files a process in a cgroup can open.

The fake GPUs are mknod character devices with no driver behind them: an open the devices cgroup
lets through fails with ENXIO, one it refuses with EPERM.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

FAKE = Path(__file__).resolve().parent / "fakes" / "nvidia-cuda-mps-control"
SYSTEM_PYTHON = "/usr/bin/python3"  # any user can run it (the venv's interpreter under /root not)
# argv: device paths; prints "<path> <errno name or OK>" per device.
PROBE = """
import errno, sys
for path in sys.argv[1:]:
    try:
        open(path, "rb").close()
        print(path, "OK")
    except OSError as exc:
        print(path, errno.errorcode.get(exc.errno, exc.errno))
"""


def fake_control(root: Path) -> tuple[Path, Path]:
    """Write ``root/bin/nvidia-cuda-mps-control``, the stand-in logging every call to
    ``root/mps-calls.jsonl`` (writable by the jobs' users); (the program, the log)."""
    calls = root / "mps-calls.jsonl"
    calls.touch()
    calls.chmod(0o666)
    control = root / "bin" / "nvidia-cuda-mps-control"
    control.parent.mkdir(mode=0o755, exist_ok=True)
    control.write_text(f'#!/bin/sh\nGPUSLURM_FAKE_MPS_LOG={calls} exec {FAKE} "$@"\n')
    control.chmod(0o755)
    return control, calls


def records(calls: Path, event: str) -> list[dict[str, Any]]:
    """The stand-in's logged calls of one kind (``start``, ``daemon``, ``command``, ``client``)."""
    return [r for r in map(json.loads, calls.read_text().splitlines()) if r["event"] == event]


def live_with_pipe_under(prefix: str) -> list[int]:
    """Live processes whose initial environment names an MPS pipe directory under ``prefix``."""
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            env = Path(f"/proc/{name}/environ").read_bytes().split(b"\0")
            state = Path(f"/proc/{name}/status").read_text()
        except OSError:
            continue
        if "\nState:\tZ" not in state and any(
                e.startswith(f"CUDA_MPS_PIPE_DIRECTORY={prefix}".encode()) for e in env):
            found.append(int(name))
    return found


def devices_cgroup(pid: int) -> str:
    """The v1 devices cgroup of ``pid`` (``/gpuslurm/job_12``), from /proc/PID/cgroup."""
    lines = Path(f"/proc/{pid}/cgroup").read_text().splitlines()
    return next(line.split(":", 2)[2] for line in lines if line.split(":")[1] == "devices")


def probe_devices(files: list[str], uid: int, gid: int, cgroup_procs: str) -> dict[str, str]:
    """Which of ``files`` a process of ``uid`` in the cgroup of ``cgroup_procs`` can open:
    path → ``OK`` or the errno's name (ENXIO: allowed, EPERM: refused by the devices cgroup)."""
    from gpuslurm.runner import run_command

    out = run_command([SYSTEM_PYTHON, "-c", PROBE, *files], user=uid, group=gid, cgroup_procs=cgroup_procs,
                      timeout=30).stdout
    return dict(line.split() for line in out.splitlines() if line.strip())
