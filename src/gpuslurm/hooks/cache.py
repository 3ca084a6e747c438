"""What the root hooks keep between runs: the parsed config, and a replayed node.

Both are small JSON files in ``<run_dir>/cache/`` (root's, 0600), written atomically and read
back only through :mod:`gpuslurm.state.jobmap`'s checked file access (no symlinks, owner and
mode verified). Either one missing, stale, unreadable or unsafe means doing the work again and
rewriting the file; a cache that cannot be written only costs time. The task prolog runs as the
job's user and uses neither.

``config.json``: importing ``tomllib`` costs a hook more than reading everything else it needs.
The file keeps the config text with its parsed document and is used only when that text is
exactly the text read now, so it never stands for an edited file. It has to be found before the
config is parsed, so its directory comes from the ``run_dir = "..."`` line of ``[paths]`` when
there is one (the default run_dir otherwise); it is only written when the parse confirms that
run_dir, so a config that spells run_dir another way is simply parsed every time.

``node-placement.json``: the same for the whole replayed node with its link matrix and CPUs
(:func:`placement_node`), which PBS's execjob_begin ranks GPU sets by; same key, same rules.

``node-identity.json``: a replayed node (:class:`gpuslurm.hw.model.node.Node` without its link matrix
and CPU list: the GPUs' UUIDs, indices, minors, bus ids, NUMA nodes, CPU affinities and MIG
devices the hooks use) comes from parsing its capture bundle (nvidia-smi XML, lscpu, ...), which
costs a prolog several times its own work.
The file is valid while the bundle directory holds the same files: its real path and, for every
file but ``health.json`` (read by every hook anyway), name, size, inode, modification and change
times. The live node is never cached; NVML is asked on every run. Its identities change without
a reboot: a MIG reconfiguration makes new MIG devices, UUIDs and capability minors, and a GPU
that falls off the bus renumbers the others. A stale cache would then deny the wrong device files
or map a job to a MIG device that no longer exists, and nothing cheap notices it: the health
check finds a GPU by index and UUID but knows nothing of MIG, and the boot id and the driver stay
the same. The prolog initialises NVML for the health gate anyway, so a cache would save little.
"""

from __future__ import annotations

import os

from gpuslurm import __version__
from gpuslurm.errors import GpuslurmError
from gpuslurm.tuples import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping
    from typing import Any

    from gpuslurm.config import Config
    from gpuslurm.hw.model.node import Node
    from gpuslurm.hw.source import HardwareSource

    Warn = Callable[[str], None]  # a name for type checkers alone: collections.abc is ~1.5 ms a hook start
CACHE_DIR = "cache"
CONFIG_FILE = "config.json"
NODE_FILE = "node-identity.json"
PLACEMENT_FILE = "node-placement.json"
FORMAT = 2  # 2: node-identity.json holds the model's Node (1: the light identity tuples)
MAX_BYTES = 1 << 20
NOT_KEYED = frozenset({"health.json"})  # read by the health check itself on every run


# --- the config -------------------------------------------------------------------------------


def load_hook_config(environ: Mapping[str, str], warn: Warn | None = None) -> Config:
    """``gpuslurm.config.load_config(environ=environ)``, with the TOML parse cached."""
    from gpuslurm.config import Config, config_from_doc, parse_toml
    from gpuslurm.configfile import config_path, read_config_text

    path, explicit = config_path(environ)
    text = read_config_text(path, explicit)
    if text is None:
        return Config()
    directory = os.path.join(run_dir_hint(text), CACHE_DIR)
    cached = _load(directory, CONFIG_FILE, warn)
    if isinstance(cached, dict) and cached.get("text") == text and isinstance(cached.get("doc"), dict):
        return config_from_doc(cached["doc"], path)
    doc = parse_toml(text, path)
    cfg = config_from_doc(doc, path)  # a config that does not hold is not cached
    if os.path.join(cfg.paths.run_dir, CACHE_DIR) == directory:
        _store(directory, CONFIG_FILE, {"text": text, "doc": doc}, warn)
    return cfg


def run_dir_hint(text: str) -> str:
    """Where to look for the cached parse of config ``text``: its ``[paths]`` ``run_dir = "..."``,
    else the default. Only a hint: the cache is trusted for nothing but this very text."""
    from gpuslurm.configfile import DEFAULT_RUN_DIR

    section = ""
    for raw in text.splitlines():
        line = raw.strip()
        if line.startswith("["):
            section = line.split("#", 1)[0].strip()
            continue
        key, eq, value = line.partition("=")
        value = value.strip()
        if section == "[paths]" and eq and key.strip() == "run_dir" and value[:1] in ('"', "'"):
            end = value.find(value[0], 1)
            if end > 1 and "\\" not in value[:end]:
                return value[1:end]
    return DEFAULT_RUN_DIR


# --- the node ---------------------------------------------------------------------------------


def hook_node(source: HardwareSource, run_dir: str, warn: Warn | None = None) -> Node:
    """``source``'s node as the hooks use it, cached when replayed: its GPUs (each with its CPU
    affinity) without the link matrix (most of NVML's calls) or the node's CPU list (``cpus`` is
    empty: decoding a large node's hundreds of CPUs from the cache would cost a prolog ~1 ms)."""
    return _replayed(source, run_dir, warn, NODE_FILE, lambda: source.node(links=False)._replace(cpus=()))


def placement_node(source: HardwareSource, run_dir: str, warn: Warn | None = None) -> Node:
    """``source``'s whole node, link matrix and CPUs included (what the placement engine ranks
    GPU sets by), cached like :func:`hook_node` when replayed; live, NVML every time."""
    return _replayed(source, run_dir, warn, PLACEMENT_FILE, source.node)


