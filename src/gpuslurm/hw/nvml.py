"""The live NVML backend: the only module that talks to ``pynvml``.

NVML is initialised on first use, once per backend (a lock guards it) and shut down at exit;
importing this module never touches the driver. Optional NVML functions are probed by name
(``hasattr``, then FUNCTION_NOT_FOUND from an older driver) rather than by parsing versions.
NOT_SUPPORTED becomes None (or :class:`NotSupported`); any other NVML error becomes a
:class:`HardwareError` naming the call and the GPU, except GPU_IS_LOST, which drops that GPU from
the node with a warning so one dead GPU does not hide the others.

Three choices worth knowing:

* NUMA node: ``nvmlDeviceGetNumaNodeId`` is *not* used. NVML documents it for GPUs whose memory
  is itself a NUMA node (Grace Hopper), where it names the GPU's memory node rather than the CPUs
  close to the GPU. The kernel's ``/sys/bus/pci/devices/<bus>/numa_node`` is what ``nvidia-smi
  topo -m`` shows as "NUMA Affinity"; when it is unknown the node of the affinity CPUs is used.
* NVSwitch: a link to a switch reports the switch's PCI address, not the peer's. Every GPU with
  switch links reaches every other such GPU, so a pair counts ``min`` of their switch links
  (DGX H100: NV18 everywhere, as ``nvidia-smi topo -m`` prints). Where the driver cannot say a
  remote is a switch, a non-GPU remote reached from two or more GPUs is taken to be one.
* MIG profile names are rebuilt from the slice counts and memory (``3g.40gb``; ``1c.3g.71gb`` when
  the compute instance is smaller than its GPU instance), with memory rounded to whole GiB. NVIDIA
  names some profiles after nominal memory (an H200 ``1g.18gb`` has 16384 MiB); the exact names
  are in ``nvidia-smi -L``, which :mod:`gpuslurm.hw.capture` saves in the bundle.
"""

from __future__ import annotations

import atexit
import os
import socket
import threading
from pathlib import Path
from typing import Any, NamedTuple

from gpuslurm.errors import CaptureError, HardwareError, NotSupported
from gpuslurm.hw import sysfs
from gpuslurm.hw.mig_minors import MigKey, parse_mig_minors
from gpuslurm.hw.model import (
    SELF_LINK,
    Cpu,
    Gpu,
    Link,
    LinkKind,
    MigDevice,
    Node,
    normalise_bus_id,
)

# Return codes and enums from nvml.h; they are part of NVML's stable ABI.
NVML_ERROR_INVALID_ARGUMENT = 2
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_NOT_FOUND = 6
NVML_ERROR_DRIVER_NOT_LOADED = 9
NVML_ERROR_LIBRARY_NOT_FOUND = 12
NVML_ERROR_FUNCTION_NOT_FOUND = 13
NVML_ERROR_GPU_IS_LOST = 15
NVML_NVLINK_DEVICE_TYPE_GPU = 0x00
NVML_NVLINK_DEVICE_TYPE_SWITCH = 0x02
NVML_DEVICE_MIG_ENABLE = 1
NVML_FEATURE_ENABLED = 1

TOPOLOGY_LEVELS = {
    0: LinkKind.PIX,  # NVML_TOPOLOGY_INTERNAL: two GPUs on one board
    10: LinkKind.PIX,  # SINGLE
    20: LinkKind.PXB,  # MULTIPLE
    30: LinkKind.PHB,  # HOSTBRIDGE
    40: LinkKind.NODE,  # NODE (CPU)
    50: LinkKind.SYS,  # SYSTEM
}
MIB = 1024 * 1024


class _GpuLost(Exception):  # noqa: N818 - internal signal, never escapes read_node
    def __init__(self, index: int, call: str) -> None:
        super().__init__(f"GPU {index}: {call} reports the GPU is lost")
        self.index = index


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


def _text(value: Any) -> str:
    if isinstance(value, bytes):
        value = value.decode("ascii", "replace")
    return str(value).strip("\x00 \n")


def _cpu_ids(words: Any) -> tuple[int, ...]:
    return tuple(i * 64 + bit for i, word in enumerate(words) for bit in range(64)
                 if int(word) >> bit & 1)


