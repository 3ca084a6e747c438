"""Builds the replay libnvidia-ml.so.1 (libnvml_replay.c) once per session and runs gpuslurm on it."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import pytest
from tests.helpers.scheduler_stand_in import no_jobs_config

from gpuslurm.hw.formats.scenario import parse_scenario
from gpuslurm.hw.replay.bundle import read_bundle, read_captured_state
from gpuslurm.hw.replay.health import read_scenario
from gpuslurm.hw.replay.nvml_replay import dump_replay
from gpuslurm.hw.replay.scenario import scenario_path

HERE = Path(__file__).resolve().parents[1] / "hw" / "nvml"  # the C sources of the replay library
SOURCE = HERE / "libnvml_replay.c"
SOURCES = (SOURCE, HERE / "replay_events.c")  # the second is #included by the first
REQUIRED = bool(os.environ.get("CI") or os.environ.get("GPUSLURM_REQUIRE_NVML_REPLAY"))


def _unavailable(reason: str) -> None:
    if REQUIRED:
        pytest.fail(f"the replay NVML library must build here: {reason}")
    pytest.skip(reason)


def nvml_header_dir() -> Path | None:
    """The include directory of NVIDIA's nvml.h from the nvidia-nvml-dev wheel."""
    site = Path(sysconfig.get_paths()["purelib"]) / "nvidia"
    for header in sorted(site.rglob("include/nvml.h")):
        return header.parent
    return None


def exported_symbols() -> list[str]:
    """Every NVML entry point libnvml_replay.c defines."""
    text = "".join(source.read_text() for source in SOURCES)
    return sorted(set(re.findall(r"^(?:nvmlReturn_t|const char \*)\s*(nvml\w+)\(", text, re.M)))


SANITIZE = ["-g", "-fsanitize=address,undefined", "-fno-sanitize-recover=all"]


def _build(gcc: str, include: Path, out: Path, hidden: frozenset[str] = frozenset(),
           sanitize: bool = False, baked: str | None = None) -> Path:
    """Compile into ``out``; symbols in ``hidden`` are left out of the dynamic symbol table;
    ``baked``: the nvml.json served when ``GPUSLURM_NVML_REPLAY`` is not set."""
    out.mkdir(parents=True, exist_ok=True)
    script = out / "symbols.map"
    exported = [s for s in exported_symbols() if s not in hidden]
    script.write_text("{\n  global:\n" + "".join(f"    {s};\n" for s in exported) + "  local: *;\n};\n")
    cmd = [gcc, "-std=gnu11", "-Wall", "-Wextra", "-Werror", "-O1", "-fPIC", "-shared",
           *(SANITIZE if sanitize else []),
           *([f'-DGPUSLURM_NVML_REPLAY_PATH="{baked}"'] if baked else []),
           f"-I{include}", "-o", str(out / "libnvidia-ml.so.1"), str(SOURCE), "-lcjson", "-lm",
           "-Wl,-soname,libnvidia-ml.so.1", f"-Wl,--version-script={script}"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)
    if done.returncode:
        pytest.fail(f"building the replay NVML library failed:\n{done.stderr}")
    return out


@dataclass(frozen=True)
class ReplayLib:
    directory: Path  # holds libnvidia-ml.so.1
    gcc: str = "gcc"
    include: Path = Path()
    hidden: frozenset[str] = frozenset()
    asan: str | None = None  # the libasan to preload: a build with AddressSanitizer and UBSan
    baked: str | None = None  # the nvml.json served without GPUSLURM_NVML_REPLAY (checked as root's)

    def _variant(self, hidden: frozenset[str], asan: str | None, baked: str | None = None) -> ReplayLib:
        key = ",".join(sorted(hidden)) + f"|{bool(asan)}|{baked or ''}"
        tag = hashlib.sha256(key.encode()).hexdigest()[:12]
        out = self.directory.parent / f"{self.directory.name.split('-v-')[0]}-v-{tag}"
        if not (out / "libnvidia-ml.so.1").exists():
            _build(self.gcc, self.include, out, hidden, sanitize=asan is not None, baked=baked)
        return ReplayLib(out, self.gcc, self.include, hidden, asan, baked)

    def without(self, *symbols: str) -> ReplayLib:
        """This library lacking ``symbols`` as well (pynvml: FUNCTION_NOT_FOUND); built once."""
        hidden = self.hidden | frozenset(symbols)
        return self if hidden == self.hidden else self._variant(hidden, self.asan, self.baked)

    def serving(self, nvml_json: Path) -> ReplayLib:
        """This library with ``nvml_json``'s path baked in: it serves that file to a process given
        no environment (a hook run by slurmd), after checking it as root's file (no symlink, root's
        or ours, not writable by others, nor any directory on the way)."""
        path = str(nvml_json)
        assert nvml_json.is_absolute() and not set('"\\\n') & set(path), path  # a C string literal
        return self._variant(self.hidden, self.asan, path)

    def sanitized(self) -> ReplayLib:
        """This library built with AddressSanitizer and UBSan (a memory error aborts the process)."""
        found = subprocess.run([self.gcc, "-print-file-name=libasan.so"], capture_output=True, text=True,
                               check=False).stdout.strip()
        if not found or not Path(found).is_file():
            _unavailable("gcc's libasan is not installed")
        return self if self.asan else self._variant(self.hidden, str(Path(found).resolve()), self.baked)

    def env(self, nvml_json: Path, log: Path) -> dict[str, str]:
        env = dict(os.environ)
        env.update(LD_LIBRARY_PATH=str(self.directory), GPUSLURM_NVML_REPLAY=str(nvml_json),
                   GPUSLURM_NVML_REPLAY_LOG=str(log))
        env.pop("GPUSLURM_CAPTURE", None)
        if self.asan:
            env.update(LD_PRELOAD=self.asan, ASAN_OPTIONS="detect_leaks=0:abort_on_error=1")
        return env


