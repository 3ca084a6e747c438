"""Parse ``lscpu -p=CPU,CORE,SOCKET,NODE`` (the ``lscpu.csv`` of a capture bundle)."""

from __future__ import annotations

from pathlib import Path

from gpuslurm.errors import CaptureError
from gpuslurm.hw.model.node import Cpu
from gpuslurm.ranges import MAX_CPUS, bounded_int

CAPTURE_HINT = "capture with lscpu -p=CPU,CORE,SOCKET,NODE"
DEFAULT_COLUMNS = ("cpu", "core", "socket", "node")


def parse_lscpu(text: str, source: str | Path) -> tuple[Cpu, ...]:
    """The online CPUs listed, sorted by OS id.

    lscpu writes the column names in its last comment line (``# CPU,Core,Socket,Node``); a file
    without comments is taken to be in the order of the capture command.
    """
    header: list[str] | None = None
    rows: list[tuple[int, list[str]]] = []
    for lineno, line in enumerate(text.splitlines(), 1):
        if line.startswith("#"):
            header = [name.strip().lower() for name in line[1:].split(",")]
        elif line.strip():
            rows.append((lineno, [field.strip() for field in line.split(",")]))
    names = header if header is not None else list(DEFAULT_COLUMNS)
    col = {name: i for i, name in reversed(list(enumerate(names))) if name}
    for needed, shown in (("cpu", "CPU"), ("core", "Core"), ("socket", "Socket")):
        if needed not in col:
            raise CaptureError(f"lacks the {shown} column; {CAPTURE_HINT}", source)
    node_col = col.get("node")

    cpus: dict[int, Cpu] = {}
    for lineno, fields in rows:
        if len(fields) < len(names):
            raise CaptureError(f"line {lineno} has {len(fields)} fields but the header names "
                               f"{len(names)}", source)
        cpu, core, socket = fields[col["cpu"]], fields[col["core"]], fields[col["socket"]]
        node = fields[node_col] if node_col is not None else ""
        if not cpu:
            raise CaptureError(f"line {lineno} has no CPU number", source)
        if not core or not socket:
            continue  # offline CPU (lscpu -a leaves its topology fields empty)
        try:
            value = Cpu(bounded_int(cpu, MAX_CPUS), bounded_int(core, MAX_CPUS),
                        bounded_int(socket, MAX_CPUS), bounded_int(node, MAX_CPUS) if node else None)
        except ValueError:
            raise CaptureError(f"line {lineno} is not numeric: {','.join(fields)!r}", source) from None
        if value.os_id in cpus:
            raise CaptureError(f"line {lineno} repeats CPU {value.os_id}", source)
        cpus[value.os_id] = value
    if not cpus:
        raise CaptureError(f"no CPUs listed; {CAPTURE_HINT}", source)
    return tuple(cpus[k] for k in sorted(cpus))
