"""A real one-node Slurm cluster for end-to-end tests: the session fixture ``slurm_cluster``.

It runs ``docker-slurm/cluster.sh up`` in a fresh state directory (munged, slurmctld and slurmd
on loopback, the node an emulated DGX H100 with fake ``/dev/nvidiaN``) and ``down`` at the end of
the session, even after failures. Only one such cluster can run per host: the device files and
Slurm's cgroups are global.

Accounting (slurmdbd with a private MariaDB, ``cluster.sh up --with-slurmdbd``) costs a few seconds
and is off by default. A module that needs it asks for ``slurm_accounting_cluster`` (import it
into the module: ``from cluster_fixture import slurm_accounting_cluster``): the session cluster is
restarted with accounting for that module and without it afterwards, in the same state directory.
With ``GPUSLURM_CLUSTER_SLURMDBD=1`` the session cluster has accounting from the start and nothing
is restarted. In such a cluster ``cluster.sacctmgr("add", "account", "team")`` and
``cluster.sacctmgr("add", "user", "nobody", "account=team", "fairshare=5")`` add associations,
which ``sshare -P -a`` then lists; ``sacct`` shows finished jobs.

Slurm release: ``GPUSLURM_SLURM_RELEASE`` (22.05, the host's own Slurm, by default; 24.11 or
26.05: the daemons run from a cached Debian root that tests/helpers/slurm_roots.py makes, and this session
sees that root's clients at /usr/bin/sbatch, /usr/bin/scontrol ... so tests need no change).
``install_hooks`` and ``users_python`` then install with the root's Python, inside the root.

Environment: ``GPUSLURM_BUNDLE`` (default dgx-h100), ``GPUSLURM_BIN`` (the gpuslurm executable),
``GPUSLURM_CLUSTER_EXTRA_CONF`` (extra slurm.conf lines), ``GPUSLURM_KEEP_CLUSTER=1`` keeps the
state directory (configs and logs) after the session.
"""

from __future__ import annotations

import fcntl
import importlib.util
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from tests.helpers import slurm_roots

CLUSTER_SH = Path(__file__).resolve().parents[2] / "docker-slurm" / "cluster.sh"
SBATCH = "/usr/bin/sbatch"
SCONTROL = "/usr/bin/scontrol"
NEEDED = ("/usr/sbin/slurmctld", "/usr/sbin/slurmd", "/usr/sbin/munged", SBATCH, SCONTROL, "/usr/bin/sinfo")
FINAL_STATES = frozenset({
    "COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "PREEMPTED",
    "BOOT_FAIL", "DEADLINE",
})
LOCK_PATH = "/run/lock/gpuslurm-test-cluster.lock"
SACCTMGR = "/usr/bin/sacctmgr"
ACCOUNTING_NEEDS = ("/usr/sbin/slurmdbd", SACCTMGR, "/usr/sbin/mariadbd", "/usr/bin/mariadb-install-db")
_JOB_STATE = re.compile(r"\bJobState=(\S+)")


def cluster_unavailable() -> str | None:
    """Why this machine cannot run the test cluster, or None when it can."""
    if os.geteuid() != 0:
        return "the Slurm test cluster needs root (slurmd, munged, mknod in /dev)"
    try:
        release = slurm_roots.selected()
    except slurm_roots.RootError as exc:
        return str(exc)
    if release is not None:
        ok = (slurm_roots.root_path(release) / ".gpuslurm-root.json").exists() \
            or os.access(slurm_roots.DEBOOTSTRAP, os.X_OK)
        return None if ok else f"Slurm {release.name} needs a root: apt-get install -y debootstrap"
    missing = [path for path in NEEDED if not os.access(path, os.X_OK)]
    if missing:
        return f"{', '.join(missing)} missing: apt-get install -y slurm-wlm munge"
    return None