@pytest.fixture(scope="session")
def replay_lib(tmp_path_factory: pytest.TempPathFactory) -> ReplayLib:
    gcc = shutil.which("gcc")
    if gcc is None:
        _unavailable("gcc is not installed")
    include = nvml_header_dir()
    if include is None:
        _unavailable("NVIDIA's nvml.h is absent (pip install nvidia-nvml-dev, the test extra)")
    if not Path("/usr/include/cjson/cJSON.h").exists():
        _unavailable("libcjson-dev is not installed")
    assert gcc is not None and include is not None
    text = b"".join(s.read_bytes() for s in SOURCES)
    digest = hashlib.sha256(text + str(include).encode()).hexdigest()[:16]
    out = _build(gcc, include, tmp_path_factory.mktemp(f"nvml-{digest}"))
    return ReplayLib(out, gcc, include)


@dataclass(frozen=True)
class LiveNode:
    """A bundle served by the replay library: run gpuslurm as if on that node."""

    lib: ReplayLib
    bundle: Path
    nvml_json: Path
    log: Path
    config: Path  # the node's own config (scheduler_stand_in: no host's squeue); extra_env may name another

    def env(self) -> dict[str, str]:
        return {**self.lib.env(self.nvml_json, self.log), "GPUSLURM_CONFIG": str(self.config)}

    def run(self, *args: str, check: bool = True,
            extra_env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        done = subprocess.run([sys.executable, "-m", "gpuslurm.cli.main", *args], capture_output=True,
                              text=True, timeout=120, check=False, env={**self.env(), **(extra_env or {})})
        if check and done.returncode:
            raise AssertionError(f"gpuslurm {' '.join(args)} exit {done.returncode}:\n{done.stderr}"
                                 f"\nlibrary log: {self.log.read_text() if self.log.exists() else ''}")
        return done

    def python(self, code: str) -> str:
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                              check=False, env=self.env())
        assert done.returncode == 0, done.stderr
        return done.stdout


PROCESS_V3 = ("nvmlDeviceGetComputeRunningProcesses_v3", "nvmlDeviceGetGraphicsRunningProcesses_v3")


def driver_lacks(version: str | None) -> frozenset[str]:
    """The entry points the library defines that a driver of ``version`` does not export.

    From the prototypes in nvml.h of NVIDIA's nvidia-settings releases (one per driver release,
    ``src/nvml.h`` at each tag), which nvitop's probes of the process queries agree with:
    R510 added the ``_v3`` process queries and memory info ``_v2``; R535 added confidential
    computing (``nvmlDeviceGetConfComputeMemSizeInfo``) and the clocks "event" names, and until
    535.86 declared a 32-byte struct behind ``_v3``; 535.98 dropped the ``_v3`` queries; 535.104
    brought them back with the 24-byte struct and added ``nvmlDeviceGetRunningProcessDetailList``
    (whose ``nvmlProcessDetail_v1_t`` carries ``usedGpuCcProtectedMemory`` now). R545 (545.23.06,
    545.29.x) declares the same process and memory entry points as 535.104 and later; what it adds
    for gpuslurm's calls is version 3 of the MIG profile-info structs, a struct version the library
    checks itself (tests/hw/nvml/test_r545.py). No version: every entry point.
    """
    if version is None:
        return frozenset()
    major, minor = (int(x) for x in re.findall(r"\d+", version)[:2])
    lacks: set[str] = set()
    late_535 = major > 535 or (major == 535 and minor >= 104)
    if not late_535:
        lacks.add("nvmlDeviceGetRunningProcessDetailList")
    if major < 535:
        lacks.update(("nvmlDeviceGetConfComputeMemSizeInfo", "nvmlDeviceGetCurrentClocksEventReasons"))
    if major < 510 or (major == 535 and 98 <= minor < 104):
        lacks.update(PROCESS_V3)
    if major < 510:
        lacks.add("nvmlDeviceGetMemoryInfo_v2")
    if major < 450:  # R450 added _v2 with the instance ids in nvmlEventData_t (replay_events.c)
        lacks.add("nvmlEventSetWait_v2")
    return frozenset(lacks)


