"""gpuslurm live through the real pynvml and the replay NVML library vs ``--from`` the same bundle.

The replay library serves what the bundle says about GPUs. What gpuslurm reads from the kernel
(CPUs, cores, sockets and NUMA nodes under /sys, a GPU's PCI NUMA node, /proc's MIG minors) is the
bundle's too: the live command runs in a mount namespace where the bundle's facts are mounted over
this machine's (:func:`run_as_bundle_host`), so every field is compared, on any machine, with no
skip. What cannot run here fails (``_unavailable``: a skip only outside CI).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest
from tests.nvml.conftest import LiveNode, MakeLiveNode, _unavailable

from gpuslurm.hw.replay.bundle import read_bundle

BUILTIN = Path(__file__).parents[2] / "src" / "gpuslurm" / "hw" / "builtin"
REAL = Path(__file__).parents[3] / "shared" / "fixtures" / "real"
BUNDLES = sorted(p for p in BUILTIN.iterdir() if p.is_dir())
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


def _params() -> list[Any]:
    return ([pytest.param(p, id=p.name) for p in BUNDLES]
            + [pytest.param(p, id=f"real-{p.name}") for p in REAL_BUNDLES])


NODE_DUMP = """
import json
from gpuslurm.hw.live.nvml import NvmlBackend
from gpuslurm.hw.formats.nvml_json import node_to_dict
print(json.dumps(node_to_dict(NvmlBackend().read_node())))
"""


def _loadable(bundle: Path) -> None:
    read_bundle(bundle)  # every built-in bundle and imported real capture must load (no skip)


def _mig(bundle: Path) -> bool:
    return any(g.mig_mode for g in read_bundle(bundle).gpus)


@pytest.mark.parametrize("bundle", _params())
def test_backend_reads_the_bundle(bundle: Path, live_node: MakeLiveNode, tmp_path: Path) -> None:
    """The whole model live on the bundle's host facts: GPUs with CPU affinity, NUMA nodes and MIG
    minors, the link matrix (MIG bundles too), CPUs, versions."""
    _loadable(bundle)
    node = live_node(bundle)
    done = run_as_bundle_host(node, tmp_path / "host", code=NODE_DUMP)
    assert done.returncode == 0, done.stderr
    live = json.loads(done.stdout)
    from gpuslurm.hw.formats.nvml_json import node_to_dict
    ref = node_to_dict(read_bundle(bundle))
    for key in ("gpus", "links", "cpus", "driver_version", "cuda_version"):
        assert live[key] == ref[key], key


@pytest.mark.parametrize("bundle", _params())
def test_discover_json(bundle: Path, live_node: MakeLiveNode, tmp_path: Path) -> None:
    _loadable(bundle)
    node = live_node(bundle)
    done = run_as_bundle_host(node, tmp_path / "host", "discover", "--json")
    assert done.returncode == 0, done.stderr
    live = json.loads(done.stdout)
    ref = json.loads(node.run("discover", "--json", "--from", str(bundle)).stdout)
    assert live["devices"] == ref["devices"]  # affinity, Slurm cores, NUMA and MIG minors too


@pytest.mark.parametrize("bundle", _params())
def test_topo_links(bundle: Path, live_node: MakeLiveNode, tmp_path: Path) -> None:
    """The whole table (links, CPU affinity, Slurm cores, NUMA) live on the bundle's host facts;
    in MIG mode too: a GPU there answers no NVLink query, its peers' answers count."""
    _loadable(bundle)
    node = live_node(bundle)
    n = len(read_bundle(bundle).gpus)
    live = run_as_bundle_host(node, tmp_path / "host", "topo")
    assert live.returncode == 0, live.stderr
    want = node.run("topo", "--from", str(bundle)).stdout
    assert _table(live.stdout, n) == _table(want, n)


def _table(text: str, n: int) -> list[list[str]]:
    return [line.split() for line in text.splitlines() if re.match(r"GPU\d+\s", line)][:n]


def _gres(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("Name=")]


@pytest.mark.parametrize("bundle", _params())
def test_gres_conf(bundle: Path, live_node: MakeLiveNode, tmp_path: Path) -> None:
    """Every line, Cores= and MIG device files included, live on the bundle's host facts. A
    capture without lscpu.csv knows no CPUs: both ways refuse it alike."""
    _loadable(bundle)
    node = live_node(bundle)
    live = run_as_bundle_host(node, tmp_path / "host", "gres-conf")
    replayed = node.run("gres-conf", "--from", str(bundle), check=False)
    if not read_bundle(bundle).cpus:
        assert (live.returncode, replayed.returncode) == (2, 2), live.stderr + replayed.stderr
        assert "no CPUs are known" in replayed.stderr and "no CPUs are known" in live.stderr
        return
    assert live.returncode == 0, live.stderr
    assert replayed.returncode == 0, replayed.stderr
    assert _gres(live.stdout) == _gres(replayed.stdout)


@pytest.mark.parametrize("bundle", _params())
def test_status_json(bundle: Path, live_node: MakeLiveNode, tmp_path: Path) -> None:
    _loadable(bundle)
    node = live_node(bundle)
    done = run_as_bundle_host(node, tmp_path / "host", "status", "--json")
    assert done.returncode == 0, done.stderr
    live = json.loads(done.stdout)
    ref = json.loads(node.run("status", "--json", "--from", str(bundle)).stdout)
    assert live["gpus"] == ref["gpus"]


@pytest.mark.parametrize("bundle", _params())
def test_monitor_once(bundle: Path, live_node: MakeLiveNode, tmp_path: Path) -> None:
    _loadable(bundle)
    node = live_node(bundle)
    done = node.run("monitor", "--once", "--json", "--db", str(tmp_path / "live.db"), check=False)
    assert done.returncode == 0, done.stderr + (node.log.read_text() if node.log.exists() else "")
    replayed = node.run("monitor", "--once", "--json", "--db", str(tmp_path / "ref.db"),
                        "--from", str(bundle))

    def devices(text: str) -> list[dict[str, Any]]:
        return [{k: v for k, v in g.items() if k != "ts"} for g in json.loads(text.splitlines()[0])["gpus"]]
    assert devices(done.stdout) == devices(replayed.stdout)
