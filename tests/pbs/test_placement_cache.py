"""execjob_begin's cache of the replayed node with its links (``<run_dir>/cache/node-placement.json``),
attacked: by an ordinary user (``nobody``, real processes) where an admin left the cache directory
or the run directory open to others, and by corruption of root's own file (forged values, wrong
shapes, deep nesting). Each time the hook ranks GPUs by the bundle's truth, parsed again, and a
lie is never used. Also what a warm begin process imports (its start-up cost:
benchmarks/README.md, bench_pbs_begin.py).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from tests.helpers.cluster_fixture import users_site

from gpuslurm.hooks import cache
from gpuslurm.hooks.cache import PLACEMENT_FILE
from gpuslurm.hw.model.node import Node
from gpuslurm.hw.source import hardware_source, load_node
from gpuslurm.pbs.entry import CODE

NOBODY = 65534
pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="plays root and nobody; the job map is root's")


def placement_node_of(bundle: str, run_dir: str, warn: cache.Warn | None = None) -> Node:
    return cache.placement_node(hardware_source(bundle), run_dir, warn)


@pytest.fixture
def site() -> Iterator[Path]:
    # in /tmp: nobody can reach it, and run users-venv's python with this checkout's gpuslurm
    with users_site("gpuslurm-placement-cache-") as base:
        (base / "run").mkdir(mode=0o755)
        yield base


def _as_nobody(base: Path, code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(base / "users-venv" / "bin" / "python"), "-c", code], user=NOBODY,
                          group=NOBODY, extra_groups=[], timeout=60, cwd="/", env={"PATH": "/usr/bin:/bin"},
                          capture_output=True, text=True, check=False)


def _lie(doc: dict[str, Any]) -> None:
    """A forgery that would move jobs: every link NV18, the GPUs' UUIDs swapped pairwise."""
    node = doc["node"]
    node[3] = [[["NV", 18] for _ in row] for row in node[3]]
    for a, b in zip(node[1][0::2], node[1][1::2], strict=True):
        a[0], b[0] = b[0], a[0]


def _cache(base: Path) -> Path:
    return base / "run" / "cache" / PLACEMENT_FILE


def test_root_makes_it_private_and_nobody_cannot_touch_it(site: Path) -> None:
    truth = load_node(str(site / "bundle"))
    assert placement_node_of(str(site / "bundle"), str(site / "run")) == truth
    cache = _cache(site)
    assert (cache.stat().st_mode & 0o777, cache.parent.stat().st_mode & 0o777) == (0o600, 0o700)
    for code in (f"open({str(cache)!r}, 'w')", f"open({str(cache.parent / 'x')!r}, 'w')",
                 f"open({str(cache)!r}).read()"):
        denied = _as_nobody(site, code)
        assert denied.returncode != 0 and "PermissionError" in denied.stderr, denied.stderr


def test_a_forgery_in_a_cache_directory_left_open_is_not_used(site: Path) -> None:
    """An admin's chmod left root's cache directory writable by all: nobody replaces the file
    with a lie under the right key. Root refuses the directory, parses the bundle, writes nothing."""
    bundle, run = str(site / "bundle"), str(site / "run")
    truth = placement_node_of(bundle, run)
    cache = _cache(site)
    cache.parent.chmod(0o777)
    doc = json.loads(cache.read_text())
    _lie(doc)
    planted = _as_nobody(site, f"import json, os; p={str(cache)!r}; open(p + '.new', 'w').write("
                               f"{json.dumps(doc)!r}); os.replace(p + '.new', p)")
    assert planted.returncode == 0, planted.stderr
    assert cache.stat().st_uid == NOBODY
    said: list[str] = []
    assert placement_node_of(bundle, run, said.append) == truth
    assert any("cache not used" in line for line in said), said
    assert cache.stat().st_uid == NOBODY and json.loads(cache.read_text()) == doc  # root wrote nothing there


def test_a_cache_directory_a_user_made_is_not_used(site: Path) -> None:
    """The run directory itself was left open (1777): nobody makes ``cache/`` first, with a lying
    node under the right key. Root neither reads nor writes through it."""
    bundle, run = str(site / "bundle"), str(site / "run")
    truth = load_node(bundle)
    scratch = site / "scratch"
    scratch.mkdir(mode=0o700)
    placement_node_of(bundle, str(scratch))  # the right key and layout, to forge from
    doc = json.loads((scratch / "cache" / PLACEMENT_FILE).read_text())
    _lie(doc)
    (site / "run").chmod(0o1777)
    planted = _as_nobody(site, f"import os; d={str(site / 'run' / 'cache')!r}; os.mkdir(d, 0o755); "
                               f"open(d + '/{PLACEMENT_FILE}', 'w').write({json.dumps(doc)!r})")
    assert planted.returncode == 0, planted.stderr
    said: list[str] = []
    assert placement_node_of(bundle, run, said.append) == truth
    assert any("cache not used" in line for line in said), said
    assert json.loads(_cache(site).read_text()) == doc and _cache(site).stat().st_uid == NOBODY


def _set(path: list[Any], value: Any) -> Callable[[Any], None]:
    def mutate(node: Any) -> None:
        target = node
        for key in path[:-1]:
            target = target[key]
        target[path[-1]] = value
    return mutate


