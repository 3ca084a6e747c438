"""The live NVML backend: a node's GPUs, MIG devices and links, read through :mod:`gpuslurm.hw.live.nvml_lib`.

Optional NVML functions are probed by name (``hasattr``, then FUNCTION_NOT_FOUND from an older
driver) rather than by parsing versions. NOT_SUPPORTED becomes None (or :class:`NotSupported`);
any other NVML error becomes a :class:`HardwareError` naming the call and the GPU, except
GPU_IS_LOST, which drops that GPU from the node with a warning so one dead GPU does not hide the
others.

Three choices worth knowing:

* NUMA node: ``nvmlDeviceGetNumaNodeId`` is *not* used. NVML documents it for GPUs whose memory
  is itself a NUMA node (Grace Hopper), where it names the GPU's memory node rather than the CPUs
  close to the GPU. The kernel's ``/sys/bus/pci/devices/<bus>/numa_node`` is what ``nvidia-smi
  topo -m`` shows as "NUMA Affinity"; when it is unknown the node of the affinity CPUs is used.
* NVSwitch: a link to a switch reports the switch's PCI address, not the peer's. Every GPU with
  switch links reaches every other such GPU, so a pair counts ``min`` of their switch links
  (DGX H100: NV18 everywhere, as ``nvidia-smi topo -m`` prints). Where the driver cannot say a
  remote is a switch, a non-GPU remote reached from two or more GPUs is taken to be one.
* MIG mode: a GPU in MIG mode answers no NVLink query; a direct bridge to it is counted from the
  peer that is not in MIG mode, for both directions (as ``nvidia-smi topo -m`` shows it). Switch
  links of a GPU in MIG mode stay unknown (its peers report only the switch).
* MIG profile names are NVML's own (``nvmlDeviceGetGpuInstanceProfileInfoV``'s ``name``), with
  ``<c>c.`` in front when the compute instance is smaller than its GPU instance. NVIDIA names
  profiles after nominal memory (an A100-80GB's ``3g.40gb`` has 40192 MiB, an H200's ``1g.18gb``
  16384 MiB), so a name rebuilt from memory is only the last resort, for a driver without the
  profile table.
"""

from __future__ import annotations

import os
import socket
import threading
from pathlib import Path
from typing import Any

from gpuslurm.errors import CaptureError, HardwareError, NotSupported
from gpuslurm.hw.formats.mig_minors import MigKey, parse_mig_minors
from gpuslurm.hw.live import sysfs
from gpuslurm.hw.live.nvml_lib import (
    MIB,
    NVML_DEVICE_MIG_ENABLE,
    NVML_ERROR_INVALID_ARGUMENT,
    NVML_ERROR_NO_PERMISSION,
    NVML_ERROR_NOT_FOUND,
    NVML_FEATURE_ENABLED,
    GpuLost,
    NvmlLibrary,
)
from gpuslurm.hw.live.nvml_lib import text as _text
from gpuslurm.hw.live.procfs import PROC_ROOT
from gpuslurm.hw.model.node import (
    MIG_PROFILE_RE,
    SELF_LINK,
    Cpu,
    Gpu,
    Link,
    LinkKind,
    MigDevice,
    Node,
    normalise_bus_id,
)

# Enums from nvml.h (stable ABI); the return codes are in gpuslurm.hw.live.nvml_lib.
NVML_NVLINK_DEVICE_TYPE_GPU = 0x00
NVML_NVLINK_DEVICE_TYPE_SWITCH = 0x02

TOPOLOGY_LEVELS = {
    0: LinkKind.PIX,  # NVML_TOPOLOGY_INTERNAL: two GPUs on one board
    10: LinkKind.PIX,  # SINGLE
    20: LinkKind.PXB,  # MULTIPLE
    30: LinkKind.PHB,  # HOSTBRIDGE
    40: LinkKind.NODE,  # NODE (CPU)
    50: LinkKind.SYS,  # SYSTEM
}


# A lookup NVML refuses this user or has no entry for: fall back, not a failure.
_NO_ANSWER = (NVML_ERROR_NO_PERMISSION, NVML_ERROR_NOT_FOUND, NVML_ERROR_INVALID_ARGUMENT)