def accounting_unavailable() -> str | None:
    """Why this machine cannot add slurmdbd and MariaDB to the test cluster, or None.

    In a root, slurmdbd and sacctmgr are the root's (tests/helpers/slurm_roots.py PACKAGES) and the
    MariaDB server the host's, as cluster.sh runs them."""
    active = slurm_roots.active()
    if active is not None:
        missing = [str(active.root) + path for path in ACCOUNTING_NEEDS[:2]
                   if not os.access(str(active.root) + path, os.X_OK)]
        missing += [path for path in ACCOUNTING_NEEDS[2:] if not os.access(path, os.X_OK)]
        if missing:
            return f"{', '.join(missing)} missing: rebuild the root, apt-get install -y mariadb-server"
        return None
    missing = [path for path in ACCOUNTING_NEEDS if not os.access(path, os.X_OK)]
    if missing:
        return f"{', '.join(missing)} missing: apt-get install -y slurmdbd mariadb-server"
    return None


def skip_without_accounting() -> None:
    """Skip the test when the cluster cannot have accounting here; fail instead under
    ``GPUSLURM_REQUIRE_SLURM`` (CI), where such a skip would hide the accounting tests."""
    reason = accounting_unavailable()
    if reason is None:
        return
    if os.environ.get("GPUSLURM_REQUIRE_SLURM"):
        pytest.fail(f"GPUSLURM_REQUIRE_SLURM is set, but {reason}", pytrace=False)
    pytest.skip(reason)


@dataclass
class SlurmCluster:
    """A running cluster: its SLURM_CONF, the environment for Slurm clients, and job helpers."""

    state_dir: Path
    env: dict[str, str] = field(repr=False)

    @property
    def conf(self) -> Path:
        return self.state_dir / "etc" / "slurm.conf"

    @property
    def log_dir(self) -> Path:
        return self.state_dir / "log"

    @property
    def accounting(self) -> bool:
        """Whether slurmdbd keeps this cluster's accounting (``up --with-slurmdbd``)."""
        return (self.state_dir / "etc" / "slurmdbd.conf").exists()

    def sacctmgr(self, *args: str) -> str:
        """``sacctmgr -i ARGS`` (no confirmation prompt); its output, RuntimeError on failure."""
        result = subprocess.run([SACCTMGR, "-i", *args], env=self.env, capture_output=True, text=True,
                                timeout=30, check=False)
        if result.returncode != 0:
            raise RuntimeError(f"sacctmgr {' '.join(args)} failed ({result.returncode}): "
                               f"{result.stderr.strip()} {result.stdout.strip()}")
        return result.stdout

    def sbatch(self, args: Sequence[str], script: str) -> int:
        """Submit ``script`` (a shell script body) with extra sbatch ``args``; the job id.

        Output goes to ``output(jobid)`` unless ``args`` name their own ``--output``.
        """
        jobs = self.state_dir / "jobs"
        jobs.mkdir(exist_ok=True)
        fd, path = tempfile.mkstemp(prefix="job-", suffix=".sh", dir=jobs)
        with os.fdopen(fd, "w") as handle:
            handle.write(script if script.startswith("#!") else "#!/bin/bash\n" + script)
        argv = [SBATCH, "--parsable", f"--output={jobs}/slurm-%j.out", *args, path]
        result = subprocess.run(argv, env=self.env, capture_output=True, text=True, timeout=30,
                                check=False)
        if result.returncode != 0:
            raise RuntimeError(f"sbatch {' '.join(args)} failed ({result.returncode}): "
                               f"{result.stderr.strip()}")
        return int(result.stdout.strip().split(";")[0])

    def state(self, jobid: int) -> str:
        """The job's current JobState (PENDING, RUNNING, COMPLETED, ...).

        squeue's state column first: ``scontrol show job`` puts the job's name and comment in the
        same text, and a test's attacker names a job ``... JobState=RUNNING`` (tests/cluster/
        test_pick_e2e.py), which the regex below would read as the state of a job still pending."""
        listed = subprocess.run(["/usr/bin/squeue", "-h", "--states=all", "-j", str(jobid), "-o", "%T"],
                                env=self.env, capture_output=True, text=True, timeout=30, check=False)
        if listed.returncode == 0 and re.fullmatch(r"[A-Z_]+\n?", listed.stdout):
            return listed.stdout.strip()
        result = subprocess.run([SCONTROL, "-o", "show", "job", str(jobid)], env=self.env,
                                capture_output=True, text=True, timeout=30, check=True)
        match = _JOB_STATE.search(result.stdout)
        if not match:
            raise RuntimeError(f"scontrol show job {jobid}: no JobState in {result.stdout!r}")
        return match.group(1)

    def wait(self, jobid: int, timeout: float = 30) -> str:
        """Wait for the job to end and return its final state; TimeoutError if it does not."""
        deadline = time.monotonic() + timeout
        while True:
            state = self.state(jobid)
            if state in FINAL_STATES:
                return state
            if time.monotonic() > deadline:
                raise TimeoutError(f"job {jobid} still {state} after {timeout}s; logs in {self.log_dir}")
            time.sleep(0.2)

    def output(self, jobid: int) -> str:
        """What the job wrote to its default output file."""
        return (self.state_dir / "jobs" / f"slurm-{jobid}.out").read_text()

    def log_tail(self, lines: int = 20) -> str:
        """The end of the slurmctld and slurmd logs, for failure messages."""
        parts = []
        for name in ("slurmctld", "slurmd"):
            path = self.log_dir / f"{name}.log"
            text = path.read_text(errors="replace").splitlines()[-lines:] if path.exists() else []
            parts.append(f"--- {path}\n" + "\n".join(text))
        return "\n".join(parts)


