"""Helpers the per-job MPS tests share, on Slurm (tests/cluster/test_mps_e2e.py) and on PBS
(tests/pbs_cluster/test_pbs_mps_e2e.py): the stand-in MPS control program, its call log, the daemon's
processes, and a probe of which GPU device files a process in a cgroup can open; for the daemon's
own tests (tests/isolate) the fixture ``mps`` (a run directory and call log), a replayed hook site
and its job environment.

The fake GPUs are mknod character devices with no driver behind them: an open the devices cgroup
lets through fails with ENXIO, one it refuses with EPERM.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import signal
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from gpuslurm.hooks.log import HookLog
from gpuslurm.hw.source import BUILTIN_DIR, load_node
from gpuslurm.isolate.mps import MpsRequest, start_mps, stop_mps

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


NOBODY = 65534


NOGROUP = 65534


JOB = "8641"  # not 1234: other tests' jobs have cgroups that every task prolog looks for


@dataclass
class Mps:
    root: Path
    calls: Path

    @property
    def run_dir(self) -> str:
        return str(self.root / "run")

    def control(self, name: str = "nvidia-cuda-mps-control", **knobs: str) -> str:
        """A wrapper that runs the stand-in with its log file (and test knobs) set."""
        path = self.root / name
        env = "".join(f"{k}={v} " for k, v in {"GPUSLURM_FAKE_MPS_LOG": self.calls, **knobs}.items())
        path.write_text(f'#!/bin/sh\n{env}exec {FAKE} "$@"\n')
        path.chmod(0o755)
        return str(path)

    def records(self, event: str | None = None) -> list[dict[str, Any]]:
        lines = self.calls.read_text().splitlines() if self.calls.exists() else []
        return [r for r in map(json.loads, lines) if event is None or r["event"] == event]

    def start(self, job: str = "42", uuids: tuple[str, ...] = ("GPU-a", "GPU-b"), pct: int = 50,
              pinned: int = 0, control: str | None = None, timeout: float = 5.0) -> Any:
        return start_mps(job, NOBODY, NOGROUP, uuids, MpsRequest("comment", pct), run_dir=self.run_dir,
                         mps_control=control or self.control(), pinned_memory_limit_mib=pinned,
                         timeout=timeout)

    def stop(self, job: str = "42", control: str | None = None, grace: float = 2.0) -> Any:
        return stop_mps(job, run_dir=self.run_dir, mps_control=control or self.control(), timeout=5.0,
                        grace=grace)


def live(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/status") as fh:
            return "\nState:\tZ" not in fh.read()  # our daemons are reparented to a pid 1 that may not reap
    except OSError:
        return False


@pytest.fixture
def mps() -> Iterator[Mps]:
    root = Path(tempfile.mkdtemp(prefix="gpuslurm-mps-"))
    root.chmod(0o755)  # nobody reaches the pipe directory through it
    calls = root / "calls.jsonl"
    calls.touch(mode=0o666)
    calls.chmod(0o666)
    try:
        yield Mps(root, calls)
    finally:
        for pid in live_with_pipe_under(str(root)):  # a failed test must not leave daemons behind
            os.kill(pid, signal.SIGKILL)
        subprocess.run(["rm", "-rf", "--one-file-system", str(root)], check=False)  # deep trees too


@dataclass
class Site:
    env: dict[str, str]  # the hook environment of job JOB, without its MPS request
    uuids: list[str]  # the bundle's GPUs in index order
    scontrol_log: Path


def hook_site(mps: Mps, control: str | None = None) -> Site:
    """A replayed DGX H100 and a config whose MPS control is the stand-in; scontrol records calls."""
    bundle = mps.root / "bundle"
    shutil.copytree(BUILTIN_DIR / "dgx-h100", bundle)
    scontrol, scontrol_log = mps.root / "scontrol", mps.root / "scontrol.log"
    scontrol.write_text(f'#!/bin/sh\necho "$@" >> {scontrol_log}\n')
    scontrol.chmod(0o755)
    config = mps.root / "gpuslurm.toml"
    config.write_text(
        "[paths]\n"
        f'run_dir = "{mps.run_dir}"\n'
        f'state_dir = "{mps.root / "state"}"\n'
        f'scontrol = "{scontrol}"\n'
        f'mps_control = "{control or mps.control()}"\n'
        '[mps]\ntriggers = ["gres", "comment"]\nactive_thread_percentage = 40\n'
        "[hooks]\ncommand_timeout_s = 5\n[epilog]\nkill_grace_s = 0.5\n"
        '[cgroup]\ndevices = "never"\n')  # device isolation is tested on its own
    env = {"GPUSLURM_CONFIG": str(config), "GPUSLURM_CAPTURE": str(bundle), "SLURM_JOB_ID": JOB,
           "SLURM_JOB_UID": str(NOBODY), "SLURM_JOB_USER": "nobody", "SLURM_JOB_GID": str(NOGROUP),
           "SLURMD_NODENAME": "node07", "SLURM_JOB_GPUS": "2,3"}
    return Site(env, [g.uuid for g in load_node(str(bundle)).gpus], scontrol_log)


def job_env(site: Site, **extra: str) -> dict[str, str]:
    return {**site.env, **extra}


def quiet(hook: str) -> HookLog:
    return HookLog(hook, stream=io.StringIO(), use_syslog=False)
