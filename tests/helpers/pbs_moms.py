"""Two more execution hosts for the real PBS test cluster: ``pbsmom1`` and ``pbsmom2``, each one
pbs_mom in network, UTS and mount namespaces of its own (the module fixture ``two_moms``).

The one-node cluster's server namespace (``gpuslurm-pbs``, 192.0.2.10) gets one veth pair per mom;
each mom's end is its ``eth0`` with 192.0.2.11 or .12 and routes to the server and, through it,
to the other mom (forwarding on in the server's namespace only). No address outside
192.0.2.0/24 and nothing in the host's network namespace. Each mom has its own hosts file
(``/etc/netns/<ns>/hosts``, which ``ip netns exec`` bind-mounts on /etc/hosts), its own host name,
PBS_HOME and pbs.conf, and in its mount namespace its own gpuslurm directories: the paths the
hook's config names (the bundle, run_dir, state_dir, the devices hierarchy) are bind-mounted from
``moms/<name>/`` there, so the one hook config PBS copies to every mom replays pbsmom1's bundle
(dgx-h100) on pbsmom1 and pbsmom2's (l40s-4x) on pbsmom2, and each writes its own maps,
summaries and cgroups. On a cgroup v1 host each mom also runs in a cgroup namespace rooted at its
own devices cgroup (``gpuslurm-test-<name>``), bind-mounted as the devices hierarchy the config
names: the same job id's cgroup on both moms are two directories, and ``/proc/PID/cgroup`` reads
in each mom's namespace as on a host of its own. The moms share the host's /dev (the one-node
cluster's fake GPU files cover both bundles' minors). The server's hosts file gains the moms'
lines while they exist.
Teardown kills every process in the moms' namespaces, deletes the nodes, namespaces, links, hosts
files, cgroup directories and ``moms/``, and checks that nothing is left.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from tests.helpers.pbs_fixture import PREFIX
from tests.helpers.pbs_helpers import HOST, PBSNODES, QMGR, Hooked, _vnodes, _wait_vnodes

SERVER_NS = "gpuslurm-pbs"  # pbs-cluster/cluster.sh's
SERVER_ADDR = "192.0.2.10"
MOMS = {"pbsmom1": ("192.0.2.11", "dgx-h100"), "pbsmom2": ("192.0.2.12", "l40s-4x")}


@dataclass
class Mom:
    name: str
    addr: str
    bundle_name: str
    root: Path  # moms/<name>: its PBS_HOME, pbs.conf and gpuslurm directories

    @property
    def ns(self) -> str:
        return f"gpuslurm-pbs-{self.name}"

    @property
    def veth(self) -> str:
        return f"pbsv{self.name[-1]}"

    @property
    def cgroup_name(self) -> str:  # its subtree of the devices hierarchy
        return f"gpuslurm-test-{self.name}"

    @property
    def conf(self) -> Path:
        return self.root / "pbs.conf"

    @property
    def home(self) -> Path:
        return self.root / "home"

    @property
    def jobs_dir(self) -> Path:
        return self.root / "gs-run" / "jobs"

    @property
    def summaries(self) -> Path:
        return self.root / "gs-state" / "jobs"

    @property
    def bundle(self) -> Path:
        return self.root / "bundle"

    def mom_log(self) -> str:
        logs = sorted((self.home / "mom_logs").iterdir()) if (self.home / "mom_logs").is_dir() else []
        return "".join(p.read_text(errors="replace") for p in logs[-2:])


def _sh(*argv: str, check: bool = True, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout, check=False)
    if check and result.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed ({result.returncode}): {result.stderr.strip()}")
    return result


def _hosts_lines() -> str:
    return "".join(f"{addr} {name}\n" for name, (addr, _) in MOMS.items())


def _binds(hooked: Hooked, mom: Mom) -> list[tuple[Path, Path]]:
    """(what of the mom's own, the path the shared hook config names) for its mount namespace."""
    state = hooked.cluster.state_dir
    binds = [(mom.bundle, hooked.bundle), (mom.root / "gs-run", state / hooked.run_name),
             (mom.root / "gs-state", state / hooked.state_name)]
    if hooked.cgroup is not None:  # its own subtree of the devices hierarchy, seen as the root
        binds.append((hooked.cgroup / "devices" / mom.cgroup_name, hooked.cgroup / "devices"))
    return binds


def _start(hooked: Hooked, mom: Mom) -> None:
    from gpuslurm.hw.source import bundle_path

    source = bundle_path(mom.bundle_name)
    assert source is not None
    shutil.copytree(source, mom.bundle)
    for sub in ("gs-run", "gs-state"):
        (mom.root / sub).mkdir(mode=0o755)
    if hooked.cgroup is not None:
        (hooked.cgroup / "devices" / mom.cgroup_name).mkdir(exist_ok=True)
    mom.conf.write_text(f"PBS_EXEC={PREFIX}\nPBS_HOME={mom.home}\nPBS_SERVER={HOST}\nPBS_START_SERVER=0\n"
                        "PBS_START_SCHED=0\nPBS_START_COMM=0\nPBS_START_MOM=1\nPBS_CORE_LIMIT=unlimited\n"
                        "PBS_SCP=/usr/bin/scp\n")
    hosts = Path("/etc/netns") / mom.ns / "hosts"
    hosts.parent.mkdir(parents=True, exist_ok=True)
    hosts.write_text(f"127.0.0.1 localhost\n{SERVER_ADDR} {HOST}\n{_hosts_lines()}")
    _sh("ip", "netns", "add", mom.ns)
    _sh("ip", "-n", mom.ns, "link", "set", "lo", "up")
    _sh("ip", "-n", SERVER_NS, "link", "add", mom.veth, "type", "veth", "peer", "name", "eth0",
        "netns", mom.ns)
    _sh("ip", "-n", SERVER_NS, "link", "set", mom.veth, "up")
    _sh("ip", "-n", SERVER_NS, "route", "add", f"{mom.addr}/32", "dev", mom.veth, "src", SERVER_ADDR)
    _sh("ip", "-n", mom.ns, "addr", "add", f"{mom.addr}/32", "dev", "eth0")
    _sh("ip", "-n", mom.ns, "link", "set", "eth0", "up")
    _sh("ip", "-n", mom.ns, "route", "add", f"{SERVER_ADDR}/32", "dev", "eth0")
    _sh("ip", "-n", mom.ns, "route", "add", "192.0.2.0/24", "via", SERVER_ADDR, "dev", "eth0", "onlink")
    for _, target in _binds(hooked, mom):  # gpuslurm makes run_dir and state_dir on first use
        target.mkdir(mode=0o755, exist_ok=True)
    binds = "".join(f'mount --bind "{src}" "{dst}"; ' for src, dst in _binds(hooked, mom))
    env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "PBS_CONF_FILE": str(mom.conf), "LANG": "C.UTF-8"}
    habitat = subprocess.run(["ip", "netns", "exec", mom.ns, "unshare", "--uts", "sh", "-c",
                              f"hostname {mom.name}; exec {PREFIX}/libexec/pbs_habitat"],
                             env=env, capture_output=True, text=True, timeout=120, check=False)
    if habitat.returncode != 0:
        raise RuntimeError(f"pbs_habitat for {mom.name} failed: {habitat.stdout}{habitat.stderr}")
    (mom.home / "mom_priv" / "config").write_text(f"$clienthost {HOST}\n$usecp *:/ /\n")
    start = f"hostname {mom.name}; {binds}exec {PREFIX}/sbin/pbs_mom"
    if hooked.cgroup is not None:
        # a cgroup namespace rooted at its subtree: /proc/PID/cgroup and mountinfo read there as on
        # a host of its own, so gpuslurm's check of a moved task sees the path it made
        procs = hooked.cgroup / "devices" / mom.cgroup_name / "cgroup.procs"
        start = (f"hostname {mom.name}; echo $$ > {procs}; {binds}"
                 f"exec unshare --cgroup {PREFIX}/sbin/pbs_mom")
    started = subprocess.run(["ip", "netns", "exec", mom.ns, "unshare", "--uts", "--mount", "--propagation",
                              "private", "sh", "-ec", start],
                             env=env, capture_output=True, text=True, timeout=60, check=False)
    if started.returncode != 0:
        raise RuntimeError(f"pbs_mom on {mom.name} did not start: {started.stdout}{started.stderr}")


