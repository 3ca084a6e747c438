"""Read a capture bundle (a directory of captured files) into a :class:`Node`.

Any subset of the files works as long as it carries the facts asked for. Where several files
could supply a fact, the order is: ``nvml.json`` (gpuslurm's own dump, authoritative), then the
``nvidia-smi`` captures, then ``lscpu.csv``, ``mig-minors``, ``meminfo`` and ``hostname``.
Files the reader does not know are ignored, so a bundle can carry notes or extra captures.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, NamedTuple

from gpuslurm.errors import CaptureError
from gpuslurm.hw.formats.lscpu import parse_lscpu
from gpuslurm.hw.formats.smi_xml import SmiReport, parse_smi_xml
from gpuslurm.hw.formats.topo_text import TopoMatrix, parse_topo
from gpuslurm.hw.model.node import Cpu, Gpu, Link, MigDevice, Node
from gpuslurm.ranges import format_ranges
from gpuslurm.tuples import TYPE_CHECKING

if TYPE_CHECKING:
    from gpuslurm.samples import Reading
from gpuslurm.safedir import read_regular_text

NVML_JSON = "nvml.json"
SMI_XML = "nvidia-smi-q.xml"
SMI_TEXT = "nvidia-smi-q.txt"
SMI_LIST = "nvidia-smi-L.txt"
TOPO = "nvidia-smi-topo.txt"
LSCPU = "lscpu.csv"
MIG_MINORS = "mig-minors"
MEMINFO = "meminfo"
HOSTNAME = "hostname"

Matrix = tuple[tuple[Link, ...], ...]


class _GpuFacts(NamedTuple):
    gpus: tuple[Gpu, ...]
    driver_version: str | None
    cuda_version: str | None
    origin: str  # the file the GPU list came from, for messages
    warnings: tuple[str, ...]


def read_text(path: Path) -> str:
    """A bundle file's text; unreadable or non-UTF-8 files are a CaptureError naming the file."""
    try:
        return read_regular_text(str(path))
    except OSError as exc:
        raise CaptureError(f"cannot read: {exc.strerror}", path) from None
    except UnicodeDecodeError as exc:
        raise CaptureError(f"not UTF-8 text (byte {exc.start})", path) from None


def read_bundle(path: Path) -> Node:
    """Assemble a Node from whatever files the bundle directory holds."""
    if not path.is_dir():
        raise CaptureError("no such capture bundle directory", path)
    nvml: dict[str, Any] = {}
    if (path / NVML_JSON).is_file():
        from gpuslurm.hw.formats.nvml_json import load_partial  # json only when the bundle has it

        nvml = load_partial(path / NVML_JSON)
    facts = _gpu_facts(path, nvml)
    warnings = list(facts.warnings)
    gpus = facts.gpus

    topo = parse_topo(read_text(path / TOPO), str(path / TOPO)) if (path / TOPO).is_file() else None
    if topo is not None and len(topo.gpu_labels) != len(gpus):
        raise CaptureError(f"{len(topo.gpu_labels)} GPUs in the matrix but {facts.origin} describes "
                           f"{len(gpus)}", path / TOPO)
    links = _links(path, nvml, topo, gpus)
    gpus, affinity_origins = _placement(path, gpus, topo)

    cpus: tuple[Cpu, ...] = nvml.get("cpus", ())
    cpus_origin = NVML_JSON
    if not cpus and (path / LSCPU).is_file():
        cpus, cpus_origin = parse_lscpu(read_text(path / LSCPU), str(path / LSCPU)), LSCPU
    if cpus:
        _check_affinity(gpus, affinity_origins, cpus, cpus_origin)

    gpus = _mig_minors(path, gpus, warnings)
    if any(m.profile == "" for g in gpus for m in g.mig_devices):
        warnings.append(f"MIG profile names are unknown: add {SMI_LIST} (nvidia-smi -L) to the bundle")

    return Node(
        hostname=_hostname(path, nvml),
        gpus=gpus,
        cpus=cpus,
        links=links,
        driver_version=facts.driver_version,
        cuda_version=facts.cuda_version,
        memory_mib=nvml["memory_mib"] if "memory_mib" in nvml else _meminfo(path),
        source=f"replay:{path}",
        warnings=tuple(warnings),
    )


