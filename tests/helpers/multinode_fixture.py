"""A real multi-node Slurm cluster in namespaces: the session fixture ``multinode_cluster``
(tests/multinode/conftest.py imports it).

``docker-slurm/multinode.sh up`` in a fresh state directory: one slurmctld in a namespace of its
own (192.0.2.1) and three slurmd nodes, each in its own network, UTS and mount namespaces (its
address on 192.0.2.0/24, its hostname, its /dev with its bundle's fake GPU device files, its own
gpuslurm hooks replaying its bundle: dgx-h100, l40s-4x, a100-mig); ``down`` at the end, even after
failures. docs/multinode.md says how it is made.

The suite runs only with ``GPUSLURM_MULTINODE=1``, which CI sets for a session of its own after the
main run (.ci/run). Where it runs, a host that cannot make the namespaces skips it with the reason,
or fails under ``GPUSLURM_REQUIRE_SLURM`` (as in CI).
It takes the host-wide test-cluster lock (tests/helpers/cluster_fixture.py) like the other clusters.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from tests.helpers import slurm_roots
from tests.helpers.cluster_fixture import FINAL_STATES, _gpuslurm_bin, users_python

from gpuslurm.hw.source import bundle_path, load_node

MULTINODE_SH = Path(__file__).resolve().parents[2] / "docker-slurm" / "multinode.sh"
UNSHARE = "/usr/bin/unshare"
NEEDED = ("/usr/sbin/slurmctld", "/usr/sbin/slurmd", "/usr/sbin/munged", "/usr/bin/sbatch",
          "/usr/sbin/ip", "/usr/bin/nsenter", UNSHARE)
NODES = ("mnode1", "mnode2", "mnode3")
PROMETHEUS_URL = "http://192.0.2.1:9090"  # multinode.sh monitors: in the controller's namespace
PROM_QUERY = """import json, sys, urllib.parse, urllib.request
url = sys.argv[1] + "/api/v1/query?" + urllib.parse.urlencode({"query": sys.argv[2]})
with urllib.request.urlopen(url, timeout=10) as resp:
    print(json.dumps(json.load(resp)["data"]["result"]))
