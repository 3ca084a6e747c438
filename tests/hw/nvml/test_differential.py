"""gpuslurm live through the real pynvml and the replay NVML library vs ``--from`` the same bundle.

The replay library serves what the bundle says about GPUs. What gpuslurm reads from the kernel
(CPUs, cores, sockets and NUMA nodes under /sys, a GPU's PCI NUMA node, /proc's MIG minors) is the
bundle's too: the live command runs in a mount namespace where the bundle's facts are mounted over
this machine's (:func:`run_as_bundle_host`), so every field is compared, on any machine, with no
skip. What cannot run here fails (``_unavailable``: a skip only outside CI).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from tests.helpers.nvml_replay import (
    NODE_DUMP,
    REAL_BUNDLES,
    MakeLiveNode,
    run_as_bundle_host,
)

from gpuslurm.hw.replay.bundle import read_bundle

BUILTIN = Path(__file__).parents[3] / "src" / "gpuslurm" / "hw" / "builtin"
BUNDLES = sorted(p for p in BUILTIN.iterdir() if p.is_dir())


def _params() -> list[Any]:
    return ([pytest.param(p, id=p.name) for p in BUNDLES]
            + [pytest.param(p, id=f"real-{p.name}") for p in REAL_BUNDLES])


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
