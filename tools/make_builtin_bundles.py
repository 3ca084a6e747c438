#!/usr/bin/env python3
"""Write the built-in capture bundles under ``src/gpuslurm/hw/builtin/``.

The bundles describe three well-known node shapes (DGX H100, a 4x L40S PCIe server, an A100 node
with MIG) from public facts; ``src/gpuslurm/hw/builtin/README.md`` lists where each fact comes
from. Output is deterministic, so a reviewer can regenerate and diff:

    python tools/make_builtin_bundles.py            # rewrite the bundles
    python tools/make_builtin_bundles.py --check    # exit 1 if the files on disk differ

UUIDs and serial numbers are synthetic (uuid5 of a fixed namespace), never taken from a machine.
"""

from __future__ import annotations

import argparse
import sys
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from xml.sax.saxutils import escape, quoteattr

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
from gpuslurm.hw.formats.mig_minors import mig_minors_text
from gpuslurm.ranges import format_ranges

DEFAULT_OUT = Path(__file__).resolve().parents[1] / "src" / "gpuslurm" / "hw" / "builtin"
UUID_NAMESPACE = uuid.uuid5(uuid.NAMESPACE_URL, "https://gpuslurm.invalid/builtin-bundles")

# The driver keeps capability minors for 32 GPU minors whatever is installed
# (the MIG user guide's listing ends at gpu31/gi14/ci7/access 4322).
MIG_MINOR_GPU_SLOTS = 32

Cpus = tuple[tuple[int, int, int, int], ...]  # (cpu, core, socket, node) as lscpu -p prints them


@dataclass(frozen=True)
class Product:
    name: str
    architecture: str
    device_id: str  # pci_device_id as nvidia-smi prints it
    subsystem_id: str
    vbios: str
    board_part: str
    fb_mib: int
    fb_reserved_mib: int
    bar1_mib: int
    pcie_gen: int


@dataclass(frozen=True)
class Mig:
    profile: str
    gi: int
    ci: int
    sms: int
    memory_mib: int
    copy_engines: int
    decoders: int
    bar1_mib: int


@dataclass(frozen=True)
class GpuSpec:
    bus: int  # PCI bus number; domain 0, device 0, function 0
    minor: int
    module_id: int
    numa: int
    affinity: tuple[int, ...]
    mig_mode: bool | None = None  # None: the product has no MIG
    migs: tuple[Mig, ...] = ()

    @property
    def bus_id(self) -> str:
        return f"00000000:{self.bus:02X}:00.0"


@dataclass(frozen=True)
class Bundle:
    name: str
    hostname: str
    driver: str
    cuda: str
    timestamp: str
    product: Product
    gpus: tuple[GpuSpec, ...]  # NVML index order = PCI bus order
    gpu_links: tuple[tuple[str, ...], ...]
    nics: tuple[str, ...]  # RDMA device names, NIC0…
    gpu_nic_links: tuple[tuple[str, ...], ...]  # [gpu][nic]
    nic_links: tuple[tuple[str, ...], ...]
    cpus: Cpus
    mem_total_kib: int
    ansi_header: bool = False  # nvidia-smi underlines the topo header with ANSI escapes

    def gpu_uuid(self, i: int) -> str:
        return "GPU-" + str(uuid.uuid5(UUID_NAMESPACE, f"{self.name}/{self.gpus[i].bus_id}"))

    def mig_uuid(self, i: int, mig: Mig) -> str:
        key = f"{self.name}/{self.gpus[i].bus_id}/gi{mig.gi}/ci{mig.ci}"
        return "MIG-" + str(uuid.uuid5(UUID_NAMESPACE, key))

    def serial(self, i: int) -> str:
        return str(1_650_000_000_000 + uuid.uuid5(UUID_NAMESPACE, self.gpu_uuid(i)).int % 10**9)


# ---------------------------------------------------------------------------------------- CPUs


def cpu_list(ids: Sequence[int]) -> str:
    """Kernel-style list as nvidia-smi prints it: ranges only for consecutive ids."""
    return format_ranges(ids)