"""
BUNDLES = ("dgx-h100", "l40s-4x", "a100-mig")
_FIELD = r"\b{}=(.*?)(?= \w+=|$)"


def multinode_unavailable() -> str | None:
    """Why this machine cannot run the multi-node cluster, or None when it can."""
    if os.geteuid() != 0:
        return "the multi-node Slurm cluster needs root (namespaces, slurmd, mknod)"
    missing = [path for path in NEEDED if not os.access(path, os.X_OK)]
    if missing:
        return f"{', '.join(missing)} missing: apt-get install -y slurm-wlm munge iproute2 util-linux"
    probe = subprocess.run([UNSHARE, "--net", "--uts", "--mount", "--", "/bin/true"],
                           capture_output=True, text=True, timeout=30, check=False)
    if probe.returncode != 0:
        return f"this host cannot make network, UTS and mount namespaces: {probe.stderr.strip()}"
    return None


@dataclass
class MultiNodeCluster:
    """A running multi-node cluster: Slurm's clients run in the controller's namespaces."""

    state_dir: Path
    env: dict[str, str] = field(repr=False)
    release: str = slurm_roots.HOST_RELEASE

    @property
    def cgroup_v2(self) -> bool:
        """Whether Slurm runs its cgroup/v2 plugin (a root: each node's own cgroup2 tree), not v1."""
        return self.release != slurm_roots.HOST_RELEASE

    def node_cgroup(self, node: str) -> Path:
        """The node's own cgroup in the host's cgroup2 tree (a root only): its slurmd's root."""
        return Path((self.state_dir / "run" / f"cgroup-{node}").read_text().strip())

    def job_cgroups(self, node: str, jobid: int) -> list[Path]:
        """The job's cgroups on ``node``, as the host sees them: ``slurm_<node>/uid_*/job_<id>`` in
        each v1 hierarchy; on v2 every job directory under the node's stepd scope (``job_<id>``, or
        26.05's ``s<SLUID>``, which names no job id: the tests look when no other job is there)."""
        if not self.cgroup_v2:
            return list(Path("/sys/fs/cgroup").glob(f"*/slurm_{node}/uid_*/job_{jobid}"))
        scope = self.node_cgroup(node) / "system.slice" / f"{node}_slurmstepd.scope"
        return [path for path in scope.glob("*") if path.is_dir()
                and (path.name == f"job_{jobid}" or re.fullmatch(r"s[0-9A-Z]+", path.name))]

    @property
    def ctl_exec(self) -> str:
        return str(self.state_dir / "run" / "ctl-exec")

    def node_dir(self, node: str) -> Path:
        return self.state_dir / "nodes" / node

    def job_map(self, node: str, jobid: int) -> Path:
        return self.node_dir(node) / "run" / "jobs" / f"{jobid}.json"

    def summary(self, node: str, jobid: int) -> Path:
        return self.node_dir(node) / "state" / "jobs" / f"{jobid}-summary.json"

    def bundle(self, node: str) -> Path:
        return self.node_dir(node) / "bundle"

    def client(self, *argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        """A Slurm client (``sbatch``, ``scontrol``...) in the controller's namespaces."""
        done = subprocess.run([self.ctl_exec, *argv], env=self.env, capture_output=True, text=True,
                              timeout=60, check=False)
        if check and done.returncode != 0:
            raise RuntimeError(f"{' '.join(argv)} failed ({done.returncode}): {done.stderr.strip()}")
        return done

    def in_node(self, node: str, *argv: str) -> subprocess.CompletedProcess[str]:
        """``argv`` in the node's namespaces (its /dev, hostname, address)."""
        return subprocess.run(["/bin/bash", str(MULTINODE_SH), "node", node, *argv], env=self.env,
                              capture_output=True, text=True, timeout=60, check=False)

    def monitors(self, command: str = "monitors") -> None:
        """Each node's monitor and exporter and one Prometheus (``monitors``), or none of them
        (``monitors-down``): docs/multinode.md."""
        done = subprocess.run(["/bin/bash", str(MULTINODE_SH), command], env=self.env, capture_output=True,
                              text=True, timeout=180, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"multinode.sh {command} failed ({done.returncode}): {done.stderr.strip()}")

    def prom_query(self, query: str) -> list[dict[str, Any]]:
        """An instant PromQL query to the cluster's Prometheus, from the controller's namespace
        (the only one on the bridge besides the nodes'); its result list."""
        done = self.client(self.users_python, "-c", PROM_QUERY, PROMETHEUS_URL, query)
        result: list[dict[str, Any]] = json.loads(done.stdout)
        return result

    @property
    def violations_dir(self) -> Path:
        """The one directory every node's monitor writes its violations to (a site's NFS)."""
        return self.state_dir / "violations"

    @property
    def users_python(self) -> str:
        """The interpreter the hooks run, which any user can run, with gpuslurm importable."""
        return self.env["GPUSLURM_MULTINODE_PYTHON"]

    def sbatch(self, args: Sequence[str], script: str, uid: int | None = None) -> int:
        """Submit ``script`` (a shell script body); the job id. ``uid``: as that user (its own
        output directory, which ``output`` reads), through setpriv in the controller's namespaces."""
        jobs = self.state_dir / "jobs"
        fd, path = tempfile.mkstemp(prefix="job-", suffix=".sh", dir=jobs)
        with os.fdopen(fd, "w") as handle:
            handle.write("#!/bin/bash\n" + script)
        os.chmod(path, 0o755)
        as_user: list[str] = []
        if uid is not None:
            outdir = jobs / str(uid)
            outdir.mkdir(exist_ok=True)
            os.chown(outdir, uid, uid)
            as_user = ["/usr/bin/setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups"]
        out = self.client(*as_user, "/usr/bin/sbatch", "--parsable",
                          f"--output={jobs}/{uid if uid is not None else '.'}/slurm-%j.out", *args, path)
        return int(out.stdout.strip().split(";")[0])

    def job_field(self, jobid: int, name: str) -> str:
        out = self.client("/usr/bin/scontrol", "-o", "show", "job", str(jobid)).stdout
        match = re.search(_FIELD.format(name), out.strip())
        return match.group(1) if match else ""

    def wait(self, jobid: int, timeout: float = 90) -> str:
        """The job's final state; TimeoutError if it does not end in time."""
        deadline = time.monotonic() + timeout
        while True:
            state = self.job_field(jobid, "JobState")
            if state in FINAL_STATES:
                return state
            if time.monotonic() > deadline:
                raise TimeoutError(f"job {jobid} still {state} after {timeout}s\n{self.log_tail()}")
            time.sleep(0.3)

    def node_field(self, node: str, name: str) -> str:
        out = self.client("/usr/bin/scontrol", "-o", "show", "node", node).stdout
        match = re.search(_FIELD.format(name), out.strip())
        return match.group(1) if match else ""

    def wait_node(self, node: str, pattern: str, timeout: float = 60) -> str:
        deadline = time.monotonic() + timeout
        state = ""
        while time.monotonic() < deadline:
            state = self.node_field(node, "State")
            if re.search(pattern, state):
                return state
            time.sleep(0.3)
        raise TimeoutError(f"node {node} is {state}, not {pattern}\n{self.log_tail()}")

    def resume(self, node: str) -> None:
        self.client("/usr/bin/scontrol", "update", f"NodeName={node}", "State=RESUME", check=False)
        self.wait_node(node, r"^IDLE")

    def output(self, jobid: int, uid: int | None = None) -> str:
        jobs = self.state_dir / "jobs"
        return ((jobs if uid is None else jobs / str(uid)) / f"slurm-{jobid}.out").read_text()

    def uuids(self, node: str) -> list[str]:
        return [gpu.uuid for gpu in load_node(str(self.bundle(node))).gpus]

    def log_tail(self, lines: int = 15) -> str:
        paths = [self.state_dir / "log" / "slurmctld.log",
                 *(self.node_dir(node) / "log" / "slurmd.log" for node in NODES)]
        parts = []
        for path in paths:
            text = path.read_text(errors="replace").splitlines()[-lines:] if path.exists() else []
            parts.append(f"--- {path}\n" + "\n".join(text))
        return "\n".join(parts)


MARK_VAR = "GPUSLURM_TEST_CLUSTER"  # multinode.sh starts every daemon and holder with MARK_VAR=<state dir>


def namespaces(state_dir: Path) -> set[str]:
    """The namespaces the cluster's holders keep (``net:[4026...]`` ...), read while it runs."""
    found = set()
    for pidfile in (state_dir / "run").glob("*.pid"):
        text = pidfile.read_text().strip()
        for kind in ("net", "uts", "mnt"):
            try:
                found.add(os.readlink(f"/proc/{text}/ns/{kind}"))
            except OSError:
                continue
    return found - {os.readlink(f"/proc/self/ns/{kind}") for kind in ("net", "uts", "mnt")}


def leftovers(state_dir: Path, held: set[str]) -> list[str]:
    """What ``down`` left of the cluster: processes with its mark or in its namespaces (the veths
    and the bridge live only there), its nodes' cgroups, a link of its names on the host."""
    mark = f"{MARK_VAR}={state_dir}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if mark in (entry / "environ").read_bytes().split(b"\0"):
                found.append(f"process {entry.name} ({(entry / 'comm').read_text().strip()}) with the mark")
            for kind in ("net", "uts", "mnt"):
                if os.readlink(entry / "ns" / kind) in held:
                    found.append(f"process {entry.name} in the cluster's {kind} namespace")
        except OSError:
            continue
    found += [f"cgroup {path}" for path in Path("/sys/fs/cgroup").glob("*/slurm_mnode[0-9]")]
    found += [f"cgroup {path}" for path in Path("/sys/fs/cgroup/unified").glob("gpuslurm-mn-mnode[0-9]-*")]
    links = subprocess.run(["/usr/sbin/ip", "-o", "link"], capture_output=True, text=True, timeout=30,
                           check=False).stdout
    found += [f"host link {name}" for name in re.findall(r"^\d+: ((?:veth-mnode|mnbr)[^:@]*)", links, re.M)]
    return found


def _multinode_sh(command: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["/bin/bash", str(MULTINODE_SH), command], env=env, capture_output=True,
                          text=True, timeout=180, check=False)


@pytest.fixture(scope="session")
def multinode_cluster(request: pytest.FixtureRequest) -> Iterator[MultiNodeCluster]:
    """A running three-node cluster (see module docstring); stopped at the end of the session."""
    if not os.environ.get("GPUSLURM_MULTINODE"):
        pytest.skip("the multi-node suite runs only with GPUSLURM_MULTINODE=1 (.ci/run sets it)")
    reason = multinode_unavailable()
    if reason:
        if os.environ.get("GPUSLURM_REQUIRE_SLURM"):
            pytest.fail(f"GPUSLURM_REQUIRE_SLURM is set, but {reason}", pytrace=False)
        pytest.skip(reason)
    # Only now: a skipped suite does not wait for another session's clusters.
    request.getfixturevalue("host_cluster_lock")
    # Not pytest's tmp dirs: 0700, and jobs' steps read their nodes' directories.
    state_dir = Path(tempfile.mkdtemp(prefix="gpuslurm-multinode-"))
    state_dir.chmod(0o755)
    env = {key: value for key, value in os.environ.items() if not key.startswith(("SLURM_", "SBATCH_"))}
    env["GPUSLURM_MULTINODE_DIR"] = str(state_dir)
    # directories, not names: the script need not find the Python that has gpuslurm
    env["GPUSLURM_MULTINODE_BUNDLES"] = " ".join(str(bundle_path(name)) for name in BUNDLES)
    env["GPUSLURM_BIN"] = _gpuslurm_bin(state_dir)
    release = _use_release(env)
    if release is None:
        # the task prolog runs as the job's user, who cannot reach this session's interpreter
        env["GPUSLURM_MULTINODE_PYTHON"] = users_python(state_dir)
    held: set[str] = set()
    try:
        up = _multinode_sh("up", env)
        if up.returncode != 0:
            pytest.fail(f"multinode.sh up failed ({up.returncode}):\n{up.stderr}{up.stdout}", pytrace=False)
        held = namespaces(state_dir)
        yield MultiNodeCluster(state_dir, env, release.name if release else slurm_roots.HOST_RELEASE)
    finally:
        down = _multinode_sh("down", env)
        said = ""
        if down.returncode != 0:
            trace = state_dir / "log" / "down.trace"
            tail = trace.read_text(errors="replace").splitlines()[-40:] if trace.exists() else []
            said = (f"multinode.sh down failed ({down.returncode}): {down.stderr}\n--- {trace}\n"
                    + "\n".join(tail))
        if said:
            print(said, file=sys.stderr)
        left = leftovers(state_dir, held)
        if os.environ.get("GPUSLURM_KEEP_CLUSTER"):
            print(f"kept the multi-node cluster's state in {state_dir}", file=sys.stderr)
        else:
            shutil.rmtree(state_dir, ignore_errors=True)
    # Teardown is part of the contract: a namespace, process or cgroup left fails the session.
    assert not left, f"multinode.sh down left: {left}\n{said}"


def _use_release(env: dict[str, str]) -> slurm_roots.Release | None:
    """With ``GPUSLURM_SLURM_RELEASE`` naming a root (26.05): build or reuse it and have multinode.sh
    run every Slurm program chrooted into it, with Slurm's cgroup/v2 plugin (docs/multinode.md).
    The hooks, jobs and tests' Python inside it is the root's venv; this checkout and this session's
    interpreter are mounted into it (jobs run ``gpuslurm`` from them)."""
    try:
        release = slurm_roots.selected()
        if release is None:
            return None
        root = slurm_roots.ensure_root(release)
        preload = slurm_roots.preload_library()
    except (slurm_roots.RootError, subprocess.SubprocessError, OSError) as exc:
        pytest.fail(f"no root for the multi-node cluster: {exc}", pytrace=False)
    checkout = MULTINODE_SH.parents[1]
    env["GPUSLURM_SLURM_ROOT"] = str(root)
    env["GPUSLURM_CHECKOUT"] = str(checkout)
    env["GPUSLURM_ROOT_BINDS"] = ":".join(dict.fromkeys([str(checkout), sys.base_prefix, sys.prefix]))
    env["GPUSLURM_CLUSTER_PRELOAD"] = str(preload)
    env["GPUSLURM_MULTINODE_PYTHON"] = slurm_roots.VENV_PYTHON
    return release
