"""Debian roots holding newer Slurm releases, for the Slurm end-to-end tests (issue 19's matrix).

The host's Slurm (Debian 12's 22.05) runs the test cluster as it always has. For 24.11 (Debian
13 "trixie") and 26.05 (Debian "forky") a root is made from Debian's own packages with debootstrap
(no image is pulled), from the mirror the host's apt configuration names, and cached under
``/var/cache/gpuslurm-roots/<release>-<key>``, where the key hashes everything that goes into it
(suite, packages, mirror, pynvml wheel, this builder's version): a change builds a new root, an
unchanged one is reused. Builds of one release are serialised by a lock and land by rename, so
concurrent sessions build once and never see half a root.

Each root holds slurmctld, slurmd, the Slurm clients, munge, Lua 5.1 (job_submit.lua), the
release's Python and a venv at ``/opt/gpuslurm/venv`` (the hooks' interpreter) whose
``gpuslurm.pth`` names ``/opt/gpuslurm/checkout/src``: the cluster bind-mounts the checkout at
``/opt/gpuslurm/checkout``, so the hooks run this checkout's code (and ``gpuslurm install`` finds
its hook templates beside ``src``) with the root's own Python. docker-slurm/cluster.sh
(``GPUSLURM_SLURM_ROOT``) runs the daemons chrooted into the root in a mount namespace of its own.

Every difference between releases that the harness knows of lives in ``RELEASES`` below.

    python tests/helpers/slurm_roots.py build 24.11 [26.05 ...]   # make or reuse; prints the root's path
    python tests/helpers/slurm_roots.py path 24.11                 # the root's path, built or not
"""

from __future__ import annotations

import ctypes
import fcntl
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

import pytest

BUILDER_VERSION = 2
CACHE = Path(os.environ.get("GPUSLURM_ROOTS_CACHE", "/var/cache/gpuslurm-roots"))
RELEASE_VAR = "GPUSLURM_SLURM_RELEASE"
HOST_RELEASE = "22.05"
KEYRING = "/usr/share/keyrings/debian-archive-keyring.gpg"
DEBOOTSTRAP = "/usr/sbin/debootstrap"
CHROOT = "/usr/sbin/chroot"
UNSHARE = "/usr/bin/unshare"
NSENTER = "/usr/bin/nsenter"

# Inside every root: the hooks' venv, where the checkout is mounted, where the host's /etc
# is mounted (passwd, group and hosts are links into it, so users made by tests exist there too).
VENV = "/opt/gpuslurm/venv"
VENV_PYTHON = f"{VENV}/bin/python"
CHECKOUT = "/opt/gpuslurm/checkout"
HOST_ETC = "/.host-etc"
HOST_ETC_FILES = ("passwd", "group", "shadow", "gshadow", "hosts")
LIBDIR = "usr/lib/x86_64-linux-gnu"
LOADER = f"{LIBDIR}/ld-linux-x86-64.so.2"
PLUGIN_DIR = f"{LIBDIR}/slurm-wlm"
DAEMONS = ("slurmctld", "slurmd")
# The clients tests and hooks run; the host's copies are replaced by the root's in the test session.
CLIENTS = ("sacct", "sacctmgr", "salloc", "sattach", "sbatch", "sbcast", "scancel", "scontrol",
           "sdiag", "sinfo", "sprio", "squeue", "sreport", "srun", "sshare", "sstat", "strigger")
# slurmdbd: accounting (cluster.sh up --with-slurmdbd) runs the root's slurmdbd against a private
# MariaDB server of the host's, reached through its unix socket (the client library is the root's).
PACKAGES = ("slurmctld", "slurmd", "slurm-client", "slurmdbd", "munge", "lua5.1", "python3", "python3-venv",
            "python3-jinja2", "python3-click", "python3-prometheus-client", "python3-clustershell",
            "procps", "util-linux")
PYNVML = "nvidia-ml-py"


@dataclass(frozen=True)
class Release:
    """One Slurm release the suite runs against, and what the harness does differently for it."""

    name: str
    suite: str  # Debian suite whose packages carry it
    script: str  # debootstrap's script for the suite (forky has none of its own: sid's)
    python: str  # the suite's python3
    # cgroup.conf's CgroupPlugin: autodetect finds the cgroup2 tree cluster.sh gives the root (Slurm's
    # cgroup/v2 plugin, as on the v2-only hosts sites run); $GPUSLURM_CLUSTER_CGROUP=disabled runs
    # jobs without cgroups.
    cgroup_plugin: str
    # cgroup.conf's CgroupJobIdPaths is known (26.05: job cgroups are s<SLUID> unless yes)
    has_jobid_paths: bool