class NvmlBackend:
    """Reads a :class:`Node` from NVML. ``module`` is ``pynvml`` or a stand-in with its API."""

    def __init__(self, module: Any | None = None, *, sys_root: Path = Path("/sys"),
                 proc_root: Path = Path("/proc")) -> None:
        self._module = module
        self._nvml: Any | None = None
        self._lock = threading.Lock()
        self.sys_root = sys_root
        self.proc_root = proc_root

    # -- lifecycle --------------------------------------------------------------------------------

    def _library(self) -> Any:
        with self._lock:
            if self._nvml is None:
                module = self._module if self._module is not None else _import_pynvml()
                try:
                    module.nvmlInit()
                except module.NVMLError as exc:
                    if exc.value in (NVML_ERROR_LIBRARY_NOT_FOUND, NVML_ERROR_DRIVER_NOT_LOADED):
                        raise HardwareError(f"NVML is not available: {exc}") from None
                    raise HardwareError(f"NVML nvmlInit failed: {exc}") from None
                self._nvml = module
                atexit.register(self.close)
            return self._nvml

    def close(self) -> None:
        """Shut NVML down if this backend started it (also run at interpreter exit)."""
        with self._lock:
            nvml, self._nvml = self._nvml, None
            if nvml is None:
                return
            atexit.unregister(self.close)
            try:
                nvml.nvmlShutdown()
            except nvml.NVMLError:
                pass  # shutting down: nothing useful to do about it

    # -- calls ------------------------------------------------------------------------------------

    def _call(self, name: str, *args: Any, gpu: int | None = None, allow: tuple[int, ...] = ()) -> Any:
        """Call ``name``; codes in ``allow`` give None, NOT_SUPPORTED raises NotSupported."""
        nvml = self._library()
        where = "" if gpu is None else f" for GPU {gpu}"
        fn = getattr(nvml, name, None)
        if fn is None:
            raise NotSupported(f"NVML {name} is not in this nvidia-ml-py")
        try:
            return fn(*args)
        except nvml.NVMLError as exc:
            code = exc.value
            if code in allow:
                return None
            if code in (NVML_ERROR_NOT_SUPPORTED, NVML_ERROR_FUNCTION_NOT_FOUND):
                raise NotSupported(f"NVML {name} is not supported{where}: {exc}") from None
            if code == NVML_ERROR_GPU_IS_LOST and gpu is not None:
                raise _GpuLost(gpu, name) from None
            raise HardwareError(f"NVML {name} failed{where}: {exc}") from None

    def _optional(self, name: str, *args: Any, gpu: int | None = None) -> Any:
        try:
            return self._call(name, *args, gpu=gpu)
        except NotSupported:
            return None

    def _first(self, names: tuple[str, ...], *args: Any, gpu: int | None = None) -> Any:
        """The first of ``names`` that this pynvml and driver provide (newest first)."""
        for name in names[:-1]:
            try:
                return self._call(name, *args, gpu=gpu)
            except NotSupported:
                continue
        return self._call(names[-1], *args, gpu=gpu)

    def _has(self, name: str) -> bool:
        return hasattr(self._library(), name)

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
        handles: list[Any] = []
        minors: dict[MigKey, int] | None = None
        for index in range(int(self._call("nvmlDeviceGetCount"))):
            try:
                handle = self._call("nvmlDeviceGetHandleByIndex", index, gpu=index)
                gpu = self._read_gpu(index, handle, cpus, words, warnings)
                if gpu.mig_mode:
                    if minors is None:
                        minors = self._mig_minors(warnings)
                    gpu = self._with_mig(gpu, handle, minors)
            except _GpuLost as lost:
                warnings.append(f"{lost}; it is left out")
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
        )

    def _read_gpu(self, index: int, handle: Any, cpus: tuple[Cpu, ...], words: int,
                  warnings: list[str]) -> Gpu:
        pci = self._call("nvmlDeviceGetPciInfo", handle, gpu=index)
        bus_text = _text(pci.busId) or _text(pci.busIdLegacy)
        try:
            bus_id = normalise_bus_id(bus_text)
        except ValueError:
            raise HardwareError(f"NVML gives GPU {index} the bus id {bus_text!r}") from None
        affinity = self._optional("nvmlDeviceGetCpuAffinity", handle, words, gpu=index)
        cpu_ids = _cpu_ids(affinity) if affinity is not None else ()
        if cpus:
            # Only CPUs a job can be given: sysfs lists the online ones, and a bundle reader
            # rejects affinity naming CPUs its CPU list lacks.
            online = {c.os_id for c in cpus}
            if dropped := [c for c in cpu_ids if c not in online]:
                warnings.append(f"GPU {index}: CPU affinity names CPUs {dropped} that are not online; "
                                "they are left out")
                cpu_ids = tuple(c for c in cpu_ids if c in online)
        mig = self._optional("nvmlDeviceGetMigMode", handle, gpu=index)
        return Gpu(
            uuid=_text(self._call("nvmlDeviceGetUUID", handle, gpu=index)),
            index=index,
            minor=int(self._call("nvmlDeviceGetMinorNumber", handle, gpu=index)),
            bus_id=bus_id,
            name=_text(self._call("nvmlDeviceGetName", handle, gpu=index)),
            memory_mib=int(self._call("nvmlDeviceGetMemoryInfo", handle, gpu=index).total) // MIB,
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
        for slot in range(int(self._call("nvmlDeviceGetMaxMigDeviceCount", handle, gpu=i))):
            mig = self._call("nvmlDeviceGetMigDeviceHandleByIndex", handle, slot, gpu=i,
                             allow=(NVML_ERROR_NOT_FOUND,))
            if mig is None:
                continue  # an empty slot: MIG devices need not be numbered contiguously
            gi = int(self._call("nvmlDeviceGetGpuInstanceId", mig, gpu=i))
            ci = int(self._call("nvmlDeviceGetComputeInstanceId", mig, gpu=i))
            attrs = self._first(("nvmlDeviceGetAttributes_v2", "nvmlDeviceGetAttributes"), mig, gpu=i)
            memory = int(attrs.memorySizeMB)
            devices.append(MigDevice(
                index=slot, gi_id=gi, ci_id=ci,
                profile=mig_profile_name(int(attrs.gpuInstanceSliceCount),
                                         int(attrs.computeInstanceSliceCount), memory),
                memory_mib=memory,
                uuid=_text(self._call("nvmlDeviceGetUUID", mig, gpu=i)),
                sm_count=int(attrs.multiprocessorCount),
                gi_minor=minors.get((gpu.minor, gi, None)),
                ci_minor=minors.get((gpu.minor, gi, ci)),
            ))
        return Gpu(gpu.uuid, gpu.index, gpu.minor, gpu.bus_id, gpu.name, gpu.memory_mib,
                   gpu.numa_node, gpu.cpu_affinity, gpu.mig_mode, tuple(devices))

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
            except _GpuLost as exc:
                warnings.append(f"{exc} while reading its links")
                lost.add(pos)
        # Without remote device types: a non-GPU remote shared by several GPUs is a switch.
        reach: dict[str, int] = {}
        for remotes in unknown:
            for bus in remotes:
                reach[bus] = reach.get(bus, 0) + 1
        for pos, remotes in enumerate(unknown):
            switch[pos] += sum(count for bus, count in remotes.items() if reach[bus] > 1)

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
        if gpu.mig_mode or not self._has("nvmlDeviceGetNvLinkState"):
            return  # NVLink queries are not supported in MIG mode
        by_bus = {g.bus_id: p for p, g in enumerate(gpus)}
        # nvidia-ml-py 11 exposed the _v2 call under its C name; later ones call it plainly.
        pci_fn = "nvmlDeviceGetNvLinkRemotePciInfo_v2"
        if not self._has(pci_fn):
            pci_fn = "nvmlDeviceGetNvLinkRemotePciInfo"
        type_fn = "nvmlDeviceGetNvLinkRemoteDeviceType"
        i = gpu.index
        for link in range(int(getattr(self._library(), "NVML_NVLINK_MAX_LINKS", 18))):
            try:
                state = self._call("nvmlDeviceGetNvLinkState", handle, link, gpu=i,
                                   allow=(NVML_ERROR_INVALID_ARGUMENT,))
            except NotSupported:
                continue
            if state is None or int(state) != NVML_FEATURE_ENABLED:
                continue
            kind = self._optional(type_fn, handle, link, gpu=i)
            if kind is not None and int(kind) == NVML_NVLINK_DEVICE_TYPE_SWITCH:
                switch[pos] += 1
                continue
            pci = self._optional(pci_fn, handle, link, gpu=i)
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
            level = self._optional("nvmlDeviceGetTopologyCommonAncestor", ha, hb, gpu=ga.index)
        except _GpuLost as exc:
            warnings.append(f"{exc} (between GPUs {ga.index} and {gb.index})")
            return Link(LinkKind.UNKNOWN)
        if level is None:
            return Link(LinkKind.UNKNOWN)
        return Link(TOPOLOGY_LEVELS.get(int(level), LinkKind.UNKNOWN))

    # -- system -----------------------------------------------------------------------------------

    def _driver_version(self) -> str | None:
        version = self._optional("nvmlSystemGetDriverVersion")
        return None if version is None else _text(version)

    def _cuda_version(self) -> str | None:
        try:
            version = self._first(("nvmlSystemGetCudaDriverVersion_v2", "nvmlSystemGetCudaDriverVersion"))
        except NotSupported:
            return None
        if not version:
            return None
        v = int(version)
        return f"{v // 1000}.{v % 1000 // 10}"


def _import_pynvml() -> Any:
    try:
        import pynvml  # on first use: importing gpuslurm must not need the package
    except ImportError:
        raise HardwareError("NVML is not available: the nvidia-ml-py package is not installed") from None
    return pynvml


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


# -- live sampling for the monitor ----------------------------------------------------------------
# The readings are plain values in hw's own terms; the replay backend (gpuslurm.hw.scenario)
# returns the same ones, and gpuslurm.watch turns them into its samples.

NVML_TEMPERATURE_GPU = 0
NVML_SUCCESS = 0


class DeviceReading(NamedTuple):
    """One GPU (``mig_uuid`` None) or MIG device at one instant; None: NVML could not say."""

    uuid: str
    mig_uuid: str | None = None
    util_pct: float | None = None
    mem_used_mib: float | None = None
    mem_total_mib: float | None = None
    power_w: float | None = None
    temp_c: float | None = None


class ProcessReading(NamedTuple):
    """A process with a context on a GPU or MIG device."""

    pid: int
    gpu_uuid: str
    mig_uuid: str | None = None
    mem_mib: float | None = None
    sm_util_pct: float | None = None


class Reading(NamedTuple):
    """One sampling pass: devices, processes, and ``(kind, subject, detail)`` of what failed."""

    devices: tuple[DeviceReading, ...]
    processes: tuple[ProcessReading, ...]
    problems: tuple[tuple[str, str, str], ...] = ()


class _Device(NamedTuple):
    gpu: int  # NVML index
    uuid: str
    handle: Any
    migs: tuple[tuple[str, Any], ...]  # (MIG UUID, handle)


class NvmlSampler:
    """Utilisation, memory, power, temperature and processes of every GPU, one pass per read().

    Devices are enumerated on the first read (handles stay valid until the driver unloads). A
    query the driver does not support is not asked again; a lost GPU or a failing call costs
    that GPU this pass and is reported as a problem, never raised.
    """

    def __init__(self, module: Any | None = None) -> None:
        self._backend = NvmlBackend(module)
        self._devices: tuple[_Device, ...] | None = None
        self._enum_problems: tuple[tuple[str, str, str], ...] = ()
        self._unsupported: set[tuple[str, int]] = set()
        self._last_seen: dict[int, int] = {}  # per GPU: newest process sample, NVML's µs clock

    def close(self) -> None:
        self._backend.close()

    def _enumerate(self) -> tuple[_Device, ...]:
        call = self._backend._call
        devices: list[_Device] = []
        problems: list[tuple[str, str, str]] = []
        for i in range(int(call("nvmlDeviceGetCount"))):
            try:
                handle = call("nvmlDeviceGetHandleByIndex", i, gpu=i)
                uuid = _text(call("nvmlDeviceGetUUID", handle, gpu=i))
                migs: list[tuple[str, Any]] = []
                mode = self._backend._optional("nvmlDeviceGetMigMode", handle, gpu=i)
                if mode is not None and int(mode[0]) == NVML_DEVICE_MIG_ENABLE:
                    for slot in range(int(call("nvmlDeviceGetMaxMigDeviceCount", handle, gpu=i))):
                        mig = call("nvmlDeviceGetMigDeviceHandleByIndex", handle, slot, gpu=i,
                                   allow=(NVML_ERROR_NOT_FOUND,))
                        if mig is not None:
                            migs.append((_text(call("nvmlDeviceGetUUID", mig, gpu=i)), mig))
            except _GpuLost as exc:
                problems.append(("gpu-lost", f"index {i}", str(exc)))
                continue
            except HardwareError as exc:
                problems.append(("nvml-error", f"index {i}", str(exc)))
                continue
            devices.append(_Device(i, uuid, handle, tuple(migs)))
        self._enum_problems = tuple(problems)
        return tuple(devices)

    def _opt(self, name: str, dev: _Device, *args: Any) -> Any:
        key = (name, dev.gpu)
        if key in self._unsupported:
            return None
        try:
            return self._backend._call(name, *args, gpu=dev.gpu)
        except NotSupported:
            self._unsupported.add(key)
            return None

    def read(self, now: float = 0.0) -> Reading:
        """Sample every device once (``now`` is unused: NVML samples the present)."""
        if self._devices is None:
            self._devices = self._enumerate()
        devices: list[DeviceReading] = []
        processes: list[ProcessReading] = []
        problems = list(self._enum_problems)
        for dev in self._devices:
            try:
                d, p = self._read_device(dev)
            except _GpuLost as exc:
                problems.append(("gpu-lost", dev.uuid, str(exc)))
                continue
            except HardwareError as exc:
                problems.append(("nvml-error", dev.uuid, str(exc)))
                continue
            devices.extend(d)
            processes.extend(p)
        return Reading(tuple(devices), tuple(processes), tuple(problems))

    def _read_device(self, dev: _Device) -> tuple[list[DeviceReading], list[ProcessReading]]:
        h = dev.handle
        util = self._opt("nvmlDeviceGetUtilizationRates", dev, h)
        mem = self._opt("nvmlDeviceGetMemoryInfo", dev, h)
        power = self._opt("nvmlDeviceGetPowerUsage", dev, h)
        temp = self._opt("nvmlDeviceGetTemperature", dev, h, NVML_TEMPERATURE_GPU)
        out = [DeviceReading(
            dev.uuid, None, None if util is None else float(util.gpu),
            None if mem is None else int(mem.used) / MIB, None if mem is None else int(mem.total) / MIB,
            None if power is None else int(power) / 1000.0, None if temp is None else float(temp))]
        procs: list[ProcessReading] = []
        if dev.migs:
            for mig_uuid, mh in dev.migs:
                mmem = self._opt("nvmlDeviceGetMemoryInfo", dev, mh)
                out.append(DeviceReading(dev.uuid, mig_uuid, None,
                                         None if mmem is None else int(mmem.used) / MIB,
                                         None if mmem is None else int(mmem.total) / MIB))
                procs.extend(self._processes(dev, mh, mig_uuid, {}))
        else:
            procs = self._processes(dev, h, None, self._sm_util(dev))
        return out, procs

    def _processes(self, dev: _Device, handle: Any, mig_uuid: str | None,
                   sm: dict[int, float]) -> list[ProcessReading]:
        seen: dict[int, ProcessReading] = {}
        for name in ("nvmlDeviceGetComputeRunningProcesses", "nvmlDeviceGetGraphicsRunningProcesses"):
            for p in self._opt(name, dev, handle) or ():
                pid = int(p.pid)
                used = getattr(p, "usedGpuMemory", None)
                if pid not in seen:
                    seen[pid] = ProcessReading(pid, dev.uuid, mig_uuid,
                                               None if used is None else int(used) / MIB, sm.get(pid))
        return list(seen.values())

    def _sm_util(self, dev: _Device) -> dict[int, float]:
        """Per-process SM utilisation from the samples NVML took since the last pass."""
        samples = None
        key = ("nvmlDeviceGetProcessUtilization", dev.gpu)
        if key not in self._unsupported:
            try:
                # NOT_FOUND (and, from some nvidia-ml-py versions, SUCCESS raised as an
                # error) mean there is no new sample: not a failure.
                samples = self._backend._call(key[0], dev.handle, self._last_seen.get(dev.gpu, 0),
                                              gpu=dev.gpu, allow=(NVML_ERROR_NOT_FOUND, NVML_SUCCESS))
            except NotSupported:
                self._unsupported.add(key)
        newest: dict[int, tuple[int, float]] = {}
        for s in samples or ():
            stamp, util = int(s.timeStamp), int(s.smUtil)
            if util <= 100 and stamp >= newest.get(int(s.pid), (-1, 0.0))[0]:
                newest[int(s.pid)] = (stamp, float(util))
            if stamp > self._last_seen.get(dev.gpu, 0):
                self._last_seen[dev.gpu] = stamp
        return {pid: util for pid, (_, util) in newest.items()}


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
    for index in range(int(backend._call("nvmlDeviceGetCount"))):
        try:
            handle = backend._call("nvmlDeviceGetHandleByIndex", index, gpu=index)
            uuid = _text(backend._call("nvmlDeviceGetUUID", handle, gpu=index))
            major, minor = backend._call("nvmlDeviceGetCudaComputeCapability", handle, gpu=index)
        except (HardwareError, _GpuLost):  # not supported, failed or lost: no entry
            continue
        out[uuid] = (int(major), int(minor))
    return out
