"""A stand-in for the ``pynvml`` module (nvidia-ml-py), driven by a description of a node.

Reading nodes, samples and health through NVML, and which calls gpuslurm makes (counted at the
real pynvml's door, tests/helpers/nvml_calls.py), are tested with the real pynvml against the replay
library (tests/nvml). This stand-in is kept only for what that library cannot serve:

* injected failures: ``init_error`` (DRIVER_NOT_LOADED, NO_PERMISSION, LIBRARY_NOT_FOUND from
  nvmlInit; the library fails init only with UNKNOWN), ``errors`` (any code from any call, e.g.
  NO_PERMISSION from nvmlDeviceGetMinorNumber, NOT_SUPPORTED from nvmlDeviceGetUUID, UNKNOWN
  from the temperature) and a GPU lost at ``nvmlDeviceGetHandleByIndex`` (``"lost": "handle"``;
  the library's lost GPU still has a handle);
* functions absent from nvidia-ml-py itself (``absent``: an AttributeError, not FUNCTION_NOT_FOUND),
  and an old nvidia-ml-py without the MIG profile table;
* node shapes the library's nvml.json has no field for: an NVLink that is down between active
  ones, MIG slots with holes, an arbitrary PCIe level per GPU pair (``topology``), an affinity
  matched to a /sys tree of the test's making (tests/hw/test_nvml.py), a process sample out of
  range (tests/watch/test_nvml_sampling.py);
* a capture whose NVML fails while the stand-in nvidia-smi answers (tests/hw/test_capture.py).

Users: tests/hw/test_nvml.py, tests/hw/test_capture.py, tests/watch/test_nvml_sampling.py. NVML
events are served by the library (tests/hw/nvml/replay_events.c, tests/hw/nvml/test_events.py).

It follows nvidia-ml-py 12/13 as installed: ``NVMLError(value)`` maps the value onto a subclass,
handles are opaque, strings come back as ``str`` (the package decodes them), structures are
objects with the C field names (``busId`` is ``bytes``), ``nvmlDeviceGetCpuAffinity`` returns an
array of 64-bit words, every call before ``nvmlInit`` fails with UNINITIALIZED, and
``nvmlDeviceGetNvLinkRemotePciInfo`` is the name of the ``_v2`` C call.

Build one with :func:`build` from a list of GPU dicts::

    {"uuid": "GPU-…", "name": "NVIDIA H100 80GB HBM3", "minor": 0, "bus_id": "00000000:18:00.0",
     "memory_mib": 81559, "affinity": [0, 1, 2], "mig": None | False | True,
     "mig_devices": [{"index": 0, "uuid": "MIG-…", "gi": 2, "ci": 0, "gi_slices": 3,
                      "ci_slices": 3, "memory_mib": 40448, "sm": 60}],
     "nvlinks": ["00000000:19:00.0", "switch", ("00000000:19:00.0", False)],  # (remote, active)
     "numa": 0, "gpu_numa_id": None, "lost": False}

Scenarios: ``absent`` names functions this "pynvml" lacks (an old nvidia-ml-py), ``unavailable``
names functions that raise FUNCTION_NOT_FOUND (a new nvidia-ml-py on an old driver),
``init_error`` makes ``nvmlInit`` fail (no driver), ``errors`` makes named calls fail with a
code, and a GPU with ``"lost": True`` answers every query with GPU_IS_LOST (``"lost": "handle"``:
already ``nvmlDeviceGetHandleByIndex`` does).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

NVML_SUCCESS = 0
NVML_ERROR_UNINITIALIZED = 1
NVML_ERROR_INVALID_ARGUMENT = 2
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_NO_PERMISSION = 4
NVML_ERROR_NOT_FOUND = 6
NVML_ERROR_DRIVER_NOT_LOADED = 9
NVML_ERROR_LIBRARY_NOT_FOUND = 12
NVML_ERROR_FUNCTION_NOT_FOUND = 13
NVML_ERROR_GPU_IS_LOST = 15
NVML_ERROR_UNKNOWN = 999

NVML_TOPOLOGY_INTERNAL = 0
NVML_TOPOLOGY_SINGLE = 10
NVML_TOPOLOGY_MULTIPLE = 20
NVML_TOPOLOGY_HOSTBRIDGE = 30
NVML_TOPOLOGY_NODE = 40
NVML_TOPOLOGY_SYSTEM = 50

NVML_NVLINK_MAX_LINKS = 18  # 36 in nvidia-ml-py 13; 18 keeps the loops short and is still > any GPU here
NVML_NVLINK_DEVICE_TYPE_GPU = 0x00
NVML_NVLINK_DEVICE_TYPE_IBMNPU = 0x01
NVML_NVLINK_DEVICE_TYPE_SWITCH = 0x02
NVML_NVLINK_DEVICE_TYPE_UNKNOWN = 0xFF

NVML_DEVICE_MIG_DISABLE = 0
NVML_DEVICE_MIG_ENABLE = 1
NVML_FEATURE_DISABLED = 0
NVML_FEATURE_ENABLED = 1

_NAMES = {
    NVML_ERROR_UNINITIALIZED: "Uninitialized",
    NVML_ERROR_INVALID_ARGUMENT: "Invalid Argument",
    NVML_ERROR_NOT_SUPPORTED: "Not Supported",
    NVML_ERROR_NO_PERMISSION: "Insufficient Permissions",
    NVML_ERROR_NOT_FOUND: "Not Found",
    NVML_ERROR_DRIVER_NOT_LOADED: "Driver Not Loaded",
    NVML_ERROR_LIBRARY_NOT_FOUND: "NVML Shared Library Not Found",
    NVML_ERROR_FUNCTION_NOT_FOUND: "Function Not Found",
    NVML_ERROR_GPU_IS_LOST: "GPU is lost",
    NVML_ERROR_UNKNOWN: "Unknown Error",
}


class NVMLError(Exception):
    """Like pynvml's: ``NVMLError(value)`` returns the subclass for ``value``; ``.value`` is the code."""

    _by_value: dict[int, type[NVMLError]] = {}  # noqa: RUF012 - filled once below
    value: int

    def __new__(cls, value: int) -> NVMLError:
        if cls is NVMLError:
            cls = NVMLError._by_value.get(value, cls)
        obj = Exception.__new__(cls)
        obj.value = value
        return obj

    def __init__(self, value: int) -> None:
        super().__init__(value)

    def __str__(self) -> str:
        return _NAMES.get(self.value, f"NVML Error with code {self.value}")


