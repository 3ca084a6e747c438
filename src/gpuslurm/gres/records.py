"""What gres.conf must say for a node, as typed records (pure; rendering is in ``render``).

Decisions, each also in the README:

- GPUs in PCI bus order (= NVML index order), ``File=/dev/nvidia<minor>``: the minor number is
  what names the device file, and it differs from the index on real machines.
- ``Cores=`` in Slurm's abstract core numbering (see ``gpuslurm.topo.cores``): the cores of the
  GPU's NUMA node, or, for Slurm 24.11 and later (``MigNaming.whole_sockets``), the whole sockets
  that hold them, since those releases set a node INVAL whose Cores= splits a socket.
- ``Type=`` as AutoDetect=nvml would name it, so a site can switch to AutoDetect later without
  renaming anything in its partitions, QOS or job scripts. MIG Types differ between Slurm
  releases: the caller says which release through ``GresOptions.mig`` (gpuslurm.slurm.mig_types).
- ``Links=`` from the NVLink counts of ``nvidia-smi topo -m``: -1 for the device itself, the bonded
  link count to each peer, 0 for PCIe-only peers. On NVSwitch machines every pair shows the same
  count (NV18 on a DGX H100) and that is what we write: it is the truth about bandwidth, it keeps
  every pair equally preferred (which is what a switch means), and it stays right if a link
  fails and the counts drift apart. AutoDetect writes 0 there, because NVML reports the switch,
  not the peer, as the remote end of each link.
- MIG devices get ``MultipleFiles=`` (parent GPU and the GI and CI capability devices). Nodes with
  any MIG device get no ``Links=``: MIG has no NVLink, and positions in a Links list would no
  longer line up with physical GPUs.
- ``Name=mps``/``Name=shard`` lines, one per non-MIG GPU, bound to its device file.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

from gpuslurm.errors import CaptureError
from gpuslurm.hw.model.node import Gpu, LinkKind, MigDevice, Node, autodetect_mig_type, autodetect_type
from gpuslurm.topo.cores import CoreMap, LayoutError, core_map, format_ranges


class MigNaming(NamedTuple):
    """What the target Slurm release does with MIG devices and ``Cores=`` (gpuslurm.slurm.mig_types
    builds it)."""

    # (parent GPU's NVML name, MIG device) -> the GRES Type AutoDetect=nvml gives it
    type_of: Callable[[str, MigDevice], str] = autodetect_mig_type
    splits_shared: bool = True  # Slurm bug 17482: MultipleFiles split per file with mps/shard
    release: str | None = None  # for the generated file's note; None: not said
    # Slurm 24.11 and later set a node INVAL whose gres.conf Cores= is not whole sockets ("GRES core
    # specification ... doesn't match socket boundaries"): widen each GPU's cores to its sockets
    whole_sockets: bool = False
    # a release between the last that took NUMA Cores= (22.05) and the first seen refusing them
    # (24.11): not tried, so the generated file says what to do if the node goes INVAL
    socket_check_untried: bool = False


class GresOptions(NamedTuple):
    node_name: str | None = None  # prefix every line with NodeName= (a cluster-wide gres.conf)
    mps: int | None = None  # Name=mps Count= per GPU
    shard: int | None = None  # Name=shard Count= per GPU
    links: bool = True
    dev_root: str = ""  # prepended to /dev paths; for test clusters and containers
    mig: MigNaming = MigNaming()  # the target Slurm's MIG Types (22.05's by default)


@dataclass(frozen=True, slots=True)
class GresRecord:
    """One gres.conf line. ``gpu`` is the physical GPU it belongs to (for comments and checks)."""

    name: str
    gpu: Gpu
    type: str | None = None
    files: tuple[str, ...] = ()
    cores: tuple[int, ...] | None = None
    links: tuple[int, ...] | None = None
    count: int | None = None
    mig: MigDevice | None = None

    @property
    def file(self) -> str | None:
        return self.files[0] if len(self.files) == 1 else None

    @property
    def multiple_files(self) -> str | None:
        return ",".join(self.files) if len(self.files) > 1 else None

    @property
    def cores_text(self) -> str | None:
        return None if self.cores is None else format_ranges(self.cores)

    @property
    def links_text(self) -> str | None:
        return None if self.links is None else ",".join(str(n) for n in self.links)

    @property
    def comment(self) -> str:
        g = self.gpu
        if self.mig is not None:
            m = self.mig
            return (f"MIG {m.profile} (GI {m.gi_id}, CI {m.ci_id}) on GPU {g.index} {g.bus_id}"
                    + (f" {m.uuid}" if m.uuid else ""))
        return f"GPU {g.index} {g.bus_id} {g.uuid} NUMA {g.numa_node if g.numa_node is not None else '?'}"


class GresPlan(NamedTuple):
    """Everything the gres.conf template needs."""

    records: tuple[GresRecord, ...]
    notes: tuple[str, ...]
    core_map: CoreMap
    whole_sockets: bool = False  # the target Slurm refuses Cores= that are not whole sockets

    @property
    def gpu_records(self) -> tuple[GresRecord, ...]:
        return tuple(r for r in self.records if r.name == "gpu")


def bundle_path(node: Node) -> str:
    """The place the node's facts came from, for error messages."""
    return node.source.removeprefix("replay:") or "the hardware"