RELEASES = {
    "24.11": Release("24.11", "trixie", "trixie", "python3.13", "autodetect", False),
    "26.05": Release("26.05", "forky", "sid", "python3.14", "autodetect", True),
}
CGROUP_VAR = "GPUSLURM_CLUSTER_CGROUP"


class RootError(RuntimeError):
    """A root could not be made or used."""


def selected() -> Release | None:
    """The release ``$GPUSLURM_SLURM_RELEASE`` names; None for the host's own Slurm (the default)."""
    name = os.environ.get(RELEASE_VAR, HOST_RELEASE).strip() or HOST_RELEASE
    if name == HOST_RELEASE:
        return None
    if name not in RELEASES:
        raise RootError(f"{RELEASE_VAR}={name!r}: not one of {', '.join([HOST_RELEASE, *RELEASES])}")
    return RELEASES[name]


def _selected_or_none() -> Release | None:
    try:
        return selected()
    except RootError:  # said by the slurm_cluster fixture
        return None


def cgroup_plugin(release: Release | None) -> str:
    """The CgroupPlugin the session cluster runs ``release`` with (None: the host's Slurm)."""
    default = release.cgroup_plugin if release is not None else "autodetect"
    return os.environ.get(CGROUP_VAR, "").strip() or default


def runs_cgroup_v2() -> bool:
    """Whether the session cluster runs Slurm's cgroup/v2 plugin (a root, cgroups not disabled)."""
    release = _selected_or_none()
    return release is not None and cgroup_plugin(release) in ("autodetect", "cgroup/v2")


def without_cgroups(reason: str = "", run: bool = True) -> pytest.MarkDecorator:
    """xfail (strict) for a test that needs Slurm's cgroups, on a release run without them
    (``GPUSLURM_CLUSTER_CGROUP=disabled``); ``run=False`` for one that would leave the session
    cluster broken for the tests after it."""
    release = _selected_or_none()
    off = release is not None and cgroup_plugin(release) == "disabled"
    name = release.name if release else HOST_RELEASE
    why = f"Slurm {name} runs here with CgroupPlugin=disabled (docs/compatibility.md)"
    return pytest.mark.xfail(off, strict=True, run=run, reason=f"{why}: {reason}" if reason else why)


def v1_only(reason: str, run: bool = True) -> pytest.MarkDecorator:
    """xfail (strict) for a test written for Slurm's cgroup/v1 layout (``/sys/fs/cgroup/devices/
    slurm*/...``), on a release run with the cgroup/v2 plugin."""
    release = _selected_or_none()
    name = release.name if release else HOST_RELEASE
    why = f"Slurm {name} runs here with cgroup/v2 (docs/compatibility.md): {reason}"
    return pytest.mark.xfail(runs_cgroup_v2(), strict=True, run=run, reason=why)


def host_mirror() -> str:
    """The Debian archive the host's apt uses (deb822 ``.sources`` or one-line ``sources.list``)."""
    etc = Path("/etc/apt")
    sources = [p.read_text(errors="replace") for p in sorted((etc / "sources.list.d").glob("*.sources"))]
    lists = [p.read_text(errors="replace")
             for p in [etc / "sources.list", *sorted((etc / "sources.list.d").glob("*.list"))] if p.exists()]
    mirror = mirror_from(sources, lists)
    if mirror is None:
        raise RootError("the host's apt configuration names no Debian archive (main) to debootstrap from")
    return mirror