def _subclass(value: int, name: str) -> type[NVMLError]:
    cls = type(name, (NVMLError,), {})
    NVMLError._by_value[value] = cls
    return cls


NVMLError_NotSupported = _subclass(NVML_ERROR_NOT_SUPPORTED, "NVMLError_NotSupported")
NVMLError_NotFound = _subclass(NVML_ERROR_NOT_FOUND, "NVMLError_NotFound")
NVMLError_GpuIsLost = _subclass(NVML_ERROR_GPU_IS_LOST, "NVMLError_GpuIsLost")
NVMLError_FunctionNotFound = _subclass(NVML_ERROR_FUNCTION_NOT_FOUND, "NVMLError_FunctionNotFound")
NVMLError_LibraryNotFound = _subclass(NVML_ERROR_LIBRARY_NOT_FOUND, "NVMLError_LibraryNotFound")
NVMLError_Uninitialized = _subclass(NVML_ERROR_UNINITIALIZED, "NVMLError_Uninitialized")


@dataclass(frozen=True)
class Handle:
    """An opaque device handle: a GPU (``mig`` None) or one MIG device of it."""

    gpu: int
    mig: int | None = None


@dataclass
class PciInfo:
    busId: bytes  # noqa: N815 - NVML's field names
    busIdLegacy: bytes  # noqa: N815
    domain: int
    bus: int
    device: int
    pciDeviceId: int = 0x233010DE  # noqa: N815
    pciSubSystemId: int = 0  # noqa: N815


@dataclass
class Memory:
    total: int
    free: int
    used: int
    reserved: int = 0
    version: int = 0


@dataclass
class DeviceAttributes:
    multiprocessorCount: int  # noqa: N815
    sharedCopyEngineCount: int  # noqa: N815
    sharedDecoderCount: int  # noqa: N815
    sharedEncoderCount: int  # noqa: N815
    sharedJpegCount: int  # noqa: N815
    sharedOfaCount: int  # noqa: N815
    gpuInstanceSliceCount: int  # noqa: N815
    computeInstanceSliceCount: int  # noqa: N815
    memorySizeMB: int  # noqa: N815


