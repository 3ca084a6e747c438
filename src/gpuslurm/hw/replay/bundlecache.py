"""A capture bundle's parsed node, kept between runs in the caller's own private cache.

Parsing a bundle (nvidia-smi XML, topology matrix, lscpu) and importing its parsers costs a short
command such as ``gpuslurm pick --from`` more than all its other work. The parsed :class:`Node`
is kept as JSON in ``<cache_dir>/bundle-node.json`` and used while the bundle's content is the
same: the key is a BLAKE2b digest of the bundle's path (as given and real) and of the bytes of
every file the reader takes facts from (:data:`NODE_FILES`), so any edit, addition or removal of one of them
means parsing again. ``scenario.json`` and ``health.json`` are not facts of the node and are not
part of the key (a replayed scenario rewritten every second would otherwise defeat the cache).

The cache belongs to whoever runs the command, and only they can have written it: the directory
is reached component by component without following symlinks, every ancestor owned by root or
the caller and not writable by others, the directory itself and the file the caller's and
private (:mod:`gpuslurm.safedir`). Root's cache thus never sits in a path a user could write, and
a user's cache can only mislead that user's own commands. Anything odd (a file that is not
regular, a bundle file that cannot be read, a cache that is unsafe, malformed or from another
version) means parsing the bundle as if there were no cache; a cache that cannot be written only
costs time. The live node (NVML) is never cached: its identities change without notice (MIG).
"""

from __future__ import annotations

import json
import os

from gpuslurm import __version__
from gpuslurm.errors import GpuslurmError
from gpuslurm.hw.formats.strict import as_int, as_list, as_text, opt_int, opt_text
from gpuslurm.hw.model.node import Cpu, Gpu, Link, LinkKind, MigDevice, Node
from gpuslurm.safedir import read_private_file, read_regular, write_private_file
from gpuslurm.tuples import TYPE_CHECKING  # typing is not imported on pick's path

if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

CACHE_FILE = "bundle-node.json"
FORMAT = 2  # 2: Node gained "lost"
MAX_CACHE_BYTES = 16 << 20
# The files hw.replay.bundle reads facts from (the order is part of the key).
NODE_FILES = ("nvml.json", "nvidia-smi-q.xml", "nvidia-smi-q.txt", "nvidia-smi-L.txt",
              "nvidia-smi-topo.txt", "lscpu.csv", "mig-minors", "meminfo", "hostname")


def content_key(bundle: str) -> str | None:
    """The digest that names this bundle's content, or None when a file cannot be read as the
    reader would (missing is fine; a FIFO, a directory or an unreadable file is not: the reader
    then says what is wrong, and nothing is cached)."""
    try:
        from _blake2 import blake2b  # hashlib.blake2b itself; hashlib would load OpenSSL (4 ms)
    except ImportError:  # pragma: no cover - an interpreter built without it
        from hashlib import blake2b

    real = os.path.realpath(bundle)
    # the path as given too: the node's ``source`` names it ("replay:<path>")
    digest = blake2b(f"{bundle}\0{real}\0".encode("utf-8", "surrogateescape"), digest_size=32)
    for name in NODE_FILES:
        try:
            data = read_regular(os.path.join(real, name))
        except FileNotFoundError:
            digest.update(b"-\0")
            continue
        except OSError:
            return None
        digest.update(f"{len(data)}\0".encode())
        digest.update(data)
    return digest.hexdigest()


def cached_node(bundle: str, cache_dir: str, parse: Callable[[], Node]) -> Node:
    """``parse()`` (the bundle's node), or the cached result of an earlier parse of the same content."""
    key = content_key(bundle)
    if key is None:
        return parse()
    try:
        data = read_private_file(cache_dir, CACHE_FILE, MAX_CACHE_BYTES)
    except (GpuslurmError, OSError):
        data = None  # unsafe or unreadable: parse, and try to replace it below
    if data is not None:
        try:
            doc = json.loads(data)
            if (isinstance(doc, dict) and doc.get("format") == FORMAT
                    and doc.get("gpuslurm") == __version__ and doc.get("key") == key):
                return node_from_json(doc["node"])
        except (ValueError, TypeError, KeyError, RecursionError):
            pass  # not what this version writes: parse and write it anew
    node = parse()
    doc = {"format": FORMAT, "gpuslurm": __version__, "key": key, "node": node}
    try:
        write_private_file(cache_dir, CACHE_FILE, json.dumps(doc, separators=(",", ":")).encode() + b"\n")
    except (GpuslurmError, OSError, ValueError):
        pass
    return node


# --- the node from JSON (NamedTuples are written as arrays), every value checked --------------


def node_from_json(doc: Any) -> Node:
    """The :class:`Node` ``json.dumps(node)`` wrote; ValueError or TypeError when it is not one."""
    hostname, gpus, cpus, links, driver, cuda, memory, source, warnings, lost = doc
    return Node(as_text(hostname), tuple(_gpu(g) for g in as_list(gpus)),
                tuple(_cpu(c) for c in as_list(cpus)),
                None if links is None
                else tuple(tuple(_link(x) for x in as_list(row)) for row in as_list(links)),
                opt_text(driver), opt_text(cuda), opt_int(memory), as_text(source),
                tuple(as_text(w) for w in as_list(warnings)), tuple(as_int(i) for i in as_list(lost)))


def _gpu(item: Any) -> Gpu:
    uuid, index, minor, bus_id, name, memory, numa, affinity, mig_mode, migs = as_list(item)
    if mig_mode is not None and type(mig_mode) is not bool:
        raise ValueError(f"not true, false or null: {mig_mode!r}")
    return Gpu(as_text(uuid), as_int(index), as_int(minor), as_text(bus_id), as_text(name), as_int(memory),
               opt_int(numa), tuple(as_int(c) for c in as_list(affinity)), mig_mode,
               tuple(_mig(m) for m in as_list(migs)))


def _mig(item: Any) -> MigDevice:
    index, gi_id, ci_id, profile, memory, uuid, sms, gi_minor, ci_minor = as_list(item)
    return MigDevice(as_int(index), as_int(gi_id), as_int(ci_id), as_text(profile), as_int(memory),
                     opt_text(uuid), opt_int(sms), opt_int(gi_minor), opt_int(ci_minor))


def _cpu(item: Any) -> Cpu:
    os_id, core, socket, numa = as_list(item)
    return Cpu(as_int(os_id), as_int(core), as_int(socket), opt_int(numa))


def _link(item: Any) -> Link:
    kind, nvlinks = as_list(item)
    return Link(LinkKind(as_text(kind)), as_int(nvlinks))