def mirror_from(sources: list[str], lists: list[str]) -> str | None:
    """The first archive of binary packages with a ``main`` component and a release suite (not
    ``-security``, ``-updates``) in apt's deb822 ``sources`` and one-line ``lists`` texts."""
    uris: list[str] = []
    for text in sources:
        for stanza in re.split(r"\n\s*\n", text):
            fields = {k.lower(): v for k, v in re.findall(r"^([A-Za-z][\w-]*):[ \t]*(.*)$", stanza, re.M)}
            if fields.get("enabled", "yes").strip().lower() == "no":
                continue
            if "deb" in fields.get("types", "").split() and "main" in fields.get("components", "").split() \
                    and any(s.isalpha() for s in fields.get("suites", "").split()):
                uris += fields.get("uris", "").split()
    for text in lists:
        for line in text.splitlines():
            parts = re.sub(r"\[[^]]*\]", " ", line.split("#", 1)[0]).split()
            if len(parts) >= 4 and parts[0] == "deb" and parts[2].isalpha() and "main" in parts[3:]:
                uris.append(parts[1])
    archives = [u.rstrip("/") for u in uris if re.fullmatch(r"(https?|file)://\S+", u)]
    return archives[0] if archives else None


def _pynvml_version() -> str:
    return metadata.version(PYNVML)


def root_key(release: Release, mirror: str) -> str:
    """What the root is made of, hashed: a change to any of it builds a new root."""
    facts = {"builder": BUILDER_VERSION, "suite": release.suite, "script": release.script,
             "packages": sorted(PACKAGES), "mirror": mirror, "pynvml": _pynvml_version(),
             "venv": VENV, "checkout": CHECKOUT, "host_etc": [HOST_ETC, *HOST_ETC_FILES]}
    return hashlib.sha256(json.dumps(facts, sort_keys=True).encode()).hexdigest()[:12]


def root_path(release: Release, mirror: str | None = None) -> Path:
    return CACHE / f"{release.name}-{root_key(release, mirror or host_mirror())}"


def _run(argv: list[str], log: Path, timeout: float, **kwargs: object) -> None:
    with log.open("a") as out:
        out.write(f"\n$ {' '.join(argv)}\n")
        out.flush()
        done = subprocess.run(argv, stdout=out, stderr=subprocess.STDOUT, timeout=timeout, check=False,
                              **kwargs)  # type: ignore[call-overload]
    if done.returncode != 0:
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-25:])
        raise RootError(f"{' '.join(argv[:3])}... failed ({done.returncode}); end of {log}:\n{tail}")