def mig_profile_name(gi_slices: int, ci_slices: int, memory_mib: int) -> str:
    """``<g>g.<GiB>gb``, or ``<c>c.<g>g.<GiB>gb`` when the compute instance has fewer slices."""
    if gi_slices < 1 or memory_mib < 1:
        raise HardwareError(f"NVML reports an impossible MIG device ({gi_slices} GPU slices, "
                            f"{memory_mib} MiB)")
    gib = int(memory_mib / 1024 + 0.5)
    name = f"{gi_slices}g.{gib}gb"
    if 0 < ci_slices < gi_slices:
        name = f"{ci_slices}c.{name}"
    return name


def _cpu_ids(words: Any) -> tuple[int, ...]:
    return tuple(i * 64 + bit for i, word in enumerate(words) for bit in range(64)
                 if int(word) >> bit & 1)


class NvmlBackend:
    """Reads a :class:`Node` from NVML. ``module`` is ``pynvml`` or a stand-in with its API."""

    def __init__(self, module: Any | None = None, *, sys_root: Path = Path("/sys"),
                 proc_root: Path = Path(PROC_ROOT)) -> None:
        self.nvml = NvmlLibrary(module)
        self.sys_root = sys_root
        self.proc_root = proc_root
        self._profile_cache: dict[int, list[tuple[int, int, int, str]]] = {}

    def close(self) -> None:
        """Shut NVML down if this backend started it (also run at interpreter exit)."""
        self.nvml.close()

    # -- the node ---------------------------------------------------------------------------------

    def read_node(self, hostname: str | None = None, *, links: bool = True) -> Node:
        """Everything NVML, sysfs and /proc say about this node.

        ``links=False`` leaves out the link matrix (``Node.links`` is None): it is most of the
        NVML calls (NVLink state and remote per link: ~290 of ~355 on an 8-GPU NVSwitch node),
        and the hooks only need identities, bus ids, affinity and MIG devices.
        """
        cpus = sysfs.read_cpus(self.sys_root)
        highest = max((c.os_id for c in cpus), default=0)
        words = -(-max(os.cpu_count() or 1, highest + 1) // 64)
        warnings: list[str] = []
        gpus: list[Gpu] = []
        gone: list[int] = []
        handles: list[Any] = []
        minors: dict[MigKey, int] | None = None
        for index in range(int(self.nvml.call("nvmlDeviceGetCount"))):
            try:
                handle = self.nvml.call("nvmlDeviceGetHandleByIndex", index, gpu=index)
                gpu = self._read_gpu(index, handle, cpus, words, warnings)
                if gpu.mig_mode:
                    if minors is None:
                        minors = self._mig_minors(warnings)
                    gpu = self._with_mig(gpu, handle, minors)
            except GpuLost as lost:
                warnings.append(f"{lost}; it is left out")
                gone.append(index)
                continue
            gpus.append(gpu)
            handles.append(handle)
        return Node(
            hostname=hostname or socket.gethostname().split(".")[0],
            gpus=tuple(gpus),
            cpus=cpus,
            links=self._links(gpus, handles, warnings) if links else None,
            driver_version=self._driver_version(),
            cuda_version=self._cuda_version(),
            memory_mib=sysfs.read_meminfo_mib(self.proc_root / "meminfo"),
            source="nvml",
            warnings=tuple(warnings),
            lost=tuple(gone),
        )

    def _read_gpu(self, index: int, handle: Any, cpus: tuple[Cpu, ...], words: int,
                  warnings: list[str]) -> Gpu:
        pci = self.nvml.call("nvmlDeviceGetPciInfo", handle, gpu=index)
        bus_text = _text(pci.busId) or _text(pci.busIdLegacy)
        try:
            bus_id = normalise_bus_id(bus_text)
        except ValueError:
            raise HardwareError(f"NVML gives GPU {index} the bus id {bus_text!r}") from None
        affinity = self.nvml.optional("nvmlDeviceGetCpuAffinity", handle, words, gpu=index)
        cpu_ids = _cpu_ids(affinity) if affinity is not None else ()
        if cpus:
            # Only CPUs a job can be given: sysfs lists the online ones, and a bundle reader
            # rejects affinity naming CPUs its CPU list lacks.
            online = {c.os_id for c in cpus}
            if dropped := [c for c in cpu_ids if c not in online]:
                warnings.append(f"GPU {index}: CPU affinity names CPUs {dropped} that are not online; "
                                "they are left out")
                cpu_ids = tuple(c for c in cpu_ids if c in online)
        mig = self.nvml.optional("nvmlDeviceGetMigMode", handle, gpu=index)
        return Gpu(
            uuid=_text(self.nvml.call("nvmlDeviceGetUUID", handle, gpu=index)),
            index=index,
            minor=int(self.nvml.call("nvmlDeviceGetMinorNumber", handle, gpu=index)),
            bus_id=bus_id,
            name=_text(self.nvml.call("nvmlDeviceGetName", handle, gpu=index)),
            memory_mib=int(self.nvml.call("nvmlDeviceGetMemoryInfo", handle, gpu=index).total) // MIB,
            numa_node=self._numa_node(bus_id, cpu_ids, cpus),
            cpu_affinity=cpu_ids,
            mig_mode=None if mig is None else int(mig[0]) == NVML_DEVICE_MIG_ENABLE,
        )

    def _numa_node(self, bus_id: str, cpu_ids: tuple[int, ...], cpus: tuple[Cpu, ...]) -> int | None:
        node = sysfs.pci_numa_node(bus_id, self.sys_root)
        if node is not None:
            return node
        by_cpu = {c.os_id: c.numa_node for c in cpus}
        nodes = {by_cpu.get(c) for c in cpu_ids}
        return nodes.pop() if len(nodes) == 1 else None

    def _mig_minors(self, warnings: list[str]) -> dict[MigKey, int]:
        path = self.proc_root / "driver/nvidia-caps/mig-minors"
        try:
            return parse_mig_minors(path.read_text(), path)
        except OSError as exc:
            warnings.append(f"{path}: {exc.strerror}; MIG device files are unknown")
        except CaptureError as exc:
            warnings.append(f"{exc}; MIG device files are unknown")
        return {}

    def _with_mig(self, gpu: Gpu, handle: Any, minors: dict[MigKey, int]) -> Gpu:
        i = gpu.index
        devices: list[MigDevice] = []
        profiles: list[Any] | None = None  # the GPU's GPU-instance profiles, read once
        for slot in range(int(self.nvml.call("nvmlDeviceGetMaxMigDeviceCount", handle, gpu=i))):
            mig = self.nvml.call("nvmlDeviceGetMigDeviceHandleByIndex", handle, slot, gpu=i,
                             allow=(NVML_ERROR_NOT_FOUND,))
            if mig is None:
                continue  # an empty slot: MIG devices need not be numbered contiguously
            gi = int(self.nvml.call("nvmlDeviceGetGpuInstanceId", mig, gpu=i))
            ci = int(self.nvml.call("nvmlDeviceGetComputeInstanceId", mig, gpu=i))
            attrs = self.nvml.first(("nvmlDeviceGetAttributes_v2", "nvmlDeviceGetAttributes"), mig, gpu=i)
            memory = int(attrs.memorySizeMB)
            devices.append(MigDevice(
                index=slot, gi_id=gi, ci_id=ci,
                profile=self._mig_profile(handle, i, gi, attrs, profiles),
                memory_mib=memory,
                uuid=_text(self.nvml.call("nvmlDeviceGetUUID", mig, gpu=i)),
                sm_count=int(attrs.multiprocessorCount),
                gi_minor=minors.get((gpu.minor, gi, None)),
                ci_minor=minors.get((gpu.minor, gi, ci)),
            ))
        return Gpu(gpu.uuid, gpu.index, gpu.minor, gpu.bus_id, gpu.name, gpu.memory_mib,
                   gpu.numa_node, gpu.cpu_affinity, gpu.mig_mode, tuple(devices))

    def _mig_profile(self, handle: Any, i: int, gi_id: int, attrs: Any, profiles: list[Any] | None) -> str:
        """The MIG device's profile name as NVIDIA names it ("3g.40gb", "1c.3g.40gb").

        The GPU instance's profile comes from NVML's profile table: by the instance's profile id
        when NVML lets this user look the instance up (root), else the one profile with the
        device's slice count and memory. Without a table (or with two candidates) the name is
        built from slice counts and memory, which misnames profiles NVIDIA names by nominal
        memory (an A100-80GB's 3g.40gb has 40192 MiB).
        """
        gi_slices, ci_slices = int(attrs.gpuInstanceSliceCount), int(attrs.computeInstanceSliceCount)
        memory = int(attrs.memorySizeMB)
        table = self._gi_profiles(handle, i)
        name = None
        instance = None
        if table:
            instance = self.nvml.call("nvmlDeviceGetGpuInstanceById", handle, gi_id, gpu=i, allow=_NO_ANSWER)
        if instance is not None:
            info = self.nvml.call("nvmlGpuInstanceGetInfo", instance, gpu=i, allow=_NO_ANSWER)
            if info is not None:
                name = next((n for pid, _, _, n in table if pid == int(info.profileId)), None)
        if name is None:
            found = {n for _, slices, mib, n in table if slices == gi_slices and mib == memory}
            name = found.pop() if len(found) == 1 else None
        if name is None:
            return mig_profile_name(gi_slices, ci_slices, memory)
        return f"{ci_slices}c.{name}" if 0 < ci_slices < gi_slices else name

    def _gi_profiles(self, handle: Any, i: int) -> list[tuple[int, int, int, str]]:
        """(profile id, slices, MiB, name) of every GPU-instance profile the GPU offers."""
        if i in self._profile_cache:
            return self._profile_cache[i]
        out: list[tuple[int, int, int, str]] = []
        count = int(getattr(self.nvml.module(), "NVML_GPU_INSTANCE_PROFILE_COUNT", 0))
        for index in range(count):
            try:
                info = self.nvml.call("nvmlDeviceGetGpuInstanceProfileInfo", handle, index, 2, gpu=i,
                                      allow=_NO_ANSWER)
            except NotSupported:
                continue  # a profile this GPU does not offer (or no versioned query at all)
            if info is None:
                continue
            name = _text(info.name)
            name = name[4:] if name.startswith("MIG ") else name
            if MIG_PROFILE_RE.match(name):
                out.append((int(info.id), int(info.sliceCount), int(info.memorySizeMB), name))
        self._profile_cache[i] = out
        return out

    # -- links ------------------------------------------------------------------------------------

    def _links(self, gpus: list[Gpu], handles: list[Any],
               warnings: list[str]) -> tuple[tuple[Link, ...], ...]:
        n = len(gpus)
        direct = [[0] * n for _ in range(n)]
        switch = [0] * n
        unknown: list[dict[str, int]] = [{} for _ in range(n)]
        lost: set[int] = set()
        for pos, (gpu, handle) in enumerate(zip(gpus, handles, strict=True)):
            try:
                self._count_nvlinks(pos, gpu, handle, gpus, direct, switch, unknown[pos])
            except GpuLost as exc:
                warnings.append(f"{exc} while reading its links")
                lost.add(pos)
        # Without remote device types: a non-GPU remote shared by several GPUs is a switch.
        reach: dict[str, int] = {}
        for remotes in unknown:
            for bus in remotes:
                reach[bus] = reach.get(bus, 0) + 1
        for pos, remotes in enumerate(unknown):
            switch[pos] += sum(count for bus, count in remotes.items() if reach[bus] > 1)

        # A GPU in MIG mode answers no NVLink query, but a bridge to it is the same bridge seen from
        # its peer: count it from the side that could say (nvidia-smi topo -m shows it both ways).
        for a in range(n):
            for b in range(n):
                if gpus[a].mig_mode and not gpus[b].mig_mode:
                    direct[a][b] = direct[b][a]
        rows: list[list[Link]] = [[SELF_LINK] * n for _ in range(n)]
        for a in range(n):
            for b in range(a + 1, n):
                if a in lost or b in lost:
                    rows[a][b] = rows[b][a] = Link(LinkKind.UNKNOWN)
                    continue
                pcie: Link | None = None
                for x, y in ((a, b), (b, a)):
                    nv = direct[x][y] + (min(switch[x], switch[y]) if switch[x] and switch[y] else 0)
                    if nv:
                        rows[x][y] = Link(LinkKind.NVLINK, nv)
                    else:
                        pcie = pcie or self._pcie_link(gpus[a], handles[a], gpus[b], handles[b], warnings)
                        rows[x][y] = pcie
        return tuple(tuple(r) for r in rows)

    def _count_nvlinks(self, pos: int, gpu: Gpu, handle: Any, gpus: list[Gpu], direct: list[list[int]],
                       switch: list[int], unknown: dict[str, int]) -> None:
        if gpu.mig_mode or not self.nvml.has("nvmlDeviceGetNvLinkState"):
            return  # NVLink queries are not supported in MIG mode
        by_bus = {g.bus_id: p for p, g in enumerate(gpus)}
        # nvidia-ml-py 11 exposed the _v2 call under its C name; later ones call it plainly.
        pci_fn = "nvmlDeviceGetNvLinkRemotePciInfo_v2"
        if not self.nvml.has(pci_fn):
            pci_fn = "nvmlDeviceGetNvLinkRemotePciInfo"
        type_fn = "nvmlDeviceGetNvLinkRemoteDeviceType"
        i = gpu.index
        for link in range(int(getattr(self.nvml.module(), "NVML_NVLINK_MAX_LINKS", 18))):
            try:
                state = self.nvml.call("nvmlDeviceGetNvLinkState", handle, link, gpu=i,
                                   allow=(NVML_ERROR_INVALID_ARGUMENT,))
            except NotSupported:
                continue
            if state is None or int(state) != NVML_FEATURE_ENABLED:
                continue
            kind = self.nvml.optional(type_fn, handle, link, gpu=i)
            if kind is not None and int(kind) == NVML_NVLINK_DEVICE_TYPE_SWITCH:
                switch[pos] += 1
                continue
            pci = self.nvml.optional(pci_fn, handle, link, gpu=i)
            try:
                remote = normalise_bus_id(_text(pci.busId) or _text(pci.busIdLegacy)) if pci else None
            except ValueError:
                remote = None
            if remote is None:
                continue
            if remote in by_bus:
                direct[pos][by_bus[remote]] += 1
            elif kind is None:
                unknown[remote] = unknown.get(remote, 0) + 1
            # a known non-GPU, non-switch remote (an IBM NPU: the CPU) is not a GPU link

    def _pcie_link(self, ga: Gpu, ha: Any, gb: Gpu, hb: Any, warnings: list[str]) -> Link:
        try:
            level = self.nvml.optional("nvmlDeviceGetTopologyCommonAncestor", ha, hb, gpu=ga.index)
        except GpuLost as exc:
            warnings.append(f"{exc} (between GPUs {ga.index} and {gb.index})")
            return Link(LinkKind.UNKNOWN)
        if level is None:
            return Link(LinkKind.UNKNOWN)
        return Link(TOPOLOGY_LEVELS.get(int(level), LinkKind.UNKNOWN))

    # -- system -----------------------------------------------------------------------------------

    def _driver_version(self) -> str | None:
        version = self.nvml.optional("nvmlSystemGetDriverVersion")
        return None if version is None else _text(version)

    def _cuda_version(self) -> str | None:
        try:
            version = self.nvml.first(("nvmlSystemGetCudaDriverVersion_v2", "nvmlSystemGetCudaDriverVersion"))
        except NotSupported:
            return None
        if not version:
            return None
        v = int(version)
        return f"{v // 1000}.{v % 1000 // 10}"


_default: NvmlBackend | None = None
_default_lock = threading.Lock()


def read_node(hostname: str | None = None, *, links: bool = True) -> Node:
    """Read this node through a process-wide NVML backend (``links``: see NvmlBackend.read_node)."""
    global _default
    with _default_lock:
        if _default is None:
            _default = NvmlBackend()
        backend = _default
    return backend.read_node(hostname, links=links)


def compute_capabilities(backend: NvmlBackend | None = None) -> dict[str, tuple[int, int]]:
    """GPU UUID → CUDA compute capability (major, minor), for every GPU NVML can read.

    A GPU whose query fails or is not supported is left out (the caller falls back to its model
    table); NVML missing altogether is a HardwareError.
    """
    global _default
    if backend is None:
        with _default_lock:
            if _default is None:
                _default = NvmlBackend()
            backend = _default
    out: dict[str, tuple[int, int]] = {}
    for index in range(int(backend.nvml.call("nvmlDeviceGetCount"))):
        try:
            handle = backend.nvml.call("nvmlDeviceGetHandleByIndex", index, gpu=index)
            uuid = _text(backend.nvml.call("nvmlDeviceGetUUID", handle, gpu=index))
            major, minor = backend.nvml.call("nvmlDeviceGetCudaComputeCapability", handle, gpu=index)
        except HardwareError:  # not supported, failed or lost (GpuLost is one): no entry
            continue
        out[uuid] = (int(major), int(minor))
    return out