def _stop(mom: Mom) -> None:
    if _sh("ip", "netns", "pids", mom.ns, check=False).returncode == 0:
        for _ in range(20):
            pids = [int(p) for p in _sh("ip", "netns", "pids", mom.ns, check=False).stdout.split()]
            if not pids:
                break
            for pid in pids:
                try:
                    os.kill(pid, 15 if _ < 10 else 9)
                except ProcessLookupError:
                    pass
            time.sleep(0.5)
        _sh("ip", "-n", SERVER_NS, "link", "del", mom.veth, check=False)
        _sh("ip", "netns", "del", mom.ns, check=False)
    shutil.rmtree(Path("/etc/netns") / mom.ns, ignore_errors=True)


def namespaces_unavailable() -> str | None:
    """Why this host cannot give a mom the namespaces it needs, or None when it can."""
    if os.geteuid() != 0:
        return "the two-mom PBS cluster needs root (namespaces, veths, bind mounts)"
    try:
        probe = subprocess.run(["unshare", "--net", "--uts", "--mount", "--cgroup", "true"],
                               capture_output=True, text=True, timeout=30, check=False)
    except OSError as exc:
        return f"unshare: {exc}"
    return None if probe.returncode == 0 else f"unshare --net --uts --mount --cgroup: {probe.stderr.strip()}"