class MakeLiveNode(Protocol):
    def __call__(self, bundle: Path, *, driver_version: str | None = None, privileged: bool = True,
                 processes: dict[int, list[tuple[int, int | None]]] | None = None,
                 reserved_mib: dict[int, int] | None = None) -> LiveNode: ...


@pytest.fixture
def live_node(replay_lib: ReplayLib, tmp_path: Path) -> MakeLiveNode:
    """A bundle served by the library built with the symbol set of its driver version.

    The bundle's ``health.json`` and ``scenario.json`` (``$GPUSLURM_SCENARIO`` first, as for
    ``--from``) are served too, so live and replayed runs see the same node.
    """
    def make(bundle: Path, *, driver_version: str | None = None, privileged: bool = True,
             processes: dict[int, list[tuple[int, int | None]]] | None = None,
             reserved_mib: dict[int, int] | None = None) -> LiveNode:
        model = read_bundle(bundle)
        version = driver_version or model.driver_version
        health = read_scenario(bundle / "health.json", [g.uuid for g in model.gpus])
        if processes is None:  # health.json's processes are what NVML lists at the time
            processes = {g.index: [(p.pid, p.used_mib) for p in health[g.uuid].processes or ()]
                         for g in model.gpus}
        scenario, start = None, 0.0
        found = scenario_path(bundle)
        if found is not None:
            scenario = parse_scenario(found.read_text(), str(found), model)
            start = scenario.start if scenario.start is not None else found.stat().st_mtime
        nvml_json = tmp_path / f"{bundle.name}.nvml.json"
        nvml_json.write_text(dump_replay(model, driver_version=driver_version, privileged=privileged,
                                         processes=processes, health=health, reserved_mib=reserved_mib,
                                         scenario=scenario, start=start,
                                         captured=read_captured_state(bundle, model)))
        lib = replay_lib.without(*driver_lacks(version))
        config = no_jobs_config(tmp_path / f"{bundle.name}-site")
        return LiveNode(lib, bundle, nvml_json, tmp_path / f"{bundle.name}.log", config)
    return make


LATER = 600  # seconds between the two steps of scenario_bundle's scenario


def scenario_bundle(tmp_path: Path, source: Path) -> Path:
    """A copy of ``source`` with a scenario.json: busy GPUs and processes now, others in ten minutes."""
    bundle = tmp_path / source.name
    shutil.copytree(source, bundle)
    gpus = read_bundle(bundle).gpus
    plain = [g.uuid for g in gpus if not g.mig_mode]  # in MIG mode processes run on MIG devices
    g0, g1 = plain[0], plain[1 % len(plain)]
    mig = next((m.uuid for g in gpus for m in g.mig_devices if m.uuid), None)
    first: dict[str, Any] = {
        "at": 0, "gpus": {g0: {"util": 90, "mem_mib": 30000, "power_w": 300, "temp_c": 61}},
        "procs": [{"pid": os.getpid(), "gpu": g0, "mem_mib": 5000, "sm": 80},
                  {"pid": 1, "gpu": g1, "mem_mib": 700}]}
    if mig is not None:  # its "sm" is not reported: NVML has none on a GPU in MIG mode
        first["procs"].append({"pid": os.getppid(), "gpu": mig, "mem_mib": 1234, "sm": 40})
    second: dict[str, Any] = {"at": LATER, "gpus": {g1: {"util": 50, "temp_c": 45}},
                              "procs": [{"pid": 1, "gpu": g1, "mem_mib": 2500, "sm": 55}]}
    if len(gpus) > 2:
        second["gpus"][gpus[2].uuid] = {"lost": True}
    # the first step began 30 s ago, the second begins in ten minutes
    (bundle / "scenario.json").write_text(json.dumps({"start": time.time() - 30, "steps": [first, second]}))
    return bundle



def read_json(text: str) -> object:
    return json.loads(text)


REAL = Path(__file__).parents[3] / "shared" / "fixtures" / "real"