MUTATIONS: dict[str, Callable[[Any], None]] = {
    "index not a number": _set([1, 0, 1], "0"),
    "index a boolean": _set([1, 1, 1], True),
    "index a float": _set([1, 0, 1], 0.0),
    "index negative": _set([1, 0, 1], -1),
    "index huge": _set([1, 0, 1], 10**30),
    "minor past 20 bits": _set([1, 0, 2], 1 << 20),
    "memory NaN": _set([1, 0, 5], float("nan")),
    "affinity out of range": _set([1, 0, 7], [0, 1 << 16]),
    "two GPUs, one UUID": lambda node: _set([1, 1, 0], node[1][0][0])(node),
    "two GPUs, one index": _set([1, 1, 1], 0),
    "two GPUs, one minor": _set([1, 1, 2], 0),
    "mig_mode a number": _set([1, 0, 8], 1),
    "a CPU socket negative": _set([2, 0, 2], -1),
    "a CPU with three fields": _set([2, 0], [0, 0, 0]),
    "links one row short": lambda node: node[3].pop(),
    "links a row one short": lambda node: node[3][2].pop(),
    "links an unknown kind": _set([3, 0, 1], ["WIRE", 0]),
    "links a negative NVLink count": _set([3, 0, 1], ["NV", -4]),
    "host memory negative": _set([6], -1),
    "hostname a list": _set([0], ["pbshost"]),
    "a field too many": lambda node: node.append(None),
    "the node an object": lambda node: node.clear() or node.extend([{"hostname": "x"}] * 9),
}


@pytest.mark.parametrize("what", sorted(MUTATIONS))
def test_a_corrupt_cache_is_parsed_again_and_replaced(site: Path, what: str) -> None:
    bundle, run = str(site / "bundle"), str(site / "run")
    truth = placement_node_of(bundle, run)
    cache = _cache(site)
    good = json.loads(cache.read_text())
    bad = json.loads(cache.read_text())
    MUTATIONS[what](bad["node"])
    assert json.dumps(bad) != json.dumps(good)  # (True == 1 and 0.0 == 0 in Python)
    cache.write_text(json.dumps(bad))
    assert placement_node_of(bundle, run) == truth
    assert json.loads(cache.read_text()) == good


@pytest.mark.parametrize("text", ["[" * 100_000, "not json", '{"format": 1}', "", "\xff"])
def test_an_unreadable_cache_is_parsed_again(site: Path, text: str) -> None:
    bundle, run = str(site / "bundle"), str(site / "run")
    truth = placement_node_of(bundle, run)
    cache = _cache(site)
    good = cache.read_text()
    cache.write_text(text, encoding="latin-1")
    assert placement_node_of(bundle, run) == truth
    assert cache.read_text() == good


def test_a_warm_begin_process_loads_nothing_heavy(site: Path) -> None:
    """The hook's gpuslurm process (``python -I -c CODE execjob_begin``, the request on stdin) with
    its caches warm: none of the modules that made it 4x an interpreter start, and its garbage
    collector is off (what each costs: benchmarks/README.md)."""
    config = site / "gpuslurm.toml"
    config.write_text(f'[paths]\nrun_dir = "{site / "run"}"\nstate_dir = "{site / "state"}"\n'
                      f'cgroup_root = "{site / "no-cgroup"}"\n')
    env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8", "GPUSLURM_CONFIG": str(config),
           "GPUSLURM_CAPTURE": str(site / "bundle")}
    src = str(Path(__file__).resolve().parents[2] / "src")
    report = ("import atexit, gc, sys; atexit.register(lambda: print('REPORT', gc.isenabled(), "
              "' '.join(sorted(sys.modules)), file=sys.stderr)); ")
    code = f"import sys; sys.path.insert(0, {src!r}); " + report + CODE
    for job in ("1.pbshost", "2.pbshost"):  # the first fills the caches
        request = {"format": 1, "event": "execjob_begin", "hostname": "pbshost", "job_id": job,
                   "euser": "root", "exec_vnode": "(pbshost[0]:ncpus=4:ngpus=4)",
                   "exec_host": "pbshost/0*4", "vnodes": ["pbshost[0]"], "pbs_cgroups": False}
        run = subprocess.run([sys.executable, "-I", "-c", code, "execjob_begin"], env=env,
                             input=json.dumps(request), capture_output=True, text=True, timeout=60,
                             check=False)
        assert run.returncode == 0 and json.loads(run.stdout) == {"format": 1, "accept": True}, run.stderr
        subprocess.run([sys.executable, "-I", "-c", code.replace("execjob_begin", "execjob_end"),
                        "execjob_end"], env=env, input=json.dumps({**request, "event": "execjob_end"}),
                       capture_output=True, text=True, timeout=60, check=True)
    [line] = [x for x in run.stderr.splitlines() if x.startswith("REPORT ")]
    _, enabled, *modules = line.split()
    assert enabled == "False"
    for heavy in ("typing", "dataclasses", "inspect", "contextlib", "pathlib", "tomllib", "subprocess",
                  "xml", "math", "gpuslurm.hw.formats.nvml_json", "gpuslurm.hw.replay.bundle",
                  "gpuslurm.names",
                  "gpuslurm.cli.main"):
        assert heavy not in modules, heavy
    assert "gpuslurm.place.engine" in modules  # it did choose, with the engine