def node_cpus(cpus: Cpus, node: int) -> tuple[int, ...]:
    """The OS ids of one NUMA node's CPUs: what topo -m prints as a GPU's CPU Affinity."""
    return tuple(cpu for cpu, _core, _socket, n in cpus if n == node)


def intel_blocked(sockets: int, cores: int) -> Cpus:
    """Linux's usual order on Intel: socket 0's cores, socket 1's cores, then their HT siblings."""
    total = sockets * cores
    return tuple((n, n % total, (n % total) // cores, (n % total) // cores) for n in range(2 * total))


def interleaved(sockets: int, cores: int) -> Cpus:
    """Firmware that enumerates sockets round-robin: CPU n sits on socket n % sockets.

    lscpu numbers cores in order of first appearance, so core = n % (sockets*cores); the HT
    sibling of CPU n is n + sockets*cores.
    """
    total = sockets * cores
    return tuple((n, n % total, n % sockets, n % sockets) for n in range(2 * total))


def epyc_nps4(sockets: int, cores: int) -> Cpus:
    """AMD EPYC in NPS4: four NUMA nodes per socket, each a quarter of its cores, SMT above."""
    total = sockets * cores
    per_node = cores // 4
    return tuple((n, n % total, (n % total) // cores, (n % total) // per_node) for n in range(2 * total))


# ----------------------------------------------------------------------------------- renderers

Node = tuple[str, "str | list[Node] | None"]  # (tag, text | children | None for a None block)


def _xml(node: Node, depth: int, out: list[str], attrs: str = "") -> None:
    tag, body = node
    pad = "    " * depth
    if body is None:  # nvidia-smi writes "None" on its own line for an empty MIG device list
        out += [f"{pad}<{tag}>", f"{pad}    None", f"{pad}</{tag}>"]
    elif isinstance(body, str):
        out.append(f"{pad}<{tag}{attrs}>{escape(body)}</{tag}>")
    elif not body:
        out.append(f"{pad}<{tag} />")
    else:
        out.append(f"{pad}<{tag}{attrs}>")
        for child in body:
            _xml(child, depth + 1, out)
        out.append(f"{pad}</{tag}>")


def _mib(n: int) -> str:
    return f"{n} MiB"


def _memory(total: int, reserved: int, used: int, bar1: int) -> list[Node]:
    return [
        ("fb_memory_usage", [("total", _mib(total)), ("reserved", _mib(reserved)),
                             ("used", _mib(used)), ("free", _mib(total - reserved - used))]),
        ("bar1_memory_usage", [("total", _mib(bar1)), ("used", _mib(1)), ("free", _mib(bar1 - 1))]),
    ]


def _mig_device(index: int, m: Mig) -> Node:
    used = 13  # what an idle MIG device shows after context setup
    return ("mig_device", [
        ("index", str(index)),
        ("gpu_instance_id", str(m.gi)),
        ("compute_instance_id", str(m.ci)),
        ("device_attributes", [("shared", [
            ("multiprocessor_count", str(m.sms)),
            ("copy_engine_count", str(m.copy_engines)),
            ("encoder_count", "0"),
            ("decoder_count", str(m.decoders)),
            ("ofa_count", "0"),
            ("jpg_count", "0"),
        ])]),
        ("ecc_error_count", [("volatile_count", [("sram_uncorrectable", "0")])]),
        ("fb_memory_usage", [("total", _mib(m.memory_mib)), ("reserved", _mib(0)),
                             ("used", _mib(used)), ("free", _mib(m.memory_mib - used))]),
        ("bar1_memory_usage", [("total", _mib(m.bar1_mib)), ("used", _mib(0)),
                               ("free", _mib(m.bar1_mib))]),
    ])


def _gpu(b: Bundle, i: int) -> list[Node]:
    g, p = b.gpus[i], b.product
    if g.mig_mode is None:
        mig_mode, mig_devices = ("N/A", "N/A"), None
    else:
        state = "Enabled" if g.mig_mode else "Disabled"
        mig_mode = (state, state)
        mig_devices = [_mig_device(k, m) for k, m in enumerate(g.migs)] or None
    gen = str(p.pcie_gen)
    return [
        ("product_name", p.name),
        ("product_brand", "NVIDIA"),
        ("product_architecture", p.architecture),
        ("display_mode", "Disabled"),
        ("display_active", "Disabled"),
        ("persistence_mode", "Enabled"),
        ("addressing_mode", "None"),
        ("mig_mode", [("current_mig", mig_mode[0]), ("pending_mig", mig_mode[1])]),
        ("mig_devices", mig_devices),
        ("accounting_mode", "Disabled"),
        ("accounting_mode_buffer_size", "4000"),
        ("driver_model", [("current_dm", "N/A"), ("pending_dm", "N/A")]),
        ("serial", b.serial(i)),
        ("uuid", b.gpu_uuid(i)),
        ("minor_number", str(g.minor)),
        ("vbios_version", p.vbios),
        ("multigpu_board", "No"),
        ("board_id", f"0x{g.bus << 8:x}"),
        ("board_part_number", p.board_part),
        ("gpu_module_id", str(g.module_id)),
        ("pci", [
            ("pci_bus", f"{g.bus:02X}"),
            ("pci_device", "00"),
            ("pci_domain", "0000"),
            ("pci_device_id", p.device_id),
            ("pci_bus_id", g.bus_id),
            ("pci_sub_system_id", p.subsystem_id),
            ("pci_gpu_link_info", [
                ("pcie_gen", [("max_link_gen", gen), ("current_link_gen", gen),
                              ("device_current_link_gen", gen), ("max_device_link_gen", gen),
                              ("max_host_link_gen", gen)]),
                ("link_widths", [("max_link_width", "16x"), ("current_link_width", "16x")]),
            ]),
        ]),
        ("performance_state", "P0"),
        *_memory(p.fb_mib, p.fb_reserved_mib, 1 if not g.migs else 50, p.bar1_mib),
        ("compute_mode", "Default"),
        ("ecc_mode", [("current_ecc", "Enabled"), ("pending_ecc", "Enabled")]),
        ("temperature", [("gpu_temp", f"{29 + i % 5} C")]),
        ("processes", []),
        ("accounted_processes", []),
    ]


def render_smi_xml(b: Bundle) -> str:
    out = [
        '<?xml version="1.0" encoding="UTF-8"?>',
        '<!DOCTYPE nvidia_smi_log SYSTEM "nvsmi_device_v12.dtd">',
        "<nvidia_smi_log>",
    ]
    for tag, text in (("timestamp", b.timestamp), ("driver_version", b.driver),
                      ("cuda_version", b.cuda), ("attached_gpus", str(len(b.gpus)))):
        _xml((tag, text), 1, out)
    for i, g in enumerate(b.gpus):
        _xml(("gpu", _gpu(b, i)), 1, out, attrs=f" id={quoteattr(g.bus_id)}")
    out.append("</nvidia_smi_log>")
    return "\n".join(out) + "\n"


def render_smi_list(b: Bundle) -> str:
    lines: list[str] = []
    for i, g in enumerate(b.gpus):
        lines.append(f"GPU {i}: {b.product.name} (UUID: {b.gpu_uuid(i)})")
        for k, m in enumerate(g.migs):
            lines.append(f"  MIG {m.profile:<12}Device {k:>2}: (UUID: {b.mig_uuid(i, m)})")
    return "\n".join(lines) + "\n"


LEGEND = """\
Legend:

  X    = Self
  SYS  = Connection traversing PCIe as well as the SMP interconnect between NUMA nodes (e.g., QPI/UPI)
  NODE = Connection traversing PCIe as well as the interconnect between PCIe Host Bridges within a NUMA node
  PHB  = Connection traversing PCIe as well as a PCIe Host Bridge (typically the CPU)
  PXB  = Connection traversing multiple PCIe bridges (without traversing the PCIe Host Bridge)
  PIX  = Connection traversing at most a single PCIe bridge
  NV#  = Connection traversing a bonded set of # NVLinks
"""


def render_topo(b: Bundle) -> str:
    n = len(b.gpus)
    columns = [f"GPU{i}" for i in range(n)] + [f"NIC{j}" for j in range(len(b.nics))]
    header = "\t".join([*columns, "CPU Affinity", "NUMA Affinity", "GPU NUMA ID"])
    if b.ansi_header:
        header = f"\x1b[4m{header}\x1b[0m"
    lines = ["\t" + header]
    for i, g in enumerate(b.gpus):
        cells = [" X " if j == i else b.gpu_links[i][j] for j in range(n)] + list(b.gpu_nic_links[i])
        # nvidia-smi leaves an empty cell before GPU NUMA ID
        lines.append("\t".join([f"GPU{i}", *cells, cpu_list(g.affinity), str(g.numa), "", "N/A"]))
    for j in range(len(b.nics)):
        cells = [b.gpu_nic_links[i][j] for i in range(n)]
        cells += [" X " if k == j else b.nic_links[j][k] for k in range(len(b.nics))]
        lines.append("\t".join([f"NIC{j}", *cells, "", "", "", ""]))
    text = "\n".join(lines) + "\n\n" + LEGEND
    if b.nics:
        text += "\nNIC Legend:\n\n" + "".join(f"  NIC{j}: {name}\n" for j, name in enumerate(b.nics))
    return text


def render_lscpu(cpus: Cpus) -> str:
    head = (
        "# The following is the parsable format, which can be fed to other\n"
        "# programs. Each different item in every column has an unique ID\n"
        "# starting usually from zero.\n"
        "# CPU,Core,Socket,Node\n"
    )
    return head + "".join(f"{c},{core},{s},{node}\n" for c, core, s, node in cpus)


def render_mig_minors() -> str:
    return mig_minors_text(MIG_MINOR_GPU_SLOTS)


def render_meminfo(total_kib: int) -> str:
    used = total_kib // 100  # an idle node: a percent in use
    cached = total_kib // 200
    fields = [
        ("MemTotal", total_kib), ("MemFree", total_kib - used - cached),
        ("MemAvailable", total_kib - used), ("Buffers", 412_352), ("Cached", cached),
        ("SwapCached", 0), ("Active", used // 2), ("Inactive", cached),
        ("Unevictable", 32_768), ("Mlocked", 32_768), ("SwapTotal", 0), ("SwapFree", 0),
        ("Dirty", 212), ("Writeback", 0), ("AnonPages", used // 3), ("Mapped", 380_144),
        ("Shmem", 70_512), ("KReclaimable", used // 4), ("Slab", used // 3),
        ("SReclaimable", used // 4), ("SUnreclaim", used // 12), ("KernelStack", 61_440),
        ("PageTables", 45_812), ("CommitLimit", total_kib // 2), ("Committed_AS", used),
        ("VmallocTotal", 34_359_738_367), ("VmallocUsed", 1_204_224), ("VmallocChunk", 0),
        ("Percpu", 393_216), ("HardwareCorrupted", 0), ("AnonHugePages", 0),
    ]
    lines = [f"{name + ':':<16}{value:>8} kB" for name, value in fields]
    lines += [f"{name + ':':<16}{0:>8}"
              for name in ("HugePages_Total", "HugePages_Free", "HugePages_Rsvd", "HugePages_Surp")]
    lines += [f"{'Hugepagesize:':<16}{2048:>8} kB", f"{'Hugetlb:':<16}{0:>8} kB"]
    return "\n".join(lines) + "\n"


def render(b: Bundle) -> dict[str, str]:
    files = {
        "nvidia-smi-q.xml": render_smi_xml(b),
        "nvidia-smi-topo.txt": render_topo(b),
        "nvidia-smi-L.txt": render_smi_list(b),
        "lscpu.csv": render_lscpu(b.cpus),
        "meminfo": render_meminfo(b.mem_total_kib),
        "hostname": b.hostname + "\n",
    }
    if any(g.migs for g in b.gpus):
        files["mig-minors"] = render_mig_minors()
    return files


# ------------------------------------------------------------------------------------- bundles


def _matrix(n: int, cell: Callable[[int, int], str]) -> tuple[tuple[str, ...], ...]:
    return tuple(tuple("X" if i == j else cell(i, j) for j in range(n)) for i in range(n))


def dgx_h100() -> Bundle:
    cpus = intel_blocked(sockets=2, cores=56)
    product = Product(
        name="NVIDIA H100 80GB HBM3", architecture="Hopper", device_id="233010DE",
        subsystem_id="16C110DE", vbios="96.00.74.00.1C", board_part="692-2G520-0200-000",
        fb_mib=81559, fb_reserved_mib=479, bar1_mib=131072, pcie_gen=5,
    )
    buses = (0x1B, 0x43, 0x52, 0x61, 0x9D, 0xC3, 0xD1, 0xDF)
    gpus = tuple(
        GpuSpec(bus=bus, minor=i, module_id=i + 1, numa=i // 4, affinity=node_cpus(cpus, i // 4),
                mig_mode=False)
        for i, bus in enumerate(buses)
    )
    # Eight compute ConnectX-7 ports (one per GPU, behind the GPU's PCIe switch) and two
    # dual-port storage adapters, in mlx5 order: NIC1/2 and NIC7/8 are the storage pairs.
    nic_gpu = {0: 0, 3: 1, 4: 2, 5: 3, 6: 4, 9: 5, 10: 6, 11: 7}
    nic_socket = [0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1]
    storage_pairs = ({1, 2}, {7, 8})

    def gpu_nic(i: int, j: int) -> str:
        if nic_gpu.get(j) == i:
            return "PXB"
        return "NODE" if nic_socket[j] == i // 4 else "SYS"

    def nic_nic(j: int, k: int) -> str:
        if any({j, k} <= pair for pair in storage_pairs):
            return "PIX"
        return "NODE" if nic_socket[j] == nic_socket[k] else "SYS"

    return Bundle(
        name="dgx-h100", hostname="dgx-h100-01", driver="535.161.08", cuda="12.2",
        timestamp="Tue Apr 16 09:12:07 2024", product=product, gpus=gpus,
        gpu_links=_matrix(8, lambda i, j: "NV18"),
        nics=tuple(f"mlx5_{j}" for j in range(12)),
        gpu_nic_links=tuple(tuple(gpu_nic(i, j) for j in range(12)) for i in range(8)),
        nic_links=_matrix(12, nic_nic),
        cpus=cpus, mem_total_kib=2_113_389_112,
    )


def l40s_4x() -> Bundle:
    cpus = interleaved(sockets=2, cores=32)
    product = Product(
        name="NVIDIA L40S", architecture="Ada Lovelace", device_id="26B910DE",
        subsystem_id="185110DE", vbios="95.02.66.00.02", board_part="900-2G133-0080-000",
        fb_mib=46068, fb_reserved_mib=609, bar1_mib=65536, pcie_gen=4,
    )
    # GPU0/GPU1 share a PCIe switch on socket 0; GPU2/GPU3 hang off separate root ports of
    # socket 1. The driver probed socket 1 first, so minors run 2,3,0,1 against the index.
    layout = ((0x3D, 2, 0), (0x3E, 3, 0), (0xBC, 0, 1), (0xD8, 1, 1))
    gpus = tuple(
        GpuSpec(bus=bus, minor=minor, module_id=1, numa=sock, affinity=node_cpus(cpus, sock))
        for bus, minor, sock in layout
    )

    def gpu_gpu(i: int, j: int) -> str:
        if layout[i][2] != layout[j][2]:
            return "SYS"
        return "PIX" if {i, j} == {0, 1} else "NODE"

    # One dual-port ConnectX-6 Dx on socket 1.
    return Bundle(
        name="l40s-4x", hostname="l40s-node01", driver="535.183.01", cuda="12.2",
        timestamp="Wed Jul 10 14:03:51 2024", product=product, gpus=gpus,
        gpu_links=_matrix(4, gpu_gpu),
        nics=("mlx5_0", "mlx5_1"),
        gpu_nic_links=tuple(("NODE", "NODE") if g.numa == 1 else ("SYS", "SYS") for g in gpus),
        nic_links=_matrix(2, lambda j, k: "PIX"),
        cpus=cpus, mem_total_kib=1_056_347_620,
    )


# A100 80GB MIG profiles as NVML reports them (memory in MiB, SMs, copy engines, decoders).
A100_3G_40GB = (40192, 42, 3, 2, 65535)
A100_2G_20GB = (19968, 28, 2, 1, 32767)
A100_1G_10GB = (9728, 14, 1, 0, 16383)


def _a100_mig(profile: str, gi: int, shape: tuple[int, int, int, int, int]) -> Mig:
    mem, sms, ce, dec, bar1 = shape
    return Mig(profile=profile, gi=gi, ci=0, sms=sms, memory_mib=mem, copy_engines=ce,
               decoders=dec, bar1_mib=bar1)


def a100_mig() -> Bundle:
    cpus = epyc_nps4(sockets=2, cores=64)
    product = Product(
        name="NVIDIA A100-SXM4-80GB", architecture="Ampere", device_id="20B210DE",
        subsystem_id="147F10DE", vbios="92.00.36.00.02", board_part="692-2G506-0212-002",
        fb_mib=81920, fb_reserved_mib=869, bar1_mib=131072, pcie_gen=4,
    )
    # Created in the order 3g, 2g, 1g, 1g: the driver places them at GPU instances 2, 3, 9, 10.
    migs = (
        _a100_mig("3g.40gb", 2, A100_3G_40GB),
        _a100_mig("2g.20gb", 3, A100_2G_20GB),
        _a100_mig("1g.10gb", 9, A100_1G_10GB),
        _a100_mig("1g.10gb", 10, A100_1G_10GB),
    )

    # Two of a DGX A100's eight GPUs (buses 07 and 87, NUMA nodes 3 and 7); minors swapped so
    # that mig-minors must be read by minor, not by index.
    gpus = (
        GpuSpec(bus=0x07, minor=1, module_id=2, numa=3, affinity=node_cpus(cpus, 3), mig_mode=True,
                migs=migs),
        GpuSpec(bus=0x87, minor=0, module_id=6, numa=7, affinity=node_cpus(cpus, 7), mig_mode=False),
    )
    return Bundle(
        name="a100-mig", hostname="a100-mig01", driver="535.54.03", cuda="12.2",
        timestamp="Mon Aug 14 10:27:45 2023", product=product, gpus=gpus,
        gpu_links=_matrix(2, lambda i, j: "NV12"),
        nics=("mlx5_0", "mlx5_1"),
        gpu_nic_links=(("PXB", "SYS"), ("SYS", "PXB")),
        nic_links=_matrix(2, lambda j, k: "SYS"),
        cpus=cpus, mem_total_kib=1_056_348_872, ansi_header=True,
    )


BUNDLES: tuple[Callable[[], Bundle], ...] = (dgx_h100, l40s_4x, a100_mig)


def build_all() -> dict[str, dict[str, str]]:
    """Every bundle's files: {bundle name: {file name: text}}."""
    out: dict[str, dict[str, str]] = {}
    for make in BUNDLES:
        b = make()
        out[b.name] = render(b)
    return out


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT, help="directory holding the bundles")
    ap.add_argument("--check", action="store_true", help="compare with the files on disk, write nothing")
    args = ap.parse_args(argv)
    stale: list[str] = []
    for name, files in build_all().items():
        folder = args.out / name
        for fname, text in files.items():
            path = folder / fname
            if args.check:
                if not path.is_file() or path.read_text(encoding="utf-8") != text:
                    stale.append(str(path))
                continue
            folder.mkdir(parents=True, exist_ok=True)
            path.write_text(text, encoding="utf-8", newline="\n")
    if stale:
        print("out of date:\n  " + "\n  ".join(stale), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
