"""What the Slurm end-to-end modules share: a root of ours with gpuslurm's config for the hooks,
the hooks named in the test cluster's slurm.conf, the node watched through scontrol, and real
users for plugins/job_submit.lua (made with useradd, deleted after).
"""

from __future__ import annotations

import os
import pwd
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar, NamedTuple

import pytest

from gpuslurm.hw.source import BUILTIN_DIR

if TYPE_CHECKING:
    from tests.helpers.cluster_fixture import SlurmCluster

SCONTROL = "/usr/bin/scontrol"
SCANCEL = "/usr/bin/scancel"
SLURMCTLD = "/usr/sbin/slurmctld"
PLUGIN = Path(__file__).resolve().parents[2] / "plugins" / "job_submit.lua"


def short_hostname() -> str:
    """This host's short name: the test cluster's one node."""
    return subprocess.run(["/bin/hostname", "-s"], capture_output=True, text=True, check=True).stdout.strip()


def wait_for_line(path: Path, timeout: float = 30) -> str:
    """``path``'s text once a job has written it whole (it ends in a newline); TimeoutError if not."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists() and path.read_text().endswith("\n"):
            return path.read_text()
        time.sleep(0.1)
    raise TimeoutError(f"{path} never appeared")


def hooks_root(prefix: str) -> tuple[Path, Path]:
    """A fresh 0755 directory (the task prolog runs as the job's user) with a copy of the dgx-h100
    bundle in it: ``(root, bundle)``."""
    root = Path(tempfile.mkdtemp(prefix=prefix))
    root.chmod(0o755)
    bundle = root / "bundle"
    shutil.copytree(BUILTIN_DIR / "dgx-h100", bundle)
    return root, bundle


def hooks_paths(root: Path, cluster: SlurmCluster) -> str:
    """The config's ``[paths]``: run and state directories under ``root``, the cluster's scontrol
    and its own cgroup.conf (ConstrainDevices=yes: Slurm isolates)."""
    return (f'[paths]\nrun_dir = "{root / "run"}"\nstate_dir = "{root / "state"}"\n'
            f'scontrol = "{SCONTROL}"\n'
            f'slurm_cgroup_conf = "{cluster.conf.parent / "cgroup.conf"}"\n')


def hook_lines(prefix: Path, task_prolog: bool = True) -> str:
    """slurm.conf's lines naming the hooks ``gpuslurm install`` wrote under ``prefix``."""
    lines = f"Prolog={prefix}/gpuslurm-prolog\nEpilog={prefix}/gpuslurm-epilog\n"
    return lines + (f"TaskProlog={prefix}/gpuslurm-task-prolog\n" if task_prolog else "")


def conf_with(original: str, lines: str) -> str:
    """slurm.conf with ``lines`` before its NodeName= line (options after node lines are still
    global, but keep it tidy)."""
    return original.replace("\nNodeName=", f"\n{lines}NodeName=", 1)


class NodeControl:
    """scontrol on the cluster's node, for a class with ``cluster`` and ``node`` attributes."""

    cluster: SlurmCluster
    node: str
    node_timeout: ClassVar[float] = 30

    def scontrol(self, *args: str) -> str:
        return subprocess.run([SCONTROL, *args], env=self.cluster.env, capture_output=True, text=True,
                              check=True, timeout=30).stdout

    def node_field(self, name: str) -> str:
        out = self.scontrol("-o", "show", "node", self.node)
        match = re.search(rf"\b{name}=(.*?)(?= \w+=|$)", out.strip())
        return match.group(1) if match else ""

    def node_detail(self) -> str:
        """What a failure message adds about the node."""
        return self.cluster.log_tail()

    def wait_node(self, pattern: str, timeout: float | None = None) -> str:
        """The node's State once it matches ``pattern``; TimeoutError if it does not in time."""
        deadline = time.monotonic() + (self.node_timeout if timeout is None else timeout)
        state = ""
        while time.monotonic() < deadline:
            state = self.node_field("State")
            if re.search(pattern, state):
                return state
            time.sleep(0.3)
        raise TimeoutError(f"node {self.node} is {state}, not {pattern}\n{self.node_detail()}")

    def restore(self, original_conf: str) -> None:
        """slurm.conf back as it was, applied, and the node resumed and waited for (a failure to
        come back is said on stderr, not raised: the module's tests have their verdicts)."""
        self.cluster.conf.write_text(original_conf)
        subprocess.run([SCONTROL, "reconfigure"], env=self.cluster.env, capture_output=True, timeout=30,
                       check=False)
        subprocess.run([SCONTROL, "update", f"NodeName={self.node}", "State=RESUME"], env=self.cluster.env,
                       capture_output=True, timeout=30, check=False)
        try:
            self.wait_node(r"^IDLE")
        except TimeoutError as exc:
            print(f"node did not come back: {exc}", file=sys.stderr)


CLUSTER_SH = Path(__file__).resolve().parents[2] / "docker-slurm" / "cluster.sh"


def _running(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except OSError:
        return False


MARK_VAR = "GPUSLURM_TEST_CLUSTER"  # cluster.sh starts its daemons with MARK_VAR=<state dir>


def _marked(cluster: SlurmCluster, names: tuple[str, ...]) -> set[int]:
    """This cluster's running processes named one of ``names``, whatever the pid files say: each
    whose environment has cluster.sh's mark (a handover child inherits it)."""
    mark = f"{MARK_VAR}={cluster.state_dir}".encode()
    found = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if (entry / "comm").read_text().strip() not in names:
                continue
            if mark in (entry / "environ").read_bytes().split(b"\0") and _running(int(entry.name)):
                found.add(int(entry.name))
        except OSError:
            continue
    return found


def _slurmds(cluster: SlurmCluster) -> set[int]:
    """This cluster's slurmd processes (slurmstepd is not named so)."""
    return _marked(cluster, ("slurmd", "slurmd-wlm"))


def restart_slurmd(cluster: SlurmCluster, reconfigure: bool = True) -> None:
    """slurm.conf applied (``scontrol reconfigure``), then slurmd stopped and started again through
    ``cluster.sh up`` (slurmctld and running jobs stay): cgroup.conf is read when slurmd starts.

    From 23.11 ``scontrol reconfigure`` makes slurmd hand over to a new slurmd process, which
    rewrites SlurmdPidFile a moment later: a pid read just after it may be the old one's, and a
    slurmd started while the new one comes up finds its port taken and dies. So every slurmd of
    this cluster (the pid file's, and any process named slurmd with cluster.sh's mark in its
    environment: on 26.05 a handover child that never wrote the pid file held the port) is stopped
    until none has run for a whole second. A node a failed prolog drained
    is resumed first: ``cluster.sh up`` waits for a node that takes jobs."""
    host = short_hostname()
    if reconfigure:
        subprocess.run([SCONTROL, "reconfigure"], env=cluster.env, capture_output=True, timeout=30,
                       check=True)
        _wait_slurmctld_settled(cluster)
    subprocess.run([SCONTROL, "update", f"NodeName={host}", "State=RESUME"], env=cluster.env,
                   capture_output=True, timeout=30, check=False)  # refused unless drained: fine
    pidfile = cluster.state_dir / "run" / "slurmd.pid"
    # A slurmd caught in that handover may log "Shutting down" and never finish (seen on 26.05 with
    # PrologFlags=RunInJob): SIGKILL after 15 s; running steps live on in their slurmstepd.
    started = time.monotonic()
    deadline = started + 60
    quiet_since: float | None = None
    while True:
        text = pidfile.read_text().strip() if pidfile.exists() else ""
        pids = _slurmds(cluster) | ({int(text)} if text.isdigit() and _running(int(text)) else set())
        if pids:
            quiet_since = None
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGTERM if time.monotonic() < started + 15 else signal.SIGKILL)
                except ProcessLookupError:
                    pass
        elif quiet_since is None:
            quiet_since = time.monotonic()
        elif time.monotonic() - quiet_since >= 1:
            break
        if time.monotonic() > deadline:
            raise TimeoutError(f"slurmd ({sorted(pids)}) does not stop\n{cluster.log_tail()}")
        time.sleep(0.1)
    # cluster.sh asks `kill -0`, which a zombie slurmd not yet reaped passes: it would find slurmd
    # "already up" and start none (seen on 26.05 with RunInJob)
    pidfile.unlink(missing_ok=True)
    env = {k: v for k, v in cluster.env.items() if k != "SLURM_CONF"}
    up = subprocess.run(["/bin/bash", str(CLUSTER_SH), "up"], env=env, capture_output=True, text=True,
                        timeout=150, check=False)
    assert up.returncode == 0, f"cluster.sh up failed:\n{up.stderr}\n{cluster.log_tail()}"
    assert _slurmds(cluster), f"cluster.sh up started no slurmd\n{up.stderr}\n{cluster.log_tail()}"
    subprocess.run([SCONTROL, "update", f"NodeName={host}", "State=RESUME"], env=cluster.env,
                   capture_output=True, timeout=30, check=False)  # after a failed run drained it


def _wait_slurmctld_settled(cluster: SlurmCluster) -> None:
    """After ``scontrol reconfigure``: from 23.11 slurmctld hands over to a new slurmctld process
    too ("Relinquishing control to new slurmctld process"), and between the old one's exit and the
    new one's pid file ``cluster.sh up`` sees no slurmctld but its port taken (seen on 24.11 in CI).
    Wait until one slurmctld of this cluster (found by cluster.sh's mark, not by the pid file: the
    old process may remove the file after the new one wrote it, seen once on 24.11) has run alone
    for a whole second and answers; then the pid file names it, as ``cluster.sh up`` asks it."""
    pidfile = cluster.state_dir / "run" / "slurmctld.pid"
    deadline = time.monotonic() + 60
    steady: tuple[int, float] | None = None
    while True:
        pids = _marked(cluster, ("slurmctld", "slurmctld-wlm"))
        if len(pids) == 1:
            (pid,) = pids
            if steady is None or steady[0] != pid:
                steady = (pid, time.monotonic())
            elif time.monotonic() - steady[1] >= 1:
                ping = subprocess.run([SCONTROL, "ping"], env=cluster.env, capture_output=True,
                                      text=True, timeout=30, check=False)
                if ping.returncode == 0 and "UP" in ping.stdout:
                    named = pidfile.read_text().strip() if pidfile.exists() else ""
                    if named != str(pid):
                        pidfile.write_text(f"{pid}\n")
                    return
        else:
            steady = None
        if time.monotonic() > deadline:
            raise TimeoutError(f"slurmctld ({sorted(pids)}) does not settle after reconfigure\n"
                               f"{cluster.log_tail()}")
        time.sleep(0.1)


class SlurmRelease(NamedTuple):
    """What the tests must know about the Slurm release the cluster runs; the one place that knows
    how releases differ (add a field here, never a version check in a test)."""

    version: tuple[int, int]
    # job_submit.lua's slurm.log_user reaches the user on `scontrol update` (job_modify has an
    # err_msg from 23.02; 22.05 drops the message, so a refusal shows only as an error)
    shows_update_message: bool
    # how `scontrol show job` spells a GPU gres in TresPer*= ("gres:gpu:1"; "gres/gpu:1" from 23.11)
    gres_prefix: str


@cache
def slurm_release(slurmctld: str = SLURMCTLD) -> SlurmRelease:
    """The release of the slurmctld the test cluster runs (``slurmctld -V``: "slurm-wlm 22.05.8")."""
    out = subprocess.run([slurmctld, "-V"], capture_output=True, text=True, timeout=30, check=True).stdout
    match = re.search(r"(\d+)\.(\d+)\.\d+", out)
    if not match:
        raise RuntimeError(f"{slurmctld} -V: no version in {out!r}")
    version = (int(match.group(1)), int(match.group(2)))
    return SlurmRelease(version, shows_update_message=version >= (23, 2),
                        gres_prefix="gres:" if version < (23, 11) else "gres/")


class User(NamedTuple):
    name: str
    uid: int
    gid: int


def make_user(name: str) -> User:
    """A new real user ``name`` (never one that exists: the test would delete it)."""
    try:
        pwd.getpwnam(name)
    except KeyError:
        pass
    else:
        pytest.fail(f"user {name} already exists; not touching it")
    subprocess.run(["/usr/sbin/useradd", "--no-create-home", "--shell", "/usr/sbin/nologin",
                    "--user-group", name], check=True, timeout=30)
    pw = pwd.getpwnam(name)
    return User(name, pw.pw_uid, pw.pw_gid)


@contextmanager
def job_submit_plugin(cluster: SlurmCluster, tag: str) -> Iterator[tuple[User, User]]:
    """plugins/job_submit.lua loaded by slurmctld (JobSubmitPlugins=lua, ``scontrol
    reconfigure``) and two new users ``<tag>a`` and ``<tag>b``; afterwards their jobs cancelled,
    slurm.conf restored and applied, the plugin and its throttle file removed, the users deleted."""
    if not os.access("/usr/sbin/useradd", os.X_OK):
        pytest.skip("useradd is missing")
    etc = cluster.conf.parent
    original = cluster.conf.read_text()
    users: list[User] = []
    try:
        users += [make_user(f"{tag}a"), make_user(f"{tag}b")]
        (etc / "job_submit.lua").write_text(PLUGIN.read_text())
        cluster.conf.write_text(conf_with(original, "JobSubmitPlugins=lua\n"))
        subprocess.run([SCONTROL, "reconfigure"], env=cluster.env, check=True, timeout=60,
                       capture_output=True)
        yield users[0], users[1]
    finally:
        for user in users:
            subprocess.run([SCANCEL, "-u", user.name], env=cluster.env, capture_output=True,
                           timeout=30, check=False)
        cluster.conf.write_text(original)
        subprocess.run([SCONTROL, "reconfigure"], env=cluster.env, capture_output=True,
                       timeout=60, check=False)
        for name in ("job_submit.lua", "gpuslurm-throttle"):
            (etc / name).unlink(missing_ok=True)
        for user in users:
            subprocess.run(["/usr/sbin/userdel", user.name], capture_output=True, timeout=30, check=False)