def read_captured_state(path: Path, node: Node) -> Reading | None:
    """What the bundle's ``nvidia-smi -q -x`` recorded ``node``'s GPUs doing (utilisation, memory
    used, temperature, power, processes), or None when the bundle has no XML capture."""
    if not (path / SMI_XML).is_file():
        return None
    from gpuslurm.hw.formats.smi_state import parse_smi_state

    return parse_smi_state(read_text(path / SMI_XML), str(path / SMI_XML), node)


def _smi_report(path: Path) -> tuple[SmiReport, str] | None:
    if (path / SMI_XML).is_file():
        report, origin = parse_smi_xml(read_text(path / SMI_XML), str(path / SMI_XML)), SMI_XML
    elif (path / SMI_TEXT).is_file():
        from gpuslurm.hw.formats.smi_text import parse_smi_query_text

        report, origin = parse_smi_query_text(read_text(path / SMI_TEXT), str(path / SMI_TEXT)), SMI_TEXT
    else:
        return None
    # -L adds only MIG profile names and MIG UUIDs: read it (and pay for its parser) only when
    # some GPU has MIG devices. gres-conf runs on every node of a cluster.
    if any(g.mig_devices for g in report.gpus) and (path / SMI_LIST).is_file():
        from gpuslurm.hw.formats.smi_text import merge_listing, parse_smi_list

        source = str(path / SMI_LIST)
        report = merge_listing(report, parse_smi_list(read_text(path / SMI_LIST), source), source)
    return report, origin


def _gpu_facts(path: Path, nvml: dict[str, Any]) -> _GpuFacts:
    report = None
    if not {"gpus", "driver_version", "cuda_version"} <= nvml.keys():
        report = _smi_report(path)
    smi = report[0] if report is not None else None
    driver = nvml.get("driver_version", smi.driver_version if smi else None)
    cuda = nvml.get("cuda_version", smi.cuda_version if smi else None)
    if "gpus" in nvml:
        return _GpuFacts(nvml["gpus"], driver, cuda, NVML_JSON, ())
    if report is None:
        raise CaptureError(f"no GPU facts: the bundle needs {NVML_JSON} or {SMI_XML}", path)
    return _GpuFacts(report[0].gpus, driver, cuda, report[1], report[0].warnings)


def _topo_rows(topo: TopoMatrix, gpus: tuple[Gpu, ...], source: Path) -> list[int]:
    """Row of the matrix for each GPU, matched by NVML index (``GPU<index>``)."""
    row_of = {label: i for i, label in enumerate(topo.gpu_labels)}
    rows = []
    for gpu in gpus:
        if f"GPU{gpu.index}" not in row_of:
            raise CaptureError(f"no row GPU{gpu.index} in the matrix", source)
        rows.append(row_of[f"GPU{gpu.index}"])
    return rows


def _links(path: Path, nvml: dict[str, Any], topo: TopoMatrix | None, gpus: tuple[Gpu, ...]) -> Matrix | None:
    if "links" in nvml:
        links: Matrix = nvml["links"]
        if len(links) != len(gpus) or any(len(row) != len(gpus) for row in links):
            raise CaptureError(f"\"links\" is not a {len(gpus)}x{len(gpus)} matrix for the "
                               f"{len(gpus)} GPUs", path / NVML_JSON)
        return links
    if topo is None:
        return None
    rows = _topo_rows(topo, gpus, path / TOPO)
    return tuple(tuple(topo.links[r][c] for c in rows) for r in rows)