MAX_MINOR = (1 << 20) - 1  # Linux minor numbers are 20 bits (the same bounds as nvml.json's reader)
MAX_MIB = 1 << 40  # a mebibyte count beyond any machine


def placement_from_json(doc: Any) -> Node:
    """The :class:`Node` :func:`placement_node` or :func:`hook_node` cached (its NamedTuples as JSON
    arrays), checked as strictly as a bundle's ``nvml.json``: every value of exactly its type
    (:func:`gpuslurm.hw.replay.bundlecache.node_from_json`), every number in the range that reader
    allows, GPU indices, minors and UUIDs unique, the link matrix square over the GPUs.
    ValueError or TypeError otherwise: the caller parses the bundle again. (The array form reads in
    a fraction of the time the keyed form takes, a third of PBS's execjob_begin's own work.)"""
    from gpuslurm.hw.replay.bundlecache import node_from_json
    from gpuslurm.ranges import MAX_CPUS, MAX_GPUS

    node = node_from_json(doc)
    gpus = node.gpus
    for g in gpus:
        if not (0 <= g.index < MAX_GPUS and 0 <= g.minor <= MAX_MINOR and 0 <= g.memory_mib <= MAX_MIB
                and (g.numa_node is None or 0 <= g.numa_node < MAX_CPUS)
                and all(0 <= c < MAX_CPUS for c in g.cpu_affinity)):
            raise ValueError(f"GPU {g.uuid!r}: a number out of range")
        for m in g.mig_devices:
            if not (0 <= m.index < MAX_GPUS and 0 <= m.gi_id <= MAX_MINOR and 0 <= m.ci_id <= MAX_MINOR
                    and 0 <= m.memory_mib <= MAX_MIB and (m.sm_count is None or 0 <= m.sm_count <= 1 << 20)
                    and all(x is None or 0 <= x <= MAX_MINOR for x in (m.gi_minor, m.ci_minor))):
                raise ValueError(f"a MIG device of GPU {g.uuid!r}: a number out of range")
    for attr in ("index", "minor", "uuid"):
        if len({getattr(g, attr) for g in gpus}) != len(gpus):
            raise ValueError(f"two GPUs with one {attr}")
    if not all(0 <= c.os_id < MAX_CPUS and 0 <= c.core < MAX_CPUS and 0 <= c.socket < MAX_CPUS
               and (c.numa_node is None or 0 <= c.numa_node < MAX_CPUS) for c in node.cpus):
        raise ValueError("a CPU number out of range")
    if node.memory_mib is not None and not 0 <= node.memory_mib <= MAX_MIB:
        raise ValueError("host memory out of range")
    if node.links is not None and (len(node.links) != len(gpus)
                                   or any(len(row) != len(gpus) for row in node.links)):
        raise ValueError("the link matrix is not square over the GPUs")
    if node.links is not None and not all(0 <= x.nvlinks <= 1 << 20 for row in node.links for x in row):
        raise ValueError("an NVLink count out of range")
    return node


def _replayed(source: HardwareSource, run_dir: str, warn: Warn | None, name: str,
              read: Callable[[], Node]) -> Node:
    """``read()`` the node, through the cache file ``name`` when ``source`` is a bundle (keyed by
    :func:`bundle_key`; a cached document :func:`placement_from_json` refuses is read and written
    anew). json.dumps writes the node's NamedTuples as arrays."""
    bundle = source.bundle
    if bundle is None:
        return read()
    directory = os.path.join(run_dir, CACHE_DIR)
    try:
        key = bundle_key(bundle)
    except OSError:  # unreadable: the bundle reader says what is wrong with it
        return read()
    cached = _load(directory, name, warn)
    if isinstance(cached, dict) and cached.get("key") == key:
        try:
            return placement_from_json(cached["node"])
        except (GpuslurmError, ValueError, TypeError, KeyError, AttributeError):
            pass  # not what this version writes: read the bundle and write it anew
    node = read()
    _store(directory, name, {"key": key, "node": node}, warn)
    return node


def bundle_key(bundle: str) -> list[Any]:
    """What a node cache is valid for: the bundle's real path and its files' identities."""
    real = os.path.realpath(bundle)
    files = []
    with os.scandir(real) as entries:
        for entry in entries:
            if entry.name not in NOT_KEYED:
                st = entry.stat()  # follows a symlinked file, as the reader does
                files.append([entry.name, st.st_size, st.st_ino, st.st_mtime_ns, st.st_ctime_ns])
    return [real, sorted(files)]


# --- the files --------------------------------------------------------------------------------


def _load(directory: str, name: str, warn: Warn | None) -> Any:
    """The cached document, or None when absent, unsafe, unreadable or from another version."""
    from gpuslurm.safedir import read_private_file

    try:
        data = read_private_file(directory, name, MAX_BYTES)
    except (GpuslurmError, OSError) as exc:  # e.g. a symlink planted there: not used, and said
        if warn:
            warn(f"cache not used: {exc}")
        return None
    if data is None:
        return None
    import json  # here, not at the top: the task prolog imports this module for run_dir_hint only

    try:
        doc = json.loads(data)
    except (ValueError, RecursionError):  # RecursionError: nested too deeply
        return None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT or doc.get("gpuslurm") != __version__:
        return None
    return doc


def _store(directory: str, name: str, doc: dict[str, Any], warn: Warn | None) -> None:
    import json

    from gpuslurm.safedir import write_private_file

    doc = {"format": FORMAT, "gpuslurm": __version__, **doc}
    try:
        payload = json.dumps(doc, separators=(",", ":"), allow_nan=True).encode()
        write_private_file(directory, name, payload + b"\n")
    except (GpuslurmError, OSError, TypeError, ValueError) as exc:  # TypeError: a TOML date
        if warn:
            warn(f"cannot write the cache {os.path.join(directory, name)}: {exc}")