def _hup_when_hooked(mom: Mom, timeout: float = 90) -> None:
    hooks = mom.home / "mom_priv" / "hooks"
    deadline = time.monotonic() + timeout
    while not all((hooks / f"gpuslurm.{ext}").exists() for ext in ("HK", "CF", "PY")):
        if time.monotonic() > deadline:
            raise TimeoutError(f"no gpuslurm hook on {mom.name}:\n{mom.mom_log()[-2000:]}")
        time.sleep(0.5)
    time.sleep(1)  # the last file's copy is logged before it is renamed into place
    os.kill(int((mom.home / "mom_priv" / "mom.lock").read_text().split()[0]), 1)


def mom_vnodes(mom: Mom) -> list[str]:
    """The NUMA vnodes the hook's exechost_startup publishes for ``mom`` (from its bundle)."""
    from gpuslurm.gres.pbs_vnodes import plan_vnodes
    from gpuslurm.hw.source import load_node

    return [f"{mom.name}[{v.numa_node}]" for v in plan_vnodes(load_node(mom.bundle_name))]


@contextmanager
def two_moms(hooked: Hooked) -> Iterator[list[Mom]]:
    """pbsmom1 and pbsmom2 up, free, and the server's own host (pbshost) offline so that a
    ``place=scatter`` job lands on the two moms; everything undone at the end (see the module)."""
    cluster = hooked.cluster
    root = cluster.state_dir / "moms"
    moms = [Mom(name, addr, bundle, root / name) for name, (addr, bundle) in MOMS.items()]
    server_hosts = Path("/etc/netns") / SERVER_NS / "hosts"
    original = server_hosts.read_text()
    own = [n for n in _vnodes(cluster.run(PBSNODES, "-av")) if n == HOST or n.startswith(HOST + "[")]
    try:
        root.mkdir(mode=0o755)
        for mom in moms:
            mom.root.mkdir(mode=0o755)
        with server_hosts.open("a") as fh:  # in place: the running server has this inode bound
            fh.write(_hosts_lines())
        _sh("ip", "netns", "exec", SERVER_NS, "sysctl", "-qw", "net.ipv4.ip_forward=1")
        for mom in moms:
            _start(hooked, mom)
            cluster.run(QMGR, "-c", f"create node {mom.name}")
        for mom in moms:  # the server copies the hooks to a new mom after it joins: then HUP it,
            _hup_when_hooked(mom)  # so that exechost_startup publishes its NUMA vnodes
        for name in own:
            cluster.run(QMGR, "-c", f"set node {name} state = offline")
        _wait_vnodes(cluster, [v for mom in moms for v in mom_vnodes(mom)], timeout=120)
        yield moms
    finally:
        _undo(hooked, moms, own, server_hosts, original)


def _undo(hooked: Hooked, moms: list[Mom], own: list[str], server_hosts: Path, original: str) -> None:
    from tests.helpers.pbs_helpers import _online

    cluster = hooked.cluster
    nodes = _vnodes(cluster.run(PBSNODES, "-av", check=False))
    for mom in moms:
        for name in [n for n in nodes if n.startswith(mom.name + "[")] + [mom.name]:
            cluster.run(QMGR, "-c", f"delete node {name}", check=False)
        _stop(mom)
    with server_hosts.open("r+") as fh:
        fh.truncate(0)
        fh.write(original)
    _sh("ip", "netns", "exec", SERVER_NS, "sysctl", "-qw", "net.ipv4.ip_forward=0", check=False)
    for mom in moms:
        if hooked.cgroup is not None:
            top = hooked.cgroup / "devices" / mom.cgroup_name
            for path in sorted(top.rglob("*"), reverse=True) if top.is_dir() else []:
                if path.is_dir():
                    path.rmdir()
            if top.is_dir():
                top.rmdir()
    shutil.rmtree(cluster.state_dir / "moms", ignore_errors=True)
    for name in own:
        _online(cluster, name)
    left = [m.ns for m in moms if m.ns in _sh("ip", "netns", "list").stdout]
    links = _sh("ip", "-n", SERVER_NS, "-o", "link", "show", check=False).stdout
    left += [m.veth for m in moms if f" {m.veth}@" in links]
    assert not left, f"left behind: {left}"
