"""Read CPU topology, host memory and PCI NUMA placement from ``/sys`` and ``/proc``.

The numbers follow ``lscpu -p``, so a live read and a captured ``lscpu.csv`` agree: the sysfs
``core_id`` repeats on every socket (and may be sparse), so lscpu numbers cores anew, in the order
their first CPU appears when CPUs are walked by OS id. Sockets are numbered the same way.
"""

from __future__ import annotations

import re
from pathlib import Path

from gpuslurm.errors import HardwareError
from gpuslurm.hw.formats.topo_text import parse_cpu_list
from gpuslurm.hw.live.procfs import MEMINFO
from gpuslurm.hw.model.node import Cpu, normalise_bus_id

_CPU_DIR_RE = re.compile(r"^cpu(\d+)$")
_NODE_DIR_RE = re.compile(r"^node(\d+)$")


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError as exc:
        raise HardwareError(f"cannot read {path}: {exc.strerror}") from None


def _int(path: Path) -> int | None:
    text = _read(path)
    if text is None:
        return None
    try:
        return int(text)
    except ValueError:
        raise HardwareError(f"{path}: expected a number, found {text[:40]!r}") from None


def _numbered(directory: Path, pattern: re.Pattern[str]) -> list[tuple[int, Path]]:
    try:
        entries = list(directory.iterdir())
    except FileNotFoundError:
        return []
    found = [(int(m.group(1)), p) for p in entries if (m := pattern.match(p.name))]
    return sorted(found)


def cpu_numa_nodes(sys_root: Path = Path("/sys")) -> dict[int, int]:
    """OS CPU id → NUMA node, from ``devices/system/node/node*/cpulist`` (empty without NUMA)."""
    out: dict[int, int] = {}
    for node, path in _numbered(sys_root / "devices/system/node", _NODE_DIR_RE):
        text = _read(path / "cpulist")
        if not text:  # memory-only nodes (CXL, HBM, Grace Hopper GPU memory) list no CPUs
            continue
        try:
            cpus = parse_cpu_list(text)
        except ValueError:
            raise HardwareError(f"{path / 'cpulist'}: not a CPU list: {text[:40]!r}") from None
        for cpu in cpus:
            out.setdefault(cpu, node)
    return out


def read_cpus(sys_root: Path = Path("/sys")) -> tuple[Cpu, ...]:
    """The online CPUs, sorted by OS id, numbered as ``lscpu -p=CPU,CORE,SOCKET,NODE`` numbers them."""
    nodes = cpu_numa_nodes(sys_root)
    core_numbers: dict[object, int] = {}
    socket_numbers: dict[int, int] = {}
    cpus: list[Cpu] = []
    for os_id, path in _numbered(sys_root / "devices/system/cpu", _CPU_DIR_RE):
        if _int(path / "online") == 0:  # cpu0 usually has no "online" file: it cannot go offline
            continue
        topo = path / "topology"
        core_id = _int(topo / "core_id")
        package = _int(topo / "physical_package_id")
        if core_id is None or package is None:
            continue  # offline or not yet brought up: the kernel removes its topology directory
        # lscpu tells cores apart by their thread-sibling set; (package, die, core_id) is the
        # fallback for kernels that do not publish it.
        siblings = _read(topo / "thread_siblings_list")
        core_key: object = (("siblings", siblings) if siblings
                            else ("ids", package, _int(topo / "die_id"), core_id))
        core = core_numbers.setdefault(core_key, len(core_numbers))
        socket = socket_numbers.setdefault(package, len(socket_numbers))
        cpus.append(Cpu(os_id, core, socket, nodes.get(os_id)))
    return tuple(cpus)


def read_meminfo_mib(path: Path = Path(MEMINFO)) -> int | None:
    """``MemTotal`` in MiB, or None when the file or the line is missing."""
    text = _read(path)
    if text is None:
        return None
    for line in text.splitlines():
        name, _, rest = line.partition(":")
        if name == "MemTotal":
            fields = rest.split()
            if len(fields) == 2 and fields[1] == "kB" and fields[0].isascii() and fields[0].isdigit():
                return int(fields[0]) // 1024
            raise HardwareError(f"{path}: unexpected MemTotal line {line!r}")
    return None


def pci_numa_node(bus_id: str, sys_root: Path = Path("/sys")) -> int | None:
    """The NUMA node the kernel gives a PCI device; None when unknown (-1) or not present."""
    domain, bus, devfn = normalise_bus_id(bus_id).split(":")
    # sysfs names devices with a lower-case domain of at least four digits.
    name = f"{int(domain, 16):04x}:{bus.lower()}:{devfn.lower()}"
    node = _int(sys_root / "bus/pci/devices" / name / "numa_node")
    return None if node is None or node < 0 else node