def _placement(path: Path, gpus: tuple[Gpu, ...],
               topo: TopoMatrix | None) -> tuple[tuple[Gpu, ...], tuple[Path, ...]]:
    """Fill CPU affinity and NUMA node from the matrix where the GPU list lacks them.

    Also returns, per GPU, the file its affinity came from (for the check against the CPU list).
    """
    if topo is None:
        return gpus, (path / NVML_JSON,) * len(gpus)
    rows = _topo_rows(topo, gpus, path / TOPO)
    out = []
    origins = []
    for gpu, r in zip(gpus, rows, strict=True):
        origin = path / NVML_JSON
        if not gpu.cpu_affinity and topo.cpu_affinity[r]:
            gpu = gpu._replace(cpu_affinity=topo.cpu_affinity[r])
            origin = path / TOPO
        if gpu.numa_node is None and topo.numa_node[r] is not None:
            gpu = gpu._replace(numa_node=topo.numa_node[r])
        out.append(gpu)
        origins.append(origin)
    return tuple(out), tuple(origins)


def _check_affinity(gpus: tuple[Gpu, ...], origins: tuple[Path, ...], cpus: tuple[Cpu, ...],
                    cpus_origin: str) -> None:
    known = {c.os_id for c in cpus}
    for gpu, origin in zip(gpus, origins, strict=True):
        missing = sorted(set(gpu.cpu_affinity) - known)
        if missing:
            raise CaptureError(f"GPU{gpu.index} CPU affinity names CPUs {format_ranges(missing)} that "
                               f"{cpus_origin} does not list", origin)


def _mig_minors(path: Path, gpus: tuple[Gpu, ...], warnings: list[str]) -> tuple[Gpu, ...]:
    if not any(g.mig_devices for g in gpus):
        return gpus
    file = path / MIG_MINORS
    if not file.is_file():
        if any(m.gi_minor is None for g in gpus for m in g.mig_devices):
            warnings.append(f"MIG device files are unknown: add {MIG_MINORS} "
                            "(/proc/driver/nvidia-caps/mig-minors) to the bundle")
        return gpus
    from gpuslurm.hw.formats.mig_minors import parse_mig_minors

    table = parse_mig_minors(read_text(file), str(file))

    def lookup(gpu: Gpu, mig: MigDevice, ci: int | None) -> int:
        key = (gpu.minor, mig.gi_id, ci)
        if key not in table:
            entry = f"gpu{gpu.minor}/gi{mig.gi_id}" + ("" if ci is None else f"/ci{ci}") + "/access"
            raise CaptureError(f"no {entry} entry for MIG device {mig.index} of GPU{gpu.index} "
                               f"(minor {gpu.minor})", file)
        return table[key]

    out = []
    for gpu in gpus:
        migs = tuple(
            m._replace(gi_minor=m.gi_minor if m.gi_minor is not None else lookup(gpu, m, None),
                       ci_minor=m.ci_minor if m.ci_minor is not None else lookup(gpu, m, m.ci_id))
            for m in gpu.mig_devices)
        out.append(gpu._replace(mig_devices=migs))
    return tuple(out)


def _meminfo(path: Path) -> int | None:
    file = path / MEMINFO
    if not file.is_file():
        return None
    for line in read_text(file).splitlines():
        key, _, value = line.partition(":")
        if key == "MemTotal":
            fields = value.split()
            if len(fields) == 2 and fields[0].isascii() and fields[0].isdigit() and fields[1] == "kB" \
                    and len(fields[0]) <= 18:
                return int(fields[0]) // 1024
            raise CaptureError(f"MemTotal is {value.strip()!r}, expected '<n> kB'", file)
    raise CaptureError("no MemTotal line", file)


def _hostname(path: Path, nvml: dict[str, Any]) -> str:
    if "hostname" in nvml:
        return str(nvml["hostname"])
    file = path / HOSTNAME
    if file.is_file():
        name = read_text(file).strip()
        if name:
            return name.split()[0]
    return path.resolve().name