def pci_info(bus_id: str) -> PciInfo:
    domain, bus, devfn = bus_id.split(":")
    dev = devfn.split(".")[0]
    legacy = f"{int(domain, 16):04X}:{bus}:{devfn}"
    return PciInfo(bus_id.encode(), legacy.encode(), int(domain, 16), int(bus, 16), int(dev, 16))


MIB = 1024 * 1024
MAX_MIG_DEVICES = 7


@dataclass
class FakeNvml:
    """The module object handed to ``NvmlBackend(module=…)``."""

    gpus: list[dict[str, Any]]
    driver_version: str = "550.54.15"
    cuda_version: int = 12040
    topology: Callable[[int, int], int] | None = None
    absent: frozenset[str] = frozenset()
    unavailable: frozenset[str] = frozenset()
    init_error: int | None = None
    errors: dict[str, int] = field(default_factory=dict)  # function name → NVML code it fails with
    switch_bus_id: str = "00000000:C5:00.0"
    calls: list[str] = field(default_factory=list)
    _initialised: int = 0

    def __getattribute__(self, name: str) -> Any:
        if name.startswith("nvml") and name in object.__getattribute__(self, "absent"):
            raise AttributeError(name)
        return object.__getattribute__(self, name)

    NVMLError = NVMLError

    # -- plumbing ---------------------------------------------------------------------------------

    def _enter(self, name: str) -> None:
        self.calls.append(name)
        if name in self.unavailable:
            raise NVMLError(NVML_ERROR_FUNCTION_NOT_FOUND)
        if not self._initialised:
            raise NVMLError(NVML_ERROR_UNINITIALIZED)
        if name in self.errors:
            raise NVMLError(self.errors[name])

    def _gpu(self, name: str, handle: Handle) -> dict[str, Any]:
        self._enter(name)
        if not isinstance(handle, Handle) or handle.gpu >= len(self.gpus):
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        gpu = self.gpus[handle.gpu]
        if gpu.get("lost"):
            raise NVMLError(NVML_ERROR_GPU_IS_LOST)
        return gpu

    def _mig(self, handle: Handle) -> dict[str, Any] | None:
        if handle.mig is None:
            return None
        for m in self.gpus[handle.gpu].get("mig_devices") or ():
            if m["index"] == handle.mig:
                return dict(m)
        raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)

    def _links(self, name: str, handle: Handle, link: int) -> tuple[str, bool]:
        gpu = self._gpu(name, handle)
        if handle.mig is not None or gpu.get("mig"):
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)  # "not supported for devices in MIG mode"
        links = gpu.get("nvlinks")
        if not links:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        if not 0 <= link < len(links):
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        spec = links[link]
        remote, active = spec if isinstance(spec, tuple) else (spec, True)
        return remote, active

    # -- library ----------------------------------------------------------------------------------

    def nvmlInit(self) -> None:  # noqa: N802 - NVML's names
        if self.init_error is not None:
            raise NVMLError(self.init_error)
        self._initialised += 1

    def nvmlShutdown(self) -> None:  # noqa: N802
        if not self._initialised:
            raise NVMLError(NVML_ERROR_UNINITIALIZED)
        self._initialised -= 1

    def nvmlSystemGetDriverVersion(self) -> str:  # noqa: N802
        self._enter("nvmlSystemGetDriverVersion")
        return self.driver_version

    def nvmlSystemGetCudaDriverVersion(self) -> int:  # noqa: N802
        self._enter("nvmlSystemGetCudaDriverVersion")
        return self.cuda_version

    def nvmlSystemGetCudaDriverVersion_v2(self) -> int:  # noqa: N802
        self._enter("nvmlSystemGetCudaDriverVersion_v2")
        return self.cuda_version

    # -- devices ----------------------------------------------------------------------------------

    def nvmlDeviceGetCount(self) -> int:  # noqa: N802
        self._enter("nvmlDeviceGetCount")
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> Handle:  # noqa: N802
        self._enter("nvmlDeviceGetHandleByIndex")
        if not 0 <= index < len(self.gpus):
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        if self.gpus[index].get("lost") == "handle":
            raise NVMLError(NVML_ERROR_GPU_IS_LOST)
        return Handle(index)

    def nvmlDeviceGetCudaComputeCapability(self, handle: Handle) -> tuple[int, int]:  # noqa: N802
        gpu = self._gpu("nvmlDeviceGetCudaComputeCapability", handle)
        if "cc" not in gpu:  # a GPU dict without "cc": the driver does not say
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        return tuple(gpu["cc"])  # type: ignore[return-value]

    def nvmlDeviceGetUUID(self, handle: Handle) -> str:  # noqa: N802
        gpu = self._gpu("nvmlDeviceGetUUID", handle)
        mig = self._mig(handle)
        return str(mig["uuid"] if mig else gpu["uuid"])

    def nvmlDeviceGetName(self, handle: Handle) -> str:  # noqa: N802
        return str(self._gpu("nvmlDeviceGetName", handle)["name"])

    def nvmlDeviceGetMinorNumber(self, handle: Handle) -> int:  # noqa: N802
        return int(self._gpu("nvmlDeviceGetMinorNumber", handle)["minor"])

    def nvmlDeviceGetPciInfo(self, handle: Handle) -> PciInfo:  # noqa: N802
        return pci_info(self._gpu("nvmlDeviceGetPciInfo", handle)["bus_id"])

    def nvmlDeviceGetMemoryInfo(self, handle: Handle, version: int | None = None) -> Memory:  # noqa: N802
        gpu = self._gpu("nvmlDeviceGetMemoryInfo", handle)
        mig = self._mig(handle)
        total = int((mig or gpu)["memory_mib"]) * MIB
        return Memory(total=total, free=total, used=0, version=version or 0)

    def nvmlDeviceGetCpuAffinity(self, handle: Handle, cpuSetSize: int) -> list[int]:  # noqa: N802, N803
        gpu = self._gpu("nvmlDeviceGetCpuAffinity", handle)
        words = [0] * cpuSetSize
        for cpu in gpu.get("affinity") or ():
            if cpu // 64 < cpuSetSize:  # NVML silently truncates to the buffer it is given
                words[cpu // 64] |= 1 << (cpu % 64)
        return words

    def nvmlDeviceGetNumaNodeId(self, handle: Handle) -> int:  # noqa: N802
        gpu = self._gpu("nvmlDeviceGetNumaNodeId", handle)
        if gpu.get("gpu_numa_id") is None:  # only GPUs whose memory is a NUMA node have one
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        return int(gpu["gpu_numa_id"])

    def nvmlDeviceGetTopologyCommonAncestor(self, a: Handle, b: Handle) -> int:  # noqa: N802
        ga = self._gpu("nvmlDeviceGetTopologyCommonAncestor", a)
        gb = self._gpu("nvmlDeviceGetTopologyCommonAncestor", b)
        if self.topology is not None:
            return self.topology(a.gpu, b.gpu)
        same = ga.get("numa", 0) == gb.get("numa", 0)
        return NVML_TOPOLOGY_NODE if same else NVML_TOPOLOGY_SYSTEM

    # -- NVLink -----------------------------------------------------------------------------------

    def nvmlDeviceGetNvLinkState(self, handle: Handle, link: int) -> int:  # noqa: N802
        active = self._links("nvmlDeviceGetNvLinkState", handle, link)[1]
        return NVML_FEATURE_ENABLED if active else NVML_FEATURE_DISABLED

    def nvmlDeviceGetNvLinkRemotePciInfo(self, handle: Handle, link: int) -> PciInfo:  # noqa: N802
        remote, _ = self._links("nvmlDeviceGetNvLinkRemotePciInfo", handle, link)
        return pci_info(self.switch_bus_id if remote == "switch" else remote)

    def nvmlDeviceGetNvLinkRemoteDeviceType(self, handle: Handle, link: int) -> int:  # noqa: N802
        remote, _ = self._links("nvmlDeviceGetNvLinkRemoteDeviceType", handle, link)
        return NVML_NVLINK_DEVICE_TYPE_SWITCH if remote == "switch" else NVML_NVLINK_DEVICE_TYPE_GPU

    # -- MIG --------------------------------------------------------------------------------------

    def nvmlDeviceGetMigMode(self, handle: Handle) -> list[int]:  # noqa: N802
        gpu = self._gpu("nvmlDeviceGetMigMode", handle)
        if gpu.get("mig") is None:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        mode = NVML_DEVICE_MIG_ENABLE if gpu["mig"] else NVML_DEVICE_MIG_DISABLE
        return [mode, mode]

    def nvmlDeviceGetMaxMigDeviceCount(self, handle: Handle) -> int:  # noqa: N802
        gpu = self._gpu("nvmlDeviceGetMaxMigDeviceCount", handle)
        if gpu.get("mig") is None:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        return MAX_MIG_DEVICES

    def nvmlDeviceGetMigDeviceHandleByIndex(self, handle: Handle, index: int) -> Handle:  # noqa: N802
        gpu = self._gpu("nvmlDeviceGetMigDeviceHandleByIndex", handle)
        if gpu.get("mig") is None:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        if not 0 <= index < MAX_MIG_DEVICES:
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        if not gpu["mig"] or all(m["index"] != index for m in gpu.get("mig_devices") or ()):
            raise NVMLError(NVML_ERROR_NOT_FOUND)
        return Handle(handle.gpu, index)

    def _mig_only(self, name: str, handle: Handle) -> dict[str, Any]:
        self._gpu(name, handle)
        mig = self._mig(handle)
        if mig is None:
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        return mig

    def nvmlDeviceGetGpuInstanceId(self, handle: Handle) -> int:  # noqa: N802
        return int(self._mig_only("nvmlDeviceGetGpuInstanceId", handle)["gi"])

    def nvmlDeviceGetComputeInstanceId(self, handle: Handle) -> int:  # noqa: N802
        return int(self._mig_only("nvmlDeviceGetComputeInstanceId", handle)["ci"])

    def nvmlDeviceGetAttributes_v2(self, handle: Handle) -> DeviceAttributes:  # noqa: N802
        return self._attributes("nvmlDeviceGetAttributes_v2", handle)

    def nvmlDeviceGetAttributes(self, handle: Handle) -> DeviceAttributes:  # noqa: N802
        return self._attributes("nvmlDeviceGetAttributes", handle)

    def _attributes(self, name: str, handle: Handle) -> DeviceAttributes:
        m = self._mig_only(name, handle)
        return DeviceAttributes(
            multiprocessorCount=int(m.get("sm", 0)), sharedCopyEngineCount=1, sharedDecoderCount=0,
            sharedEncoderCount=0, sharedJpegCount=0, sharedOfaCount=0,
            gpuInstanceSliceCount=int(m["gi_slices"]),
            computeInstanceSliceCount=int(m.get("ci_slices", m["gi_slices"])),
            memorySizeMB=int(m["memory_mib"]),
        )


for _name, _value in list(globals().items()):
    if _name.startswith("NVML_"):  # the module's constants, reachable as attributes like pynvml's
        setattr(FakeNvml, _name, _value)


def build(gpus: Iterable[dict[str, Any]], **options: Any) -> FakeNvml:
    """A fresh stand-in for one node; ``options`` are FakeNvml's fields (absent, unavailable, …)."""
    for key in ("absent", "unavailable"):
        if key in options:
            options[key] = frozenset(options[key])
    return FakeNvml(gpus=[dict(g) for g in gpus], **options)


# -- ready-made nodes -----------------------------------------------------------------------------

def uuid(n: int, prefix: str = "GPU") -> str:
    return f"{prefix}-{n:08x}-1111-2222-3333-444455556666"


def dgx_h100() -> list[dict[str, Any]]:
    """Eight H100 SXM, 18 NVLinks each, all to NVSwitches; two sockets of 56 cores with SMT."""
    buses = ["18", "2A", "3A", "5D", "9A", "AB", "BA", "DB"]
    out = []
    for i, bus in enumerate(buses):
        socket = i // 4
        cpus = [c for c in range(224) if (c % 112) // 56 == socket]
        out.append({
            "uuid": uuid(i), "name": "NVIDIA H100 80GB HBM3", "minor": i,
            "bus_id": f"00000000:{bus}:00.0", "memory_mib": 81559, "affinity": cpus,
            "mig": False, "nvlinks": ["switch"] * 18, "numa": socket,
        })
    return out


def pcie_pair_minor_swapped() -> list[dict[str, Any]]:
    """Two RTX A5000 on PCIe where NVML index 0 is /dev/nvidia1 (as in dual_a5000-v13.xml)."""
    return [
        {"uuid": uuid(0xA0), "name": "NVIDIA RTX A5000", "minor": 1, "bus_id": "00000000:81:00.0",
         "memory_mib": 24564, "affinity": list(range(0, 16)), "mig": None, "numa": 0},
        {"uuid": uuid(0xA1), "name": "NVIDIA RTX A5000", "minor": 0, "bus_id": "00000000:C1:00.0",
         "memory_mib": 24564, "affinity": list(range(16, 32)), "mig": None, "numa": 1},
    ]


def h200_mig() -> list[dict[str, Any]]:
    """One H200 with the MIG layout of h200-mig__590.48.01.txt (two CIs share GI 2; a hole at 2)."""
    return [{
        "uuid": uuid(0xC8), "name": "NVIDIA H200", "minor": 0, "bus_id": "00000000:83:00.0",
        "memory_mib": 143771, "affinity": list(range(8)), "mig": True, "numa": 0,
        "mig_devices": [
            {"index": 0, "uuid": uuid(0, "MIG"), "gi": 2, "ci": 0, "gi_slices": 3, "ci_slices": 1,
             "memory_mib": 71424, "sm": 16},
            {"index": 1, "uuid": uuid(1, "MIG"), "gi": 2, "ci": 1, "gi_slices": 3, "ci_slices": 2,
             "memory_mib": 71424, "sm": 32},
            {"index": 3, "uuid": uuid(3, "MIG"), "gi": 3, "ci": 0, "gi_slices": 2, "ci_slices": 2,
             "memory_mib": 33280, "sm": 32},
            {"index": 4, "uuid": uuid(4, "MIG"), "gi": 9, "ci": 0, "gi_slices": 1, "ci_slices": 1,
             "memory_mib": 16384, "sm": 16},
        ],
    }]


# -- live sampling (the monitor) ------------------------------------------------------------------

@dataclass
class SamplingNvml(FakeNvml):
    """``activity[gpu index]``: util, used_mib, power_mw, temp, procs [(pid, used_mib, mig index)],
    samples [(pid, timestamp, sm)]."""

    activity: dict[int, dict[str, Any]] = field(default_factory=dict)

    def _act(self, name: str, handle: Handle) -> dict[str, Any]:
        self._gpu(name, handle)
        return self.activity.get(handle.gpu, {})

    def nvmlDeviceGetUtilizationRates(self, handle: Handle) -> Any:  # noqa: N802
        return SimpleNamespace(gpu=self._act("nvmlDeviceGetUtilizationRates", handle)["util"], memory=0)

    def nvmlDeviceGetMemoryInfo(self, handle: Handle, version: int | None = None) -> Memory:  # noqa: N802
        mem = super().nvmlDeviceGetMemoryInfo(handle, version)
        used = self.activity.get(handle.gpu, {}).get("used_mib", 0) * MIB
        return Memory(total=mem.total, free=mem.total - used, used=used)

    def nvmlDeviceGetPowerUsage(self, handle: Handle) -> int:  # noqa: N802
        return int(self._act("nvmlDeviceGetPowerUsage", handle)["power_mw"])

    def nvmlDeviceGetTemperature(self, handle: Handle, sensor: int) -> int:  # noqa: N802
        return int(self._act("nvmlDeviceGetTemperature", handle)["temp"])

    def nvmlDeviceGetComputeRunningProcesses(self, handle: Handle) -> list[Any]:  # noqa: N802
        procs = self._act("nvmlDeviceGetComputeRunningProcesses", handle).get("procs", [])
        return [SimpleNamespace(pid=pid, usedGpuMemory=None if mib is None else mib * MIB)
                for pid, mib, mig in procs if mig == handle.mig]

    def nvmlDeviceGetGraphicsRunningProcesses(self, handle: Handle) -> list[Any]:  # noqa: N802
        self._gpu("nvmlDeviceGetGraphicsRunningProcesses", handle)
        raise NVMLError(NVML_ERROR_NOT_SUPPORTED)

    def nvmlDeviceGetProcessUtilization(self, handle: Handle, stamp: int) -> list[Any]:  # noqa: N802
        act = self._act("nvmlDeviceGetProcessUtilization", handle)
        found = [SimpleNamespace(pid=p, timeStamp=t, smUtil=sm, memUtil=0)
                 for p, t, sm in act.get("samples", []) if t > stamp]
        if not found:
            raise NVMLError(NVML_ERROR_NOT_FOUND)
        return found
