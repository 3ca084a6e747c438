"""The docker-slurm image, built and run: the fixtures ``cluster_image`` and ``docker_node``.

``docker_engine`` (session) starts a private dockerd through docker-slurm/offline-docker.sh (its
own data root and socket, no bridge, no iptables) unless one already answers on that socket, and
stops it at the end if it started it. ``cluster_image`` (session) builds docker-slurm/Dockerfile
as a user without a registry would: ``FROM`` a Debian 12 base made by debootstrap
(``offline-docker.sh base``, made once per recipe and kept in the engine's data root), apt over
``--network host``, and gpuslurm's dependencies from a wheelhouse that pip downloads on the host
(cached per dependency list under $GPUSLURM_DOCKER_CACHE). Docker's layer cache keeps the apt layer,
so a source change rebuilds only the COPY and pip layers.

``docker_node`` (module) runs that image as docker-slurm/compose.yaml describes its ``slurm``
service, translated to the Docker SDK by :func:`compose_run_settings` (no ``docker compose`` on
this machine: Debian 12's docker-compose is v1, which knows no ``cgroup:``), so the file users
run is the container the test runs. It is the cluster node ``gpunode``: the fake GPU device files
are made on the host (docker-slurm/fake-devices.sh's ledger) and passed in with ``--device``; the
container shares the host's cgroup hierarchy (Slurm's devices cgroups are real) and, because
Slurm resolves addresses with AI_ADDRCONFIG (no IPv4 but loopback means none at all), the host's
network, with its own Slurm ports. Not ``--privileged``: that asks for every capability, and this
machine's root lacks CAP_SYS_RESOURCE, so runc refuses; every capability root has is added
instead. All of it under the host-wide lock of cluster_fixture.py.

Where docker.io, debootstrap or the docker SDK are missing the tests skip, except under CI
(``CI`` or ``GPUSLURM_REQUIRE_SLURM``), where they fail.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    import docker

ROOT = Path(__file__).resolve().parents[2]
OFFLINE_DOCKER = ROOT / "docker-slurm" / "offline-docker.sh"
FAKE_DEVICES = ROOT / "docker-slurm" / "fake-devices.sh"
SOCKET = Path(os.environ.get("GPUSLURM_DOCKER_RUN", "/run/gpuslurm-docker")) / "docker.sock"
CACHE = Path(os.environ.get("GPUSLURM_DOCKER_CACHE", "/var/cache/gpuslurm-docker"))
IMAGE = "gpuslurm-cluster:test"
NODE = "gpunode"
COMPOSE = ROOT / "docker-slurm" / "compose.yaml"
SERVICE = "slurm"
# Not the native test cluster's 6817-6819: both may run in one session, on one network.
PORT = 6837
NEEDED = ("/usr/sbin/dockerd", "/usr/sbin/debootstrap", "/usr/bin/containerd", "/usr/sbin/runc")
BUILD_TIMEOUT_S = 1800


def docker_unavailable() -> str | None:
    """Why this machine cannot build and run the docker-slurm image, or None when it can."""
    if os.geteuid() != 0:
        return "the Docker test needs root (dockerd, mknod in /dev, cgroups)"
    missing = [path for path in NEEDED if not os.access(path, os.X_OK)]
    if missing:
        return f"{', '.join(missing)} missing: apt-get install -y docker.io debootstrap"
    if shutil.which("docker") is None:
        return "no docker client: apt-get install -y docker.io"
    try:
        import docker  # noqa: F401
    except ImportError:
        return "the docker Python SDK is missing: pip install -e '.[test]'"
    return None


def _required() -> bool:
    return bool(os.environ.get("GPUSLURM_REQUIRE_SLURM") or os.environ.get("CI"))


def _run(argv: list[str], timeout: float, env: dict[str, str] | None = None) -> str:
    done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False, env=env)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed ({done.returncode}):\n{done.stderr}{done.stdout}")
    return done.stdout.strip()


@pytest.fixture(scope="session")
def docker_engine(host_cluster_lock: None) -> Iterator[docker.DockerClient]:
    """A client of the private dockerd (started here unless it already answers)."""
    reason = docker_unavailable()
    if reason:
        if _required():
            pytest.fail(f"CI or GPUSLURM_REQUIRE_SLURM is set, but {reason}", pytrace=False)
        pytest.skip(reason)
    import docker

    try:  # the client asks the engine's version as it is made: no engine, no client
        client = docker.DockerClient(base_url=f"unix://{SOCKET}", timeout=BUILD_TIMEOUT_S)
        client.ping()
        started = False
    except docker.errors.DockerException:
        _run(["/bin/bash", str(OFFLINE_DOCKER), "start"], timeout=120)
        client = docker.DockerClient(base_url=f"unix://{SOCKET}", timeout=BUILD_TIMEOUT_S)
        started = True
    try:
        yield client
    finally:
        client.close()
        if started:
            _run(["/bin/bash", str(OFFLINE_DOCKER), "stop"], timeout=120)


def _wheelhouse() -> Path:
    """gpuslurm's dependencies and build backend as wheels, for pip in the image without PyPI."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    requirements = sorted([*project["project"]["dependencies"], *project["build-system"]["requires"]])
    key = hashlib.sha256("\n".join([sys.version.split()[0], *requirements]).encode()).hexdigest()[:12]
    wheels = CACHE / f"wheels-{key}"
    if (wheels / ".complete").exists():
        return wheels
    shutil.rmtree(wheels, ignore_errors=True)
    wheels.mkdir(parents=True)
    # The image's Python is Debian 12's 3.11: the wheels this interpreter (3.11) would take.
    _run([sys.executable, "-m", "pip", "download", "--quiet", "--only-binary=:all:", "--dest", str(wheels),
          *requirements], timeout=600)
    (wheels / ".complete").touch()
    return wheels