def _real_bundles() -> list[Path]:
    """The real multi-command captures in ../shared, imported once into bundles."""
    multi = REAL / "multi"
    if not multi.is_dir():
        return []
    out = Path(tempfile.gettempdir()) / f"gpuslurm-real-bundles-{os.getuid()}"
    bundles = []
    for capture in sorted(multi.glob("*.txt")):
        bundle = out / capture.stem
        if not bundle.is_dir():
            subprocess.run([sys.executable, "-m", "gpuslurm.cli.main", "capture", "import", str(capture),
                            str(bundle)], capture_output=True, timeout=120, check=False)
        bundles.append(bundle)  # an import that failed fails the tests, it does not drop the capture
    return bundles


REAL_BUNDLES = _real_bundles()


def host_tree(bundle: Path, root: Path) -> dict[str, Path]:
    """The bundle's own host facts as the kernel shows them: ``lscpu.csv``'s CPUs, cores, sockets
    and NUMA nodes under ``devices/system/{cpu,node}``, each GPU's NUMA node under
    ``bus/pci/devices``, and ``mig-minors`` under ``driver/nvidia-caps``. Keys: the paths of this
    machine they stand for (:func:`run_as_bundle_host` mounts them there)."""
    model = read_bundle(bundle)
    cpu, node, pci, driver = (root / d for d in ("cpu", "node", "pci", "driver"))
    for d in (cpu, node, pci, driver / "nvidia-caps"):
        d.mkdir(parents=True)
    numa: dict[int, list[int]] = {}
    for c in model.cpus:
        topo = cpu / f"cpu{c.os_id}" / "topology"
        topo.mkdir(parents=True)
        (topo.parent / "online").write_text("1\n")
        (topo / "core_id").write_text(f"{c.core}\n")
        (topo / "physical_package_id").write_text(f"{c.socket}\n")
        if c.numa_node is not None:
            numa.setdefault(c.numa_node, []).append(c.os_id)
    for n, ids in numa.items():
        (node / f"node{n}").mkdir()
        (node / f"node{n}" / "cpulist").write_text(",".join(map(str, ids)) + "\n")
    for g in model.gpus:
        domain, bus, devfn = g.bus_id.split(":")
        d = pci / f"{int(domain, 16):04x}:{bus.lower()}:{devfn.lower()}"
        d.mkdir()
        (d / "numa_node").write_text(f"{-1 if g.numa_node is None else g.numa_node}\n")
    if (bundle / "mig-minors").exists():
        shutil.copy(bundle / "mig-minors", driver / "nvidia-caps" / "mig-minors")
    return {"/sys/devices/system/cpu": cpu, "/sys/devices/system/node": node,
            "/sys/bus/pci/devices": pci, "/proc/driver": driver}


def run_as_bundle_host(node: LiveNode, root: Path, *args: str,
                       code: str | None = None) -> subprocess.CompletedProcess[str]:
    """``gpuslurm *args`` (or Python ``code``) live, in a mount namespace of its own where
    :func:`host_tree`'s directories are this machine's (bind mounts, gone with the process): the
    command as it is, seeing the bundle's CPUs, NUMA nodes and MIG minors instead of this machine's."""
    binds = host_tree(node.bundle, root)
    script = " && ".join(f"mount --bind {shlex.quote(str(src))} {shlex.quote(dst)}"
                         for dst, src in binds.items())
    unshare = ["unshare", "--mount", "--propagation", "private"]
    if os.geteuid() != 0:
        unshare.append("--map-root-user")
    command = [sys.executable, "-c", code] if code is not None else [
        sys.executable, "-m", "gpuslurm.cli.main", *args]
    argv = [*unshare, "/bin/sh", "-c", script + ' && exec "$@"', "sh", *command]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False,
                          env=node.env())
    if done.returncode and done.stderr.startswith(("unshare:", "mount:")):  # before gpuslurm ran
        _unavailable(f"no mount namespace of our own here: {done.stderr.strip()[:200]}")
    return done


NODE_DUMP = """
import json
from gpuslurm.hw.live.nvml import NvmlBackend
from gpuslurm.hw.formats.nvml_json import node_to_dict
print(json.dumps(node_to_dict(NvmlBackend().read_node())))
"""


BUILTIN = Path(__file__).parents[2] / "src" / "gpuslurm" / "hw" / "builtin"


def scenario_copy(
    tmp_path: Path, source: Path, steps: list[dict[str, Any]], start: float | None = None
) -> Path:
    bundle = tmp_path / source.name
    if bundle.exists():
        shutil.rmtree(bundle)
    shutil.copytree(source, bundle)
    (bundle / "scenario.json").write_text(
        json.dumps({"start": time.time() if start is None else start, "steps": steps})
    )
    return bundle
