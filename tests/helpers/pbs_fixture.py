"""A real one-node OpenPBS cluster for end-to-end tests: the session fixture ``pbs_cluster``.

It builds OpenPBS from ../shared/vendor (pbs-cluster/build.sh; cached in $PBS_PREFIX, default
/opt/pbs, skipped when the install matches the tarball), runs ``pbs-cluster/cluster.sh up`` in a
fresh state directory and ``down`` at the end of the session, even after failures. It shares the
host-wide lock of cluster_fixture.py with the Slurm cluster. Where no OpenPBS source is beside the
checkout the PBS tests skip, except with ``CI`` or ``GPUSLURM_REQUIRE_PBS=1``, where they fail.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from tests.helpers.cluster_fixture import _gpuslurm_bin

ROOT = Path(__file__).resolve().parents[2]
PBS_DIR = ROOT / "pbs-cluster"
VENDOR = ROOT.parent / "shared" / "vendor"
PREFIX = Path(os.environ.get("PBS_PREFIX", "/opt/pbs"))
STATE_PARENT = "/run"
_JOB_STATE = re.compile(r"^\s*job_state = (\S+)", re.M)


def pbs_unavailable() -> str | None:
    """Why this machine cannot run the PBS test cluster, or None when it can."""
    if os.geteuid() != 0:
        return "the PBS test cluster needs root (namespaces, pbs_mom, mknod in /dev)"
    if not list(VENDOR.glob("openpbs-*.tar.gz")) and not (PREFIX / "sbin" / "pbs_server.bin").exists():
        return f"no OpenPBS source beside the checkout ({VENDOR}/openpbs-*.tar.gz)"
    return None


def _required() -> bool:
    return bool(os.environ.get("GPUSLURM_REQUIRE_PBS") or os.environ.get("CI"))


@dataclass
class PbsCluster:
    """A running PBS cluster: its state directory and helpers that run PBS inside its namespace."""

    state_dir: Path
    env: dict[str, str] = field(repr=False)
    user: str = "gpuspbs1"

    def run(self, *argv: str, check: bool = True) -> str:
        """A command inside the cluster's namespace (PBS_CONF_FILE set); its stdout."""
        result = subprocess.run(["/bin/bash", str(PBS_DIR / "cluster.sh"), "exec", *argv], env=self.env,
                                capture_output=True, text=True, timeout=60, check=False)
        if check and result.returncode != 0:
            raise RuntimeError(f"{' '.join(argv)} failed ({result.returncode}): {result.stderr.strip()}")
        return result.stdout

    def qsub(self, args: Sequence[str], script: str, user: str | None = None) -> str:
        """Submit ``script`` (a shell script body) as ``user`` (default the test user); the job id."""
        jobs = self.state_dir / "jobs"
        fd, path = tempfile.mkstemp(prefix="job-", suffix=".sh", dir=jobs)
        with os.fdopen(fd, "w") as handle:
            handle.write(script if script.startswith("#!") else "#!/bin/bash\n" + script)
        os.chmod(path, 0o755)
        argv = ["/bin/bash", str(PBS_DIR / "cluster.sh"), "submit", "--user", user or self.user, *args, path]
        result = subprocess.run(argv, env=self.env, capture_output=True, text=True, timeout=60, check=False)
        if result.returncode != 0:
            raise RuntimeError(f"qsub {' '.join(args)} failed ({result.returncode}): {result.stderr.strip()}")
        return result.stdout.strip()

    def job(self, jobid: str) -> str:
        """``qstat -xf JOBID``: the job's full status, history included."""
        return self.run(str(PREFIX / "bin" / "qstat"), "-xf", jobid)

    def wait(self, jobid: str, timeout: float = 60) -> str:
        """Wait for the job to finish (state F); its full status. TimeoutError if it does not."""
        deadline = time.monotonic() + timeout
        while True:
            status = self.job(jobid)
            match = _JOB_STATE.search(status)
            if match and match.group(1) == "F":
                return status
            if time.monotonic() > deadline:
                raise TimeoutError(f"job {jobid} not finished after {timeout}s:\n{status}\n"
                                   f"logs in {self.state_dir}/home/*_logs")
            time.sleep(0.5)


def cluster_sh(command: str, env: dict[str, str], *args: str,
               timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["/bin/bash", str(PBS_DIR / "cluster.sh"), command, *args], env=env,
                          capture_output=True, text=True, timeout=timeout, check=False)


def _build(env: dict[str, str]) -> None:
    start = time.monotonic()
    result = subprocess.run(["/bin/bash", str(PBS_DIR / "build.sh")], env=env, capture_output=True, text=True,
                            timeout=3600, check=False)
    if result.returncode != 0:
        pytest.fail(f"pbs-cluster/build.sh failed ({result.returncode}):\n{result.stdout[-3000:]}"
                    f"{result.stderr[-3000:]}", pytrace=False)
    print(f"OpenPBS build or cache check: {time.monotonic() - start:.0f}s", file=sys.stderr)


@pytest.fixture(scope="session")
def pbs_installed() -> Path:
    """OpenPBS built (or the cached build reused) in PREFIX; skips or fails as the docstring says."""
    reason = pbs_unavailable()
    if reason:
        if _required():  # CI: a skip here would hide every PBS test
            pytest.fail(f"GPUSLURM_REQUIRE_PBS or CI is set, but {reason}", pytrace=False)
        pytest.skip(reason)
    _build(dict(os.environ))
    return PREFIX


@pytest.fixture(scope="session")
def pbs_cluster(host_cluster_lock: None, pbs_installed: Path) -> Iterator[PbsCluster]:
    """A running one-node PBS cluster (see module docstring); stopped at the end of the session."""
    # Not under /tmp: pbs_mom refuses a PBS_HOME below a world-writable directory.
    state_dir = Path(tempfile.mkdtemp(prefix="gpuslurm-pbs-", dir=STATE_PARENT))
    state_dir.chmod(0o755)
    env = {key: value for key, value in os.environ.items() if not key.startswith("PBS_CONF")}
    env["GPUSLURM_PBS_DIR"] = str(state_dir)
    env["GPUSLURM_BIN"] = _gpuslurm_bin(state_dir)
    env["PBS_CONF_FILE"] = str(state_dir / "pbs.conf")
    try:
        up = cluster_sh("up", env)
        if up.returncode != 0:
            pytest.fail(f"pbs-cluster/cluster.sh up failed ({up.returncode}):\n{up.stderr}{up.stdout}",
                        pytrace=False)
        yield PbsCluster(state_dir, env)
    finally:
        down = cluster_sh("down", env)
        if down.returncode != 0:
            print(f"pbs-cluster/cluster.sh down failed ({down.returncode}):\n{down.stderr}", file=sys.stderr)