def _build_context(into: Path, wheels: Path) -> None:
    """The repository's files as git sees them (tracked and new, not ignored: no .venv or caches),
    and the wheelhouse as ``wheels/``."""
    listed = subprocess.run(["git", "-C", str(ROOT), "ls-files", "-z", "--cached", "--others",
                             "--exclude-standard"], capture_output=True, timeout=60, check=True).stdout
    for name in listed.decode().split("\0"):
        source = ROOT / name
        if not name or not source.is_file():  # deleted in the worktree, or a submodule
            continue
        target = into / name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(source, target)
    shutil.copytree(wheels, into / "wheels")


@dataclass(frozen=True)
class BuiltImage:
    tag: str
    base: str
    build_s: float
    size_bytes: int


@pytest.fixture(scope="session")
def cluster_image(docker_engine: docker.DockerClient) -> BuiltImage:
    """docker-slurm/Dockerfile built on the debootstrap base, tagged ``gpuslurm-cluster:test``."""
    import docker

    base = _run(["/bin/bash", str(OFFLINE_DOCKER), "base"], timeout=BUILD_TIMEOUT_S)
    wheels = _wheelhouse()
    with tempfile.TemporaryDirectory(prefix="gpuslurm-docker-context-") as context:
        _build_context(Path(context), wheels)
        start = time.monotonic()
        try:
            image, _ = docker_engine.images.build(
                path=context, dockerfile="docker-slurm/Dockerfile", tag=IMAGE, network_mode="host",
                buildargs={"BASE": base, "PIP_ARGS": "--no-index --find-links /src/deps"},
                rm=True, forcerm=True, timeout=BUILD_TIMEOUT_S)
        except docker.errors.BuildError as exc:
            log = "".join(str(part.get("stream", part.get("error", ""))) for part in exc.build_log)
            pytest.fail(f"docker build failed: {exc}\n{log[-4000:]}", pytrace=False)
        build_s = time.monotonic() - start
    # vfs keeps every layer as a full copy: drop the layers of earlier builds.
    docker_engine.images.prune(filters={"dangling": True})
    size = int(image.attrs["Size"])
    print(f"docker-slurm image {IMAGE} on {base}: built in {build_s:.0f} s, {size / 1e6:.0f} MB",
          file=sys.stderr)
    return BuiltImage(IMAGE, base, build_s, size)


def _capabilities() -> list[str]:
    """Every capability this process's root may hand on (CapBnd), as Docker names them."""
    bounding = 0
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("CapBnd:"):
            bounding = int(line.split()[1], 16)
    return [name for bit, name in enumerate(_CAP_NAMES) if bounding >> bit & 1]


# Linux capability numbers 0..37, as Docker (and capabilities(7)) name them without CAP_; docker.io
# 20.10 knows no later ones (PERFMON, BPF, CHECKPOINT_RESTORE), which Slurm does not need.
_CAP_NAMES = (
    "CHOWN", "DAC_OVERRIDE", "DAC_READ_SEARCH", "FOWNER", "FSETID", "KILL", "SETGID", "SETUID", "SETPCAP",
    "LINUX_IMMUTABLE", "NET_BIND_SERVICE", "NET_BROADCAST", "NET_ADMIN", "NET_RAW", "IPC_LOCK", "IPC_OWNER",
    "SYS_MODULE", "SYS_RAWIO", "SYS_CHROOT", "SYS_PTRACE", "SYS_PACCT", "SYS_ADMIN", "SYS_BOOT", "SYS_NICE",
    "SYS_RESOURCE", "SYS_TIME", "SYS_TTY_CONFIG", "MKNOD", "LEASE", "AUDIT_WRITE", "AUDIT_CONTROL",
    "SETFCAP", "MAC_OVERRIDE", "MAC_ADMIN", "SYSLOG", "WAKE_ALARM", "BLOCK_SUSPEND", "AUDIT_READ",
)


