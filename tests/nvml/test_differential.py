"""gpuslurm live through the real pynvml and the replay NVML library vs ``--from`` the same bundle.

The replay library serves what the bundle says about GPUs; the node's CPUs, NUMA, hostname and
/proc MIG minors still come from this machine, so those fields are left out of the comparison.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest
from tests.nvml.conftest import MakeLiveNode

from gpuslurm.hw.bundle import read_bundle

BUILTIN = Path(__file__).parents[2] / "src" / "gpuslurm" / "hw" / "builtin"
REAL = Path(__file__).parents[3] / "shared" / "fixtures" / "real"
BUNDLES = sorted(p for p in BUILTIN.iterdir() if p.is_dir())
HOST_FIELDS = {"numa_node", "slurm_cores", "os_cpus", "cpu_affinity", "gi_minor", "ci_minor"}


def _strip(value: Any, fields: set[str] = HOST_FIELDS) -> Any:
    if isinstance(value, dict):
        return {k: _strip(v, fields) for k, v in value.items() if k not in fields}
    if isinstance(value, list):
        return [_strip(v, fields) for v in value]
    return value


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
        if bundle.is_dir():
            bundles.append(bundle)
    return bundles


REAL_BUNDLES = _real_bundles()


def _params() -> list[Any]:
    return ([pytest.param(p, id=p.name) for p in BUNDLES]
            + [pytest.param(p, id=f"real-{p.name}") for p in REAL_BUNDLES])


NODE_DUMP = """
import json
from gpuslurm.hw.nvml import NvmlBackend
from gpuslurm.hw.nvml_json import node_to_dict
print(json.dumps(node_to_dict(NvmlBackend().read_node())))
"""


def _loadable(bundle: Path) -> None:
    try:
        read_bundle(bundle)
    except Exception as exc:  # a real capture gpuslurm cannot read is not this test's
        pytest.skip(f"{bundle} does not load: {exc}")


def _mig(bundle: Path) -> bool:
    return any(g.mig_mode for g in read_bundle(bundle).gpus)


BACKEND_WITH_PROC = """
import json, sys
from pathlib import Path
from gpuslurm.hw.nvml import NvmlBackend
from gpuslurm.hw.nvml_json import node_to_dict
print(json.dumps(node_to_dict(NvmlBackend(proc_root=Path(sys.argv[1])).read_node())))
"""


@pytest.mark.parametrize("bundle", _params())
def test_backend_reads_the_bundle(bundle: Path, live_node: MakeLiveNode, tmp_path: Path) -> None:
    _loadable(bundle)
    node = live_node(bundle)
    # the bundle's /proc/driver/nvidia-caps/mig-minors as the backend's /proc: MIG minors compared too
    proc = tmp_path / "proc"
    (proc / "driver" / "nvidia-caps").mkdir(parents=True)
    if (bundle / "mig-minors").exists():
        shutil.copy(bundle / "mig-minors", proc / "driver" / "nvidia-caps" / "mig-minors")
    live = json.loads(node.python(BACKEND_WITH_PROC.replace("sys.argv[1]", repr(str(proc)))))
    from gpuslurm.hw.nvml_json import node_to_dict
    ref = node_to_dict(read_bundle(bundle))
    kept = HOST_FIELDS - {"gi_minor", "ci_minor"}
    assert _strip(live["gpus"], kept) == _strip(ref["gpus"], kept)
    assert live["driver_version"] == ref["driver_version"]
    assert live["cuda_version"] == ref["cuda_version"]
    if not _mig(bundle):  # NVML does not answer NVLink queries in MIG mode
        assert live["links"] == ref["links"]


@pytest.mark.parametrize("bundle", _params())
def test_discover_json(bundle: Path, live_node: MakeLiveNode) -> None:
    _loadable(bundle)
    node = live_node(bundle)
    live = json.loads(node.run("discover", "--json").stdout)
    ref = json.loads(node.run("discover", "--json", "--from", str(bundle)).stdout)
    assert _strip(live["devices"]) == _strip(ref["devices"])


def _matrix(text: str, n: int) -> list[list[str]]:
    rows = [line.split() for line in text.splitlines() if re.match(r"GPU\d+\s", line)]
    return [row[: n + 1] for row in rows[:n]]


@pytest.mark.parametrize("bundle", _params())
def test_topo_links(bundle: Path, live_node: MakeLiveNode) -> None:
    _loadable(bundle)
    if _mig(bundle):
        pytest.skip("NVML does not answer NVLink queries in MIG mode; topo -m text does")
    node = live_node(bundle)
    n = len(read_bundle(bundle).gpus)
    assert _matrix(node.run("topo").stdout, n) == _matrix(node.run("topo", "--from", str(bundle)).stdout, n)


def _gres(text: str) -> list[str]:
    return [re.sub(r" Cores=\S+", "", line) for line in text.splitlines() if line.startswith("Name=")]


@pytest.mark.parametrize("bundle", _params())
def test_gres_conf(bundle: Path, live_node: MakeLiveNode) -> None:
    _loadable(bundle)
    node = live_node(bundle)
    done = node.run("gres-conf", check=False)
    if done.returncode and "has no CPU affinity" in done.stderr:
        # The live path keeps only this machine's online CPUs (sysfs is not replayed yet).
        pytest.skip("the bundle's GPU affinity names no CPU online on this machine")
    if done.returncode and "has no capability minors" in done.stderr:
        # MIG device files: the live path reads this machine's /proc/driver/nvidia-caps/mig-minors
        pytest.skip("the MIG devices' minors come from this machine's /proc, which has none")
    assert done.returncode == 0, done.stderr
    replayed = node.run("gres-conf", "--from", str(bundle), check=False)
    if replayed.returncode:
        pytest.skip(f"gres-conf --from this bundle fails too: {replayed.stderr.strip()[:200]}")
    live, ref = done.stdout, replayed.stdout
    if _mig(bundle):
        # MIG: no NVLink answers live (Links differ) and MIG files need /proc's minors
        live_types = [re.search(r"Type=(\S+)", x) for x in _gres(live)]
        ref_types = [re.search(r"Type=(\S+)", x) for x in _gres(ref)]
        assert [m.group(1) for m in live_types if m] == [m.group(1) for m in ref_types if m]
        return
    assert _gres(live) == _gres(ref)


@pytest.mark.parametrize("bundle", _params())
def test_status_json(bundle: Path, live_node: MakeLiveNode) -> None:
    _loadable(bundle)
    node = live_node(bundle)
    live = json.loads(node.run("status", "--json").stdout)
    ref = json.loads(node.run("status", "--json", "--from", str(bundle)).stdout)
    assert _strip(live["gpus"]) == _strip(ref["gpus"])


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
