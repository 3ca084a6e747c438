"""The three hooks doing cgroup v1 isolation on this host, without Slurm: the prolog makes the
cgroup, a task prolog running as nobody moves its task in, the epilog removes it."""

from __future__ import annotations

import io
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from tests.helpers.cgroup_helpers import (
    NOBODY,
    PROBE,
    SYSTEM_PYTHON,
    as_nobody,
    make_gpu_files,
    parse_probe,
    unavailable,
)

from gpuslurm.errors import EXIT_NOT_ISOLATED
from gpuslurm.hooks.log import HookLog
from gpuslurm.hw.source import BUILTIN_DIR
from gpuslurm.isolate.cgroup_v1 import v1_job_dir
from gpuslurm.isolate.cgroupfs import cgroup_version
from gpuslurm.slurm.hooks import run_epilog, run_prolog

ROOT = "/sys/fs/cgroup"
_REASON = unavailable("hook isolation tests") or (
    None if cgroup_version(ROOT) == 1 else "no cgroup v1 devices hierarchy")
pytestmark = pytest.mark.skipif(_REASON is not None, reason=str(_REASON))
TASK_PROLOG = "import sys; from gpuslurm.slurm.hooks import run_task_prolog; " \
              "import os; sys.exit(run_task_prolog(os.environ, sys.stdout))"


@pytest.fixture
def site() -> Iterator[Path]:
    root = Path(os.path.realpath(__import__("tempfile").mkdtemp(prefix="gpuslurm-iso-")))
    root.chmod(0o755)  # the task prolog runs as nobody and reads the config and bundle
    shutil.copytree(BUILTIN_DIR / "dgx-h100", root / "bundle")
    (root / "cgroup.conf").write_text("CgroupPlugin=cgroup/v1\nConstrainDevices=no\n")
    (root / "gpuslurm.toml").write_text(
        f'[paths]\nrun_dir = "{root / "run"}"\nstate_dir = "{root / "state"}"\n'
        f'slurm_cgroup_conf = "{root / "cgroup.conf"}"\n[health.leftover_processes]\naction = "off"\n')
    yield root
    shutil.rmtree(root, ignore_errors=True)


def _env(site: Path, job_id: str, gpus: str | None) -> dict[str, str]:
    env = {"GPUSLURM_CONFIG": str(site / "gpuslurm.toml"), "GPUSLURM_CAPTURE": str(site / "bundle"),
           "SLURM_JOB_ID": job_id, "SLURM_JOB_UID": str(NOBODY), "SLURM_JOB_USER": "nobody"}
    if gpus is not None:
        env["SLURM_JOB_GPUS"] = gpus
    return env


def _quiet(hook: str) -> HookLog:
    return HookLog(hook, stream=io.StringIO(), use_syslog=False)


def _task(env: dict[str, str], paths: list[str]) -> tuple[int, dict[str, str], str]:
    """A task of nobody, its task prolog run as nobody, then the task opening ``paths``."""
    task = as_nobody([SYSTEM_PYTHON, "-c", "import sys; sys.stdin.readline(); exec(sys.argv.pop(1))",
                      PROBE, *paths], stdin=subprocess.PIPE)
    try:
        prolog = as_nobody([SYSTEM_PYTHON, "-c", TASK_PROLOG], env={**env, "SLURM_TASK_PID": str(task.pid)})
        _, err = prolog.communicate(timeout=60)
        out, _ = task.communicate("go\n", timeout=30)
    finally:
        task.kill()
    return prolog.returncode, parse_probe(out), err


def test_prolog_task_prolog_epilog_isolate_a_two_gpu_job(site: Path) -> None:
    job = str(910_000_000 + os.getpid() % 1_000_000)
    env = _env(site, job, "2,5")
    log = _quiet("prolog")
    assert run_prolog(env, log) == 0, log.lines
    assert any("devices cgroup" in line and "6 device(s) denied" in line for line in log.lines), log.lines
    for gpu_dir in make_gpu_files(range(8)):
        rc, seen, err = _task(env, [str(gpu_dir / f"nvidia{m}") for m in range(8)])
        assert rc == 0, err
        assert seen == {f"nvidia{m}": "ENXIO" if m in (2, 5) else "EPERM" for m in range(8)}
    assert run_epilog(env, _quiet("epilog")) == 0
    assert not os.path.exists(v1_job_dir(ROOT, job))


def test_job_without_gpus_is_denied_every_gpu_and_slurm_constraining_turns_it_off(site: Path) -> None:
    job = str(920_000_000 + os.getpid() % 1_000_000)
    env = _env(site, job, None)
    try:
        assert run_prolog(env, _quiet("prolog")) == 0
        for gpu_dir in make_gpu_files(range(8)):
            rc, seen, err = _task(env, [str(gpu_dir / f"nvidia{m}") for m in range(8)])
            assert rc == 0, err
            assert set(seen.values()) == {"EPERM"}
    finally:
        assert run_epilog(env, _quiet("epilog")) == 0
    (site / "cgroup.conf").write_text("ConstrainDevices=yes\n")  # auto: Slurm does it, we do not
    assert run_prolog(env, _quiet("prolog")) == 0
    assert not os.path.exists(v1_job_dir(ROOT, job))


def test_a_task_that_cannot_join_is_refused(site: Path) -> None:
    job = str(930_000_000 + os.getpid() % 1_000_000)
    env = _env(site, job, "0")
    assert run_prolog(env, _quiet("prolog")) == 0
    try:
        os.chown(f"{v1_job_dir(ROOT, job)}/cgroup.procs", 0, -1)  # as if the prolog gave it to another uid
        # The job's own config cannot steer the task prolog away from the standard root.
        evil = '[paths]\ncgroup_root = "/nonexistent"\n[cgroup]\ndevices = "never"\n'
        (site / "evil.toml").write_text(evil)
        rc, _, err = _task({**env, "GPUSLURM_CONFIG": str(site / "evil.toml")}, [])
        assert rc == EXIT_NOT_ISOLATED
        assert "refusing to start the task" in err
    finally:
        assert run_epilog(env, _quiet("epilog")) == 0


def test_prolog_fails_closed_when_isolation_cannot_be_set_up(site: Path) -> None:
    env = _env(site, "940000001", "0")
    (site / "gpuslurm.toml").write_text(
        (site / "gpuslurm.toml").read_text().replace("[paths]\n", f'[paths]\ncgroup_root = "{site}"\n'))
    log = _quiet("prolog")
    assert run_prolog(env, log) == 3
    assert "neither a cgroup v1 devices hierarchy nor a cgroup2 mount" in log.lines[-1]
    assert not (site / "run" / "jobs" / "940000001.json").exists()  # no map for a job that must not start
