"""Typed, frozen values that describe one GPU node.

Every layer above ``hw`` reads these and nothing else. A GPU is its UUID; its NVML index,
``/dev/nvidiaN`` minor number and Slurm GRES index are attributes, never keys.

All are NamedTuples, not dataclasses: :mod:`dataclasses` imports :mod:`inspect`, which alone
costs about as much as an interpreter start, and this module is on the start-up path of every
command (``gpuslurm pick`` in front of each job step most of all). Change one with
``value._replace(field=...)``. Being tuples, two values of different types with equal fields
compare equal: compare like with like.
"""

from __future__ import annotations

import re
from enum import StrEnum

from gpuslurm.hw.model.devfiles import mig_device_files
from gpuslurm.tuples import TYPE_CHECKING, NamedTuple


class LinkKind(StrEnum):
    """How two GPUs reach each other, as ``nvidia-smi topo -m`` names it (best first)."""

    SELF = "X"
    NVLINK = "NV"
    PIX = "PIX"  # at most one PCIe bridge
    PXB = "PXB"  # several PCIe bridges, no host bridge
    PHB = "PHB"  # through a PCIe host bridge (the CPU)
    NODE = "NODE"  # between host bridges within one NUMA node
    SYS = "SYS"  # across the SMP interconnect between NUMA nodes
    UNKNOWN = "N/A"


class Link(NamedTuple):
    """The connection from one GPU to another; ``nvlinks`` counts bonded NVLinks."""

    kind: LinkKind
    nvlinks: int = 0

    def __str__(self) -> str:
        if self.kind is LinkKind.NVLINK:
            return f"NV{self.nvlinks}"
        return str(self.kind.value)


SELF_LINK = Link(LinkKind.SELF)


def link_from_text(text: str) -> Link:
    """Parse one cell of a topo matrix: ``X``, ``NV12``, ``PIX`` …"""
    t = text.strip()
    if t == "X":
        return Link(LinkKind.SELF)
    if t.startswith("NV") and t[2:].isascii() and t[2:].isdigit() and len(t) <= 6:
        return Link(LinkKind.NVLINK, int(t[2:]))
    try:
        return Link(LinkKind(t))
    except ValueError:
        raise ValueError(f"unknown link kind {t!r}") from None


class Cpu(NamedTuple):
    """One logical CPU: OS id, physical core id (as lscpu numbers it), socket, NUMA node.

    Light tuples rather than dataclasses: a node has hundreds, and class creation is on the
    start-up path of every command.
    """

    os_id: int
    core: int
    socket: int
    numa_node: int | None = None


# A MIG profile name: optional "<c>c." compute slices, "<g>g.<mem>gb", optional "+me" style suffix.
_MIG_PROFILE = r"^(?:(?P<c>\d+)c\.)?(?P<g>\d+)g\.(?P<mem>\d+)gb(?P<suffix>(?:\+[a-z.]+)*)$"

if TYPE_CHECKING:
    MIG_PROFILE_RE: re.Pattern[str]


def __getattr__(name: str) -> re.Pattern[str]:
    # MIG_PROFILE_RE is compiled on first use: every hook loads this module, none matches a profile
    if name == "MIG_PROFILE_RE":
        pattern: re.Pattern[str] = re.compile(_MIG_PROFILE)
        globals()[name] = pattern
        return pattern
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


class MigDevice(NamedTuple):
    """One MIG device (a compute instance inside a GPU instance)."""

    # under its parent, as nvidia-smi -L and NVML number them; shadows tuple.index on purpose
    index: int  # type: ignore[assignment]
    gi_id: int
    ci_id: int
    profile: str  # e.g. "3g.40gb" or "1c.3g.71gb"; checked against MIG_PROFILE_RE
    memory_mib: int
    uuid: str | None = None  # "MIG-…"; None when the capture does not carry it
    sm_count: int | None = None
    gi_minor: int | None = None  # /dev/nvidia-caps/nvidia-cap<gi_minor>, from mig-minors
    ci_minor: int | None = None  # /dev/nvidia-caps/nvidia-cap<ci_minor>

    @property
    def gi_slices(self) -> int:
        """GPU-instance slice count (the ``g`` of the profile), as NVML's attributes give it."""
        m = re.match(_MIG_PROFILE, self.profile)
        if m is None:
            raise ValueError(f"unknown MIG profile {self.profile!r}")
        return int(m.group("g"))

    def device_files(self, parent_minor: int) -> tuple[str, ...]:
        """The device files a job needs for this MIG device (parent GPU, GI cap, CI cap)."""
        return mig_device_files(parent_minor, self.gi_minor, self.ci_minor)