def compose_service(path: Path = COMPOSE) -> dict[str, Any]:
    """The ``slurm`` service of docker-slurm/compose.yaml."""
    import yaml

    doc = yaml.safe_load(path.read_text())
    service = doc["services"][SERVICE]
    assert isinstance(service, dict), path
    return service


# Every key the service may use, each translated below; any other key fails the tests (a setting
# the tested container would not have).
TRANSLATED = frozenset({"build", "hostname", "extra_hosts", "init", "network_mode", "cgroup", "volumes",
                        "cap_add", "security_opt", "devices", "environment"})


def compose_run_settings(service: dict[str, Any], capabilities: list[str]) -> dict[str, Any]:
    """``containers.run`` keyword arguments for a compose service, as ``docker compose up`` would
    create it; ``build`` is the image's (``cluster_image``). ``cap_add: [ALL]`` becomes
    ``capabilities``, the ones this machine's root has (runc refuses to grant any other)."""
    unknown = set(service) - TRANSLATED
    if unknown:
        raise ValueError(f"compose.yaml: {sorted(unknown)} has no Docker SDK translation here")
    volumes = {}
    for spec in service.get("volumes", []):
        source, target, mode = str(spec).split(":")
        volumes[source] = {"bind": target, "mode": mode}
    caps = [str(c) for c in service.get("cap_add", [])]
    return {
        "hostname": str(service["hostname"]),
        "extra_hosts": dict(str(h).split(":", 1) for h in service.get("extra_hosts", [])),
        "init": bool(service.get("init", False)),
        "network_mode": str(service["network_mode"]),
        "cgroupns": str(service["cgroup"]),
        "volumes": volumes,
        "cap_add": list(capabilities) if caps == ["ALL"] else caps,
        "security_opt": [str(o) for o in service.get("security_opt", [])],
        "devices": [str(d) for d in service.get("devices", [])],
        "environment": {str(k): str(v) for k, v in (service.get("environment") or {}).items()},
    }


@dataclass
class DockerNode:
    """The running container: ``sh`` runs a shell command in it (as root) and returns its output."""

    container: Any
    devices: list[str]

    def run(self, argv: list[str], env: dict[str, str] | None = None, check: bool = True) -> tuple[int, str]:
        code, out = self.container.exec_run(argv, environment=env or {}, demux=False)
        text = out.decode(errors="replace") if out else ""
        if check and code != 0:
            raise RuntimeError(f"in the container, {' '.join(argv)} exited {code}:\n{text}")
        return int(code), text

    def sh(self, script: str, env: dict[str, str] | None = None, check: bool = True) -> str:
        return self.run(["/bin/bash", "-c", script], env=env, check=check)[1]


def _fake_devices(command: str, owner: str, gres_conf: Path | None = None) -> str:
    script = f'. "{FAKE_DEVICES}" && {command} "$1"' + (' "$2"' if gres_conf else "")
    argv = ["/bin/bash", "-c", script, "fake-devices", owner, *([str(gres_conf)] if gres_conf else [])]
    return _run(argv, timeout=60)


@pytest.fixture(scope="module")
def docker_node(cluster_image: BuiltImage, docker_engine: docker.DockerClient) -> Iterator[DockerNode]:
    """The image running as compose.yaml's ``slurm`` service (node ``gpunode``, the DGX H100's fake
    GPUs passed in), with ``sleep`` as its command: the tests start the cluster themselves."""
    settings = compose_run_settings(compose_service(), _capabilities())
    bundle = settings["environment"]["GPUSLURM_BUNDLE"]
    workdir = Path(tempfile.mkdtemp(prefix="gpuslurm-docker-node-"))
    owner = f"docker:{workdir}"
    gres = workdir / "gres.conf"
    _run([sys.executable, "-m", "gpuslurm", "gres-conf", "--from", bundle,
          "--node-name", settings["hostname"], "--output", str(gres)], timeout=60)
    container = None
    try:
        _fake_devices("fake_devices_from_gres", owner, gres)
        devices = [d.split(":")[0] for d in settings["devices"]]
        missing = [d for d in devices if not Path(d).is_char_device()]
        assert not missing, f"compose.yaml passes in {missing}, which fake-devices.sh did not make"
        settings["environment"]["GPUSLURM_CLUSTER_PORT"] = str(PORT)
        container = docker_engine.containers.run(
            cluster_image.tag, ["sleep", "infinity"], name=f"gpuslurm-test-{os.getpid()}", detach=True,
            **settings)
        yield DockerNode(container, devices)
    finally:
        if container is not None:
            try:
                container.exec_run(["/src/gpuslurm/docker-slurm/cluster.sh", "down"])
                container.remove(force=True)
            except Exception as exc:  # teardown goes on: the devices must still be released
                print(f"removing container {container.name}: {exc}", file=sys.stderr)
        _fake_devices("fake_devices_release", owner)
        shutil.rmtree(workdir, ignore_errors=True)
