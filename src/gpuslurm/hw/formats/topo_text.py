"""Parse the matrix that ``nvidia-smi topo -m`` prints.

The header names the columns: ``GPU0``…, then NICs (``NIC0``… on newer drivers, ``mlx5_0``… on
older ones), then ``CPU Affinity``, ``NUMA Affinity`` and, since about driver 535,
``GPU NUMA ID``. Rows follow until a blank line; the legend blocks after it are ignored.

Cells are separated by tabs in real output, but copies pasted through terminals and web pages
use runs of spaces, so rows are split on any whitespace. That also absorbs a quirk of recent
drivers, which print an empty cell before ``GPU NUMA ID`` in every row (``0\t\tN/A``).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import NamedTuple

from gpuslurm.errors import CaptureError
from gpuslurm.hw.model.node import Link, LinkKind, link_from_text
from gpuslurm.ranges import MAX_CPUS, bounded_int, parse_ranges

ANSI_RE = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
GPU_LABEL_RE = re.compile(r"^GPU\d+$")
# The trailing columns are the only header names that contain spaces.
TRAILING = ("CPU Affinity", "NUMA Affinity", "GPU NUMA ID")
_HEADER_TOKEN_RE = re.compile("|".join(re.escape(t) for t in TRAILING) + r"|\S+")
_CPU_LIST_RE = re.compile(r"^\d+(?:-\d+)?(?:,\d+(?:-\d+)?)*$")


class TopoMatrix(NamedTuple):
    """The GPU part of a ``topo -m`` matrix, in row order (NVML index order)."""

    gpu_labels: tuple[str, ...]
    links: tuple[tuple[Link, ...], ...]
    cpu_affinity: tuple[tuple[int, ...], ...]  # OS CPU ids per GPU; () when N/A
    numa_node: tuple[int | None, ...]


def strip_ansi(text: str) -> str:
    return ANSI_RE.sub("", text)


def parse_cpu_list(text: str) -> tuple[int, ...]:
    """Expand a kernel-style CPU list (``0-3,8,10-11``) into sorted ids; raises ValueError."""
    t = text.strip()
    if not _CPU_LIST_RE.match(t):
        raise ValueError(f"not a CPU list: {text!r}")
    return parse_ranges(t, MAX_CPUS)


def parse_topo(text: str, source: str | Path) -> TopoMatrix:
    """Parse ``nvidia-smi topo -m`` output; NIC rows and columns are dropped."""
    lines = [strip_ansi(line).rstrip() for line in text.splitlines()]
    start = next((i for i, line in enumerate(lines) if line.strip()), None)
    if start is None:
        raise CaptureError("empty topology matrix", source)
    columns = _HEADER_TOKEN_RE.findall(lines[start])
    gpu_cols = [i for i, name in enumerate(columns) if GPU_LABEL_RE.match(name)]
    if not gpu_cols:
        raise CaptureError("no GPU columns in the topology header", source)
    trailing_at = next((i for i, name in enumerate(columns) if name in TRAILING), len(columns))
    if gpu_cols[-1] >= trailing_at:
        raise CaptureError("GPU column after the affinity columns in the topology header", source)
    trailing = columns[trailing_at:]

    labels: list[str] = []
    links: list[tuple[Link, ...]] = []
    affinities: list[tuple[int, ...]] = []
    numa: list[int | None] = []
    for lineno in range(start + 1, len(lines)):
        cells = lines[lineno].split()
        if not cells or cells[0].rstrip(":") == "Legend":
            break
        if not GPU_LABEL_RE.match(cells[0]):
            continue  # a NIC row
        where = f"line {lineno + 1} ({cells[0]})"
        body = cells[1:]
        if len(body) < trailing_at:
            raise CaptureError(f"{where} has {len(body)} cells but the header has {trailing_at} "
                               "link columns; the GPU part of the matrix is not square", source)
        row: list[Link] = []
        for col in gpu_cols:
            try:
                row.append(link_from_text(body[col]))
            except ValueError:
                raise CaptureError(f"{where}: unknown link {body[col]!r} in column {columns[col]}",
                                   source) from None
        extra = body[trailing_at:]
        if len(extra) > len(trailing):
            raise CaptureError(f"{where} has {len(extra)} cells after the links but the header "
                               f"names {len(trailing)}", source)
        values = dict(zip(trailing, extra, strict=False))
        labels.append(cells[0])
        links.append(tuple(row))
        affinities.append(_affinity(values.get("CPU Affinity", "N/A"), where, source))
        numa.append(_numa(values.get("NUMA Affinity", "N/A"), where, source))

    header_labels = [columns[i] for i in gpu_cols]
    if labels != header_labels:
        raise CaptureError(f"GPU rows {' '.join(labels) or '(none)'} do not match GPU columns "
                           f"{' '.join(header_labels)}; the GPU part of the matrix is not square",
                           source)
    for i, links_of in enumerate(links):
        if links_of[i].kind is not LinkKind.SELF:
            raise CaptureError(f"{labels[i]} is not X on the diagonal (found {links_of[i]})", source)
    return TopoMatrix(tuple(labels), tuple(links), tuple(affinities), tuple(numa))


def _affinity(cell: str, where: str, source: str | Path) -> tuple[int, ...]:
    if cell == "N/A":
        return ()
    try:
        return parse_cpu_list(cell)
    except ValueError:
        raise CaptureError(f"{where}: CPU Affinity {cell!r} is not a CPU list", source) from None


def _numa(cell: str, where: str, source: str | Path) -> int | None:
    if cell == "N/A":
        return None
    if cell.isascii() and cell.isdigit():
        try:
            return bounded_int(cell, MAX_CPUS)
        except ValueError as exc:
            raise CaptureError(f"{where}: NUMA node {exc}", source) from None
    try:
        parse_cpu_list(cell)  # several nodes ("0-1"): no single node to name
    except ValueError:
        raise CaptureError(f"{where}: NUMA Affinity {cell!r} is not a node number", source) from None
    return None