class Gpu(NamedTuple):
    """One physical GPU."""

    uuid: str
    index: int  # type: ignore[assignment]  # NVML index = PCI bus order (shadows tuple.index)
    minor: int  # /dev/nvidia<minor>
    bus_id: str  # normalised "0000:81:00.0" style, domain 8 hex digits as NVML prints it
    name: str  # NVML device name, e.g. "NVIDIA H100 80GB HBM3"
    memory_mib: int
    numa_node: int | None = None
    cpu_affinity: tuple[int, ...] = ()  # OS CPU ids close to the GPU; () when unknown
    mig_mode: bool | None = None  # None: MIG not supported by this GPU
    mig_devices: tuple[MigDevice, ...] = ()

    @property
    def device_file(self) -> str:
        return f"/dev/nvidia{self.minor}"


class Node(NamedTuple):
    """Everything gpuslurm knows about one node, from NVML or from a capture bundle.

    ``links`` is a square matrix in the order of ``gpus`` (index order), or ``None`` when the
    source carries no link facts. ``warnings`` records what a loader decided about odd input
    (placeholder UUIDs, attached_gpus disagreeing with the GPU list) so commands can show it.
    """

    hostname: str
    gpus: tuple[Gpu, ...]
    cpus: tuple[Cpu, ...] = ()
    links: tuple[tuple[Link, ...], ...] | None = None
    driver_version: str | None = None
    cuda_version: str | None = None
    memory_mib: int | None = None  # host RAM, for slurm.conf RealMemory
    source: str = ""  # where the facts came from, e.g. "replay:/path" or "nvml"
    warnings: tuple[str, ...] = ()
    # NVML indices of GPUs that answered GPU_IS_LOST while the node was read: not in ``gpus``
    # (no UUID to name them), but a health check must still see them
    lost: tuple[int, ...] = ()

    def gpu(self, uuid: str) -> Gpu:
        for g in self.gpus:
            if g.uuid == uuid:
                return g
        raise KeyError(uuid)

    def link(self, a: Gpu, b: Gpu) -> Link:
        if self.links is None:
            return Link(LinkKind.UNKNOWN)
        return self.links[self.gpus.index(a)][self.gpus.index(b)]


def normalise_bus_id(bus_id: str) -> str:
    """Bring a PCI bus id to NVML's form ``00000000:81:00.0`` (8-digit domain, upper case)."""
    text = bus_id.strip()
    parts = text.split(":")
    if len(parts) == 2:  # "81:00.0" without domain
        parts = ["0", *parts]
    if len(parts) != 3 or "." not in parts[2]:
        raise ValueError(f"not a PCI bus id: {bus_id!r}")
    domain, bus, devfn = parts
    dev, fn = devfn.split(".", 1)
    return f"{int(domain, 16):08X}:{int(bus, 16):02X}:{int(dev, 16):02X}.{int(fn, 16):X}"


def autodetect_type(gpu_name: str) -> str:
    """The GRES Type Slurm's AutoDetect=nvml derives from a device name.

    Slurm lower-cases the NVML name and turns spaces into underscores, so
    "NVIDIA H100 80GB HBM3" becomes "nvidia_h100_80gb_hbm3".
    """
    return gpu_name.strip().replace(" ", "_").lower()


def autodetect_mig_type(gpu_name: str, mig: MigDevice) -> str:
    """The GRES Type Slurm's AutoDetect=nvml gives a MIG device.

    Slurm cuts the parent's name at its first '-', then appends ``_<GI slices>g.<GiB>gb`` with
    the MIG device's memory rounded to whole GiB ("NVIDIA A100-SXM4-80GB", 3g with 40192 MiB →
    "nvidia_a100_3g.39gb"). Both compute instances of one GPU instance get the same type.
    """
    base = gpu_name.split("-", 1)[0]
    gib = int(mig.memory_mib / 1024 + 0.5)  # round half away from zero, as roundl() does
    return autodetect_type(f"{base}_{mig.gi_slices}g.{gib}gb")