def install_hooks(root: Path, config: Path, bundle: Path | None, python: str | None = None,
                  c_client: bool = False) -> Path:
    """``gpuslurm install --config CONFIG --replay BUNDLE [--python PYTHON]`` as an admin runs it,
    into a prefix below ``root`` (root's, 0755); that prefix, whose executables slurm.conf then names.

    slurmd passes hooks only SLURM_* variables, so the config and the replayed capture reach them
    only because install wrote both paths into the executables. ``bundle`` None: no ``--replay``,
    the hooks of a live node (NVML, found through the config's ``paths.nvml_library`` if set).
    ``c_client``: ``--c-client`` (needs a C compiler where install runs).
    """
    prefix = root / "libexec" / "gpuslurm"
    etc = root / "slurm-etc"
    etc.mkdir(exist_ok=True)
    # In a root, the hooks run with the root's Python: install runs (and checks it) there.
    active = slurm_roots.active()
    runner = [sys.executable] if active is None else active.inside(slurm_roots.VENV_PYTHON)
    if active is not None:
        python = python or slurm_roots.VENV_PYTHON
    done = subprocess.run([*runner, "-m", "gpuslurm", "install", "--slurm-etc", str(etc),
                           "--prefix", str(prefix), "--config", str(config),
                           *(["--replay", str(bundle)] if bundle is not None else []),
                           *(["--python", python] if python else []),
                           *(["--c-client"] if c_client else [])],
                          capture_output=True, text=True, timeout=120, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"gpuslurm install failed: {done.stderr}")
    return prefix


SYSTEM_PYTHON = "/usr/bin/python3"


def users_python(root: Path) -> str:
    """An interpreter a job's user can run with this checkout's gpuslurm importable: a venv of the
    system Python under ``root`` (root's, 0755) whose site-packages names gpuslurm's source.

    The hooks' code path needs only the standard library, and this session's interpreter may live
    where users cannot reach it (e.g. under /root, 0700): the task prolog runs as the job's user,
    as on a real node, where admins install gpuslurm where users can run it.
    """
    venv = root / "users-venv"
    active = slurm_roots.active()  # jobs run in the root: its Python
    argv = [SYSTEM_PYTHON] if active is None else active.inside(SYSTEM_PYTHON)
    subprocess.run([*argv, "-m", "venv", "--without-pip", str(venv)], check=True,
                   capture_output=True, timeout=120)
    [site] = (venv / "lib").glob("python3*/site-packages")
    src = Path(importlib.util.find_spec("gpuslurm").origin or "").resolve().parents[1]  # type: ignore[union-attr]
    (site / "gpuslurm-checkout.pth").write_text(f"{src}\n")
    return str(venv / "bin" / "python")