def node_core_map(node: Node) -> CoreMap:
    try:
        return core_map(node.cpus)
    except LayoutError as exc:
        where = "sysfs" if node.source.startswith("nvml") else "lscpu.csv"
        raise CaptureError(f"{where}: {exc} (capture it with lscpu -p=CPU,CORE,SOCKET,NODE)",
                           bundle_path(node)) from None


def gpu_cores(node: Node, cmap: CoreMap, gpu: Gpu) -> tuple[int, ...]:
    """Slurm cores close to ``gpu``; errors name the file that should have said."""
    if not gpu.cpu_affinity:
        raise CaptureError(f"GPU {gpu.index} ({gpu.uuid}) has no CPU affinity: the bundle needs "
                           "nvidia-smi-topo.txt or nvml.json", bundle_path(node))
    try:
        return cmap.slurm_cores(gpu.cpu_affinity)
    except LayoutError as exc:
        raise CaptureError(f"GPU {gpu.index} affinity: {exc}", bundle_path(node)) from None


def plan_gres(node: Node, opts: GresOptions) -> GresPlan:
    """Turn a node into gres.conf records. Raises CaptureError when a needed fact is missing."""
    if not node.gpus:
        # An empty gres.conf with AutoDetect=off would tell slurmd the node has no GPUs at all.
        raise CaptureError("no GPUs in this node's facts: refusing to write a gres.conf without GPUs",
                           node.source.removeprefix("replay:") or None)
    cmap = node_core_map(node)
    dev = opts.dev_root.rstrip("/")
    gpus = sorted(node.gpus, key=lambda g: g.bus_id)
    notes: list[str] = []
    has_mig = any(g.mig_mode and g.mig_devices for g in gpus)
    write_links = opts.links and node.links is not None and not has_mig
    if opts.links and node.links is None:
        notes.append("no Links=: the capture has no link matrix (nvidia-smi-topo.txt)")
    elif opts.links and has_mig:
        notes.append("no Links=: MIG devices have no NVLink and would shift Links positions")
    if has_mig and opts.mig.release:
        notes.append(f"MIG Types as Slurm {opts.mig.release} names them")
    if has_mig and opts.mig.splits_shared:
        notes.append("Slurm before 23.02.7 counts each file of a MultipleFiles line as a GPU when "
                     "GresTypes has mps or shard (Slurm bug 17482): keep them out of GresTypes here")
    if write_links and _uniform_nvlink(node):
        notes.append("Links=: every GPU pair has the same NVLink count (NVSwitch); written as counted")

    records: list[GresRecord] = []
    widened: list[str] = []
    for gpu in gpus:
        cores = gpu_cores(node, cmap, gpu)
        if opts.mig.whole_sockets and not cmap.is_whole_sockets(cores):
            whole = cmap.whole_sockets(cores)
            widened.append(f"GPU {gpu.index} {format_ranges(cores)} -> {format_ranges(whole)}")
            cores = whole
        if gpu.mig_mode:
            if not gpu.mig_devices:
                notes.append(f"GPU {gpu.index} ({gpu.uuid}) is in MIG mode with no MIG devices: "
                             "not schedulable until instances are created")
            for mig in gpu.mig_devices:
                records.append(_mig_record(node, gpu, mig, cores, dev, opts.mig))
            continue
        links = None
        if write_links:
            assert node.links is not None
            row = node.links[node.gpus.index(gpu)]
            links = tuple(-1 if peer is gpu else _link_count(row[node.gpus.index(peer)].kind,
                                                                row[node.gpus.index(peer)].nvlinks)
                          for peer in gpus)
        records.append(GresRecord("gpu", gpu, type=autodetect_type(gpu.name),
                                  files=(f"{dev}{gpu.device_file}",), cores=cores, links=links))
    release_unknown = opts.mig.release is None or opts.mig.release.startswith("unknown")
    split = any(r.cores is not None and not cmap.is_whole_sockets(r.cores) for r in records)
    if release_unknown and split:
        notes.append("Cores= are the GPUs' NUMA cores, which split a socket: Slurm 24.11 and later set "
                     "such a node INVAL; give --slurm-version to write what your release takes")
    elif opts.mig.socket_check_untried and split:
        notes.append("Cores= are the GPUs' NUMA cores, which split a socket: Slurm 22.05 takes them and "
                     "24.11 sets such a node INVAL; this release was not tried: if the node goes INVAL "
                     "(\"doesn't match socket boundaries\"), write this file with --slurm-version 24.11")
    if widened:
        notes.append("Cores= widened to whole sockets: Slurm 24.11 and later set a node INVAL whose "
                     "Cores= splits a socket (\"doesn't match socket boundaries\"); the GPUs' NUMA "
                     f"cores were narrower ({'; '.join(widened)}); see docs/gres.md")
    for name, count in (("mps", opts.mps), ("shard", opts.shard)):
        if count is None:
            continue
        if count <= 0:
            raise CaptureError(f"--{name} must be a positive count, not {count}", f"--{name}")
        plain = [g for g in gpus if not g.mig_mode]
        if len(plain) < len(gpus):
            notes.append(f"no {name} on MIG-enabled GPUs")
        records.extend(GresRecord(name, g, files=(f"{dev}{g.device_file}",), count=count) for g in plain)
    return GresPlan(tuple(records), tuple(notes), cmap, opts.mig.whole_sockets)