def ensure_root(release: Release, log=sys.stderr) -> Path:  # type: ignore[no-untyped-def]
    """The cached root for ``release``, built first if it is not there (minutes; serialised)."""
    mirror = host_mirror()
    final = root_path(release, mirror)
    if (final / ".gpuslurm-root.json").exists():
        return final
    CACHE.mkdir(parents=True, exist_ok=True)
    CACHE.chmod(0o755)  # jobs' users run the root's clients through the wrappers
    with open(CACHE / f"{release.name}.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (final / ".gpuslurm-root.json").exists():  # built by whoever held the lock
            return final
        started = time.monotonic()
        print(f"slurm_roots: building {final} (Slurm {release.name}, Debian {release.suite}, {mirror})",
              file=log, flush=True)
        work = Path(tempfile.mkdtemp(prefix=f".{final.name}-", dir=CACHE))
        try:
            work.chmod(0o755)  # package scripts run commands as other users (munge) in it
            _build(release, mirror, work, final)
            work.rename(final)
        except BaseException:
            shutil.rmtree(work, ignore_errors=True)
            raise
        print(f"slurm_roots: built {final} in {time.monotonic() - started:.0f} s", file=log, flush=True)
    return final


def _build(release: Release, mirror: str, work: Path, final: Path) -> None:
    log = CACHE / f"{final.name}.log"
    log.write_text("")
    # Everything at debootstrap time: forky's InRelease may be past its Valid-Until, which apt
    # inside the root would refuse later.
    debs = CACHE / f"debs-{release.suite}"  # the packages, kept for the next build of the suite
    debs.mkdir(exist_ok=True)
    _run([DEBOOTSTRAP, "--variant=minbase", f"--keyring={KEYRING}", f"--include={','.join(PACKAGES)}",
          f"--cache-dir={debs}",
          release.suite, str(work), mirror, release.script], log, timeout=1800)
    # pynvml from a wheel the host fetches (pure Python): pip in the root reaches no index.
    wheels = work / "opt" / "gpuslurm" / "wheels"
    wheels.mkdir(parents=True)
    _run([sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--dest", str(wheels),
          f"{PYNVML}=={_pynvml_version()}"], log, timeout=300)
    (work / CHECKOUT.lstrip("/")).mkdir(parents=True)
    (work / HOST_ETC.lstrip("/")).mkdir()
    inside = (f"set -e; {release.python} -m venv --system-site-packages {VENV}; "
              f"{VENV}/bin/pip install --no-index --find-links /opt/gpuslurm/wheels {PYNVML}; "
              f"echo {CHECKOUT}/src > "
              f"$({VENV_PYTHON} -c 'import sysconfig; print(sysconfig.get_path(\"purelib\"))')/gpuslurm.pth")
    # A clean environment inside: none of the host's PIP_* or PYTHON* settings.
    in_chroot = ('mount --rbind /dev "$1/dev" && mount -t proc proc "$1/proc" && '
                 'exec chroot "$1" /usr/bin/env -i PATH=/usr/sbin:/usr/bin /bin/sh -c "$2"')
    _run([UNSHARE, "--mount", "--propagation", "private", "--", "/bin/sh", "-c", in_chroot,
          "build", str(work), inside], log, timeout=600)
    etc = work / "etc"
    for name in HOST_ETC_FILES:
        (etc / name).unlink(missing_ok=True)
        (etc / name).symlink_to(f"{HOST_ETC}/{name}")
    # The root's own path, inside the root, leads back to its top: slurm.conf's PluginDir (the
    # root's plugins) then holds for the daemons inside and the clients run from the host alike.
    inner = work / str(final).lstrip("/")
    inner.parent.mkdir(parents=True, exist_ok=True)
    inner.symlink_to("/")
    versions = subprocess.run([CHROOT, str(work), "dpkg-query", "-W", "slurmctld", "munge", "python3",
                               "lua5.1"], capture_output=True, text=True, timeout=60, check=True).stdout
    packages = dict(line.split("\t", 1) for line in versions.splitlines() if "\t" in line)
    facts = {"release": release.name, "suite": release.suite, "mirror": mirror, "builder": BUILDER_VERSION,
             "packages": packages}
    slurm = packages.get("slurmctld", "")
    if not slurm.startswith(release.name):
        raise RootError(f"Debian {release.suite} carries slurmctld {slurm or 'nothing'}, "
                        f"not Slurm {release.name}")
    (work / ".gpuslurm-root.json").write_text(json.dumps(facts, indent=1) + "\n")


PRELOAD_SOURCE = Path(__file__).resolve().parents[1] / "cgroup2_only.c"
GCC = "/usr/bin/gcc"


def preload_library() -> Path:
    """tests/cgroup2_only.c built for slurmd (cgroup v2 on this hybrid host: cluster.sh), cached
    under CACHE by the source's hash; built once under a lock, landed by rename."""
    source = PRELOAD_SOURCE.read_bytes()
    lib = CACHE / f"cgroup2_only-{hashlib.sha256(source).hexdigest()[:12]}.so"
    if lib.exists():
        return lib
    CACHE.mkdir(parents=True, exist_ok=True)
    with open(CACHE / "cgroup2_only.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if lib.exists():
            return lib
        with tempfile.TemporaryDirectory(dir=CACHE) as work:
            out = Path(work) / lib.name
            done = subprocess.run([GCC, "-shared", "-fPIC", "-O2", "-Wall", "-o", str(out),
                                   str(PRELOAD_SOURCE), "-ldl"], capture_output=True, text=True, timeout=120,
                                  check=False)
            if done.returncode != 0:
                raise RootError(f"gcc {PRELOAD_SOURCE} failed: {done.stderr.strip()}")
            out.chmod(0o755)
            out.rename(lib)
    return lib


def client_wrappers(root: Path, bin_dir: Path) -> dict[str, Path]:
    """Scripts in ``bin_dir`` that run the root's Slurm clients on the host, for any user: the
    root's own dynamic loader and libraries, no chroot (which would need root). slurm.conf's
    PluginDir names the root's plugins."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    bin_dir.chmod(0o755)
    libs = f"{root / PLUGIN_DIR}:{root / LIBDIR}"
    made = {}
    for name in CLIENTS:
        if not (root / "usr" / "bin" / name).exists():
            continue
        wrapper = bin_dir / name
        wrapper.write_text(f"#!/bin/sh\n# Slurm's {name} from {root}\n"
                           f"exec {root / LOADER} --library-path {libs} --argv0 {name} "
                           f"{root / 'usr' / 'bin' / name} \"$@\"\n")
        wrapper.chmod(0o755)
        made[f"/usr/bin/{name}"] = wrapper
    return made


def daemon_wrappers(active: ActiveRoot, sbin_dir: Path) -> dict[str, Path]:
    """Scripts in ``sbin_dir`` that run the root's slurmctld and slurmd (as root: tests restart
    them, ``slurmd -G``, ``-V``) where cluster.sh runs them: its ``run/node-exec`` (the cluster's
    namespaces, chrooted into the root; with cgroup v2 its cgroup, and slurmd's preload)."""
    sbin_dir.mkdir(parents=True, exist_ok=True)
    made = {}
    for name in DAEMONS:
        wrapper = sbin_dir / name
        wrapper.write_text(f"#!/bin/sh\n# Slurm's {name} from {active.root}, where the cluster runs it\n"
                           f"exec {active.node_exec} /usr/sbin/{name} \"$@\"\n")
        wrapper.chmod(0o755)
        made[f"/usr/sbin/{name}"] = wrapper
    return made


_CLONE_NEWNS = 0x00020000
_MS_BIND, _MS_REC, _MS_PRIVATE = 4096, 16384, 1 << 18


def use_clients(wrappers: dict[str, Path]) -> None:
    """From now on this process and its children see the root's programs at the host's paths
    (the keys: /usr/bin/scontrol ...): a mount namespace of its own (the host's mounts are
    untouched) with each wrapper bound over the host's program. Tests and the gpuslurm commands
    they run name /usr/bin/scontrol etc."""
    libc = ctypes.CDLL(None, use_errno=True)

    def check(rc: int, what: str) -> None:
        if rc != 0:
            err = ctypes.get_errno()
            raise RootError(f"{what}: {os.strerror(err)}")

    check(libc.unshare(_CLONE_NEWNS), "unshare(CLONE_NEWNS)")
    check(libc.mount(b"none", b"/", None, _MS_REC | _MS_PRIVATE, None), "mount --make-rprivate /")
    for path, wrapper in wrappers.items():
        target = Path(path)
        if target.exists():
            check(libc.mount(str(wrapper).encode(), str(target).encode(), None, _MS_BIND, None),
                  f"mount --bind {wrapper} {target}")


@dataclass(frozen=True)
class ActiveRoot:
    """The root the session's cluster runs in, and the process holding its mount namespace."""

    release: Release
    root: Path
    holder_pidfile: Path

    @property
    def node_exec(self) -> Path:
        """cluster.sh's script that runs a command where the cluster's daemons run."""
        return self.holder_pidfile.parent / "node-exec"

    def inside(self, *argv: str) -> list[str]:
        """argv run as root in the cluster's namespace, chrooted into the root."""
        pid = self.holder_pidfile.read_text().strip()
        return [NSENTER, f"--target={pid}", "--mount", "--root", "--wd=/", "--", *argv]


_active: ActiveRoot | None = None


def on_node(argv: list[str]) -> list[str]:
    """argv as root where the cluster's jobs run: as is with the host's Slurm, else in the root."""
    return argv if _active is None else _active.inside(*argv)


def activate(active: ActiveRoot | None) -> None:
    global _active
    _active = active


def active() -> ActiveRoot | None:
    """The session cluster's root, or None when the cluster is the host's own Slurm."""
    return _active


def main(argv: list[str]) -> int:
    if len(argv) < 2 or argv[0] not in ("build", "path"):
        print("usage: slurm_roots.py build|path RELEASE...", file=sys.stderr)
        return 2
    for name in argv[1:]:
        if name not in RELEASES:
            print(f"slurm_roots.py: {name}: not one of {', '.join(RELEASES)}", file=sys.stderr)
            return 2
    make = ensure_root if argv[0] == "build" else root_path
    # Several releases build at once (each under its own lock): CI starts this early, in the
    # background, so that the builds overlap its main test run.
    with ThreadPoolExecutor(max_workers=len(argv) - 1) as pool:
        futures = [pool.submit(make, RELEASES[name]) for name in argv[1:]]
    status = 0
    for name, future in zip(argv[1:], futures, strict=True):
        try:
            print(future.result())
        except (RootError, subprocess.SubprocessError, OSError) as exc:
            print(f"slurm_roots.py: Slurm {name}: {exc}", file=sys.stderr)
            status = 1
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