@contextmanager
def users_site(prefix: str) -> Iterator[Path]:
    """A fresh 0755 directory in /tmp (an ordinary user can reach it) with ``users_python`` in it
    and a 0755 copy of the dgx-h100 bundle at ``bundle``; removed at the end."""
    from gpuslurm.hw.source import bundle_path

    base = Path(tempfile.mkdtemp(prefix=prefix))
    try:
        base.chmod(0o755)
        users_python(base)
        shutil.copytree(str(bundle_path("dgx-h100")), base / "bundle")
        os.chmod(base / "bundle", 0o755)
        yield base
    finally:
        shutil.rmtree(base)


def _gpuslurm_bin(state_dir: Path) -> str:
    """The gpuslurm executable for cluster.sh: $GPUSLURM_BIN, the installed script, or a wrapper."""
    explicit = os.environ.get("GPUSLURM_BIN")
    if explicit:
        return explicit
    beside = Path(sys.executable).parent / "gpuslurm"
    if os.access(beside, os.X_OK):
        return str(beside)
    # Not installed (PYTHONPATH=src): run the package this test session imports.
    spec = importlib.util.find_spec("gpuslurm")
    if spec is None or spec.origin is None:
        raise RuntimeError("gpuslurm is neither installed nor importable: set GPUSLURM_BIN")
    src = Path(spec.origin).resolve().parents[1]
    wrapper = state_dir / "gpuslurm"
    wrapper.write_text(f'#!/bin/sh\nPYTHONPATH={src} exec {sys.executable} -m gpuslurm "$@"\n')
    wrapper.chmod(0o755)
    return str(wrapper)


def _cluster_sh(command: str, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["/bin/bash", str(CLUSTER_SH), command, *args], env=env, capture_output=True,
                          text=True, timeout=120, check=False)


def _restart(cluster: SlurmCluster, *up_args: str) -> None:
    """``down``, then ``up UP_ARGS`` in the same state directory (the session lock is held)."""
    env = {key: value for key, value in cluster.env.items() if key != "SLURM_CONF"}
    down = _cluster_sh("down", env)
    if down.returncode != 0:
        pytest.fail(f"cluster.sh down failed ({down.returncode}):\n{down.stderr}", pytrace=False)
    up = _cluster_sh("up", env, *up_args)
    if up.returncode != 0:
        pytest.fail(f"cluster.sh up {' '.join(up_args)} failed ({up.returncode}):\n{up.stderr}{up.stdout}",
                    pytrace=False)