def _mig_record(node: Node, gpu: Gpu, mig: MigDevice, cores: tuple[int, ...], dev: str,
                naming: MigNaming) -> GresRecord:
    if mig.gi_minor is None or mig.ci_minor is None:
        raise CaptureError(f"MIG device {mig.index} of GPU {gpu.index} (GI {mig.gi_id}, CI {mig.ci_id}) "
                           "has no capability minors: the bundle needs mig-minors", bundle_path(node))
    if not mig.profile:
        raise CaptureError(f"MIG device {mig.index} of GPU {gpu.index} has no profile name: the bundle "
                           "needs nvidia-smi-L.txt or nvml.json", bundle_path(node))
    try:
        mig_type = naming.type_of(gpu.name, mig)
    except ValueError as exc:
        raise CaptureError(str(exc), bundle_path(node)) from None
    files = tuple(f"{dev}{f}" for f in mig.device_files(gpu.minor))
    return GresRecord("gpu", gpu, type=mig_type, files=files, cores=cores, mig=mig)


def _link_count(kind: LinkKind, nvlinks: int) -> int:
    return nvlinks if kind is LinkKind.NVLINK else 0


def _uniform_nvlink(node: Node) -> bool:
    assert node.links is not None
    counts = {c.nvlinks for i, row in enumerate(node.links) for j, c in enumerate(row)
              if i != j and c.kind is LinkKind.NVLINK}
    pairs = {(i, j) for i, row in enumerate(node.links) for j, c in enumerate(row) if i != j}
    nv_pairs = {(i, j) for i, row in enumerate(node.links) for j, c in enumerate(row)
                if i != j and c.kind is LinkKind.NVLINK}
    return len(node.gpus) > 2 and len(counts) == 1 and nv_pairs == pairs