@pytest.fixture(scope="session")
def host_cluster_lock() -> Iterator[None]:
    """The host-wide test-cluster lock, taken once per session for every cluster that needs it.

    The Slurm cluster, the PBS cluster (pbs_fixture.py) and any Docker test share the host's fake
    /dev/nvidia* files and cgroups, so a second test session on the same host waits here until the
    first one's clusters are torn down. Within one session both clusters may run together (their
    device files are shared through docker-slurm/fake-devices.sh). One holder per session: a
    second ``flock`` on another open file description of the same file in the same process would
    wait for ever.
    """
    with open(LOCK_PATH, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


@pytest.fixture(scope="session")
def slurm_cluster(host_cluster_lock: None) -> Iterator[SlurmCluster]:
    """A running one-node cluster (see module docstring); stopped at the end of the session."""
    reason = cluster_unavailable()
    if reason:
        if os.environ.get("GPUSLURM_REQUIRE_SLURM"):  # CI: a skip here would hide every e2e test
            pytest.fail(f"GPUSLURM_REQUIRE_SLURM is set, but {reason}", pytrace=False)
        pytest.skip(reason)
    # Not pytest's tmp dirs: those are 0700, and later tests submit jobs as other users.
    state_dir = Path(tempfile.mkdtemp(prefix="gpuslurm-cluster-"))
    state_dir.chmod(0o755)
    env = {key: value for key, value in os.environ.items() if not key.startswith(("SLURM_", "SBATCH_"))}
    env["GPUSLURM_CLUSTER_DIR"] = str(state_dir)
    env["GPUSLURM_BIN"] = _gpuslurm_bin(state_dir)
    try:
        _use_release(env, state_dir)
        cluster = SlurmCluster(state_dir, {**env, "SLURM_CONF": str(state_dir / "etc" / "slurm.conf")})
        accounting = ["--with-slurmdbd"] if os.environ.get("GPUSLURM_CLUSTER_SLURMDBD") else []
        up = _cluster_sh("up", env, *accounting)
        if up.returncode != 0:
            pytest.fail(f"cluster.sh up failed ({up.returncode}):\n{up.stderr}{up.stdout}", pytrace=False)
        yield cluster
    finally:
        down = _cluster_sh("down", env)
        if down.returncode != 0:
            print(f"cluster.sh down failed ({down.returncode}):\n{down.stderr}", file=sys.stderr)
        if os.environ.get("GPUSLURM_KEEP_CLUSTER"):
            print(f"kept the test cluster's state in {state_dir}", file=sys.stderr)
        else:
            shutil.rmtree(state_dir, ignore_errors=True)


def _use_release(env: dict[str, str], state_dir: Path) -> None:
    """With ``GPUSLURM_SLURM_RELEASE`` naming a root: build or reuse it, have cluster.sh run the
    daemons in it, and give this session the root's clients at /usr/bin/<client>."""
    release = slurm_roots.selected()
    if release is None:
        return
    try:
        root = slurm_roots.ensure_root(release)
    except (slurm_roots.RootError, subprocess.SubprocessError, OSError) as exc:
        pytest.fail(f"no root for Slurm {release.name}: {exc}", pytrace=False)
    checkout = CLUSTER_SH.parents[1]
    env["GPUSLURM_SLURM_ROOT"] = str(root)
    env["GPUSLURM_CHECKOUT"] = str(checkout)
    # Jobs run what tests write into them: this checkout and this session's interpreter.
    env["GPUSLURM_ROOT_BINDS"] = ":".join(dict.fromkeys([str(checkout), sys.base_prefix, sys.prefix]))
    env["GPUSLURM_CLUSTER_CGROUP"] = slurm_roots.cgroup_plugin(release)
    if slurm_roots.runs_cgroup_v2():
        try:
            env["GPUSLURM_CLUSTER_PRELOAD"] = str(slurm_roots.preload_library())
        except (slurm_roots.RootError, subprocess.SubprocessError, OSError) as exc:
            pytest.fail(f"no preload library for Slurm's cgroup/v2 plugin: {exc}", pytrace=False)
    active = slurm_roots.ActiveRoot(release, root, state_dir / "run" / "ns.pid")
    slurm_roots.use_clients({**slurm_roots.client_wrappers(root, state_dir / "bin"),
                             **slurm_roots.daemon_wrappers(active, state_dir / "sbin")})
    slurm_roots.activate(active)


@pytest.fixture(scope="module")
def slurm_accounting_cluster(slurm_cluster: SlurmCluster) -> Iterator[SlurmCluster]:
    """The session cluster with slurmdbd for one module (see module docstring)."""
    if slurm_cluster.accounting:
        yield slurm_cluster
        return
    skip_without_accounting()
    _restart(slurm_cluster, "--with-slurmdbd")
    try:
        yield slurm_cluster
    finally:
        _restart(slurm_cluster)
