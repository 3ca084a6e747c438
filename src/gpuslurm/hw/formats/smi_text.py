"""Parse the human-readable ``nvidia-smi -q`` and ``nvidia-smi -L`` outputs.

``-q`` gives the same facts as ``-q -x`` (see :mod:`gpuslurm.hw.formats.smi_xml`, whose rules on odd input
apply here too). ``-L`` is the only capture that names MIG profiles and MIG UUIDs;
:func:`merge_listing` copies them into a report.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace

from gpuslurm.errors import CaptureError
from gpuslurm.hw.formats.smi_xml import (
    SmiReport,
    dedupe_uuids,
    finish_report,
    is_placeholder_uuid,
    parse_bus_id,
    parse_int,
    parse_mib,
    parse_mig_mode,
    parse_optional_int,
)
from gpuslurm.hw.model.node import MIG_PROFILE_RE, Gpu, MigDevice

__all__ = ["ListedGpu", "ListedMig", "merge_listing", "parse_smi_list", "parse_smi_query_text"]

_BANNER = "==============NVSMI LOG=============="
# "Key      : value"; the first colon preceded by blanks ends the key (values hold colons too).
_KEY_VALUE_RE = re.compile(r"^(?P<key>\S.*?)\s+:(?: (?P<value>.*))?$")
_GPU_HEADER_RE = re.compile(r"^GPU (?P<bus>[0-9A-Fa-f]+:[0-9A-Fa-f]+:[0-9A-Fa-f]+\.[0-9A-Fa-f])$")


@dataclass
class _Entry:
    """One line of ``-q`` output with the more indented lines under it."""

    key: str
    value: str | None
    line: int
    children: list[_Entry] = field(default_factory=list)

    def child(self, key: str) -> _Entry | None:
        return next((c for c in self.children if c.key == key), None)

    def all(self, key: str) -> list[_Entry]:
        return [c for c in self.children if c.key == key]

    def get(self, *path: str) -> str | None:
        node: _Entry | None = self
        for key in path:
            node = node.child(key) if node is not None else None
        return None if node is None or node.value is None else node.value.strip()


def _build_tree(text: str, source: str) -> _Entry:
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if line.strip()), None)
    if start is None or lines[start].strip() != _BANNER:
        raise CaptureError(f"not nvidia-smi -q output: it does not start with {_BANNER}", source)
    root = _Entry("", None, start + 1)
    stack: list[tuple[int, _Entry]] = [(-1, root)]
    for number, raw in enumerate(lines[start + 1:], start=start + 2):
        line = raw.expandtabs(4).rstrip()
        if not line.strip():
            continue
        indent = len(line) - len(line.lstrip(" "))
        body = line.strip()
        m = _KEY_VALUE_RE.match(body)
        entry = _Entry(m.group("key"), m.group("value") or "", number) if m else _Entry(body, None, number)
        while stack[-1][0] >= indent:
            stack.pop()
        stack[-1][1].children.append(entry)
        stack.append((indent, entry))
    return root


def _parse_mig(entry: _Entry, what: str, source: str) -> MigDevice:
    what = f"{what} (line {entry.line})"
    memory = entry.get("Shared FB Memory Usage", "Total")
    if memory is None:  # drivers before R525 print plain "FB Memory Usage" for MIG devices
        memory = entry.get("FB Memory Usage", "Total")
    return MigDevice(
        index=parse_int(entry.get("Index"), f"{what} Index", source),
        gi_id=parse_int(entry.get("GPU Instance ID"), f"{what} GPU Instance ID", source),
        ci_id=parse_int(entry.get("Compute Instance ID"), f"{what} Compute Instance ID", source),
        profile="",
        memory_mib=parse_mib(memory, f"{what} FB Memory Usage Total", source),
        uuid=None,
        sm_count=parse_optional_int(entry.get("Device Attributes", "Shared", "Multiprocessor count")),
    )


def _parse_gpu(entry: _Entry, header_bus: str, index: int, source: str) -> Gpu:
    what = f"GPU {index} (line {entry.line})"
    uuid = entry.get("GPU UUID")
    if not uuid:
        raise CaptureError(f"{what} has no GPU UUID", source)
    minor = entry.get("Minor Number")
    if minor is None:
        raise CaptureError(f"{what} has no Minor Number", source)
    # Older drivers nest MIG devices under a "MIG Devices" entry; newer ones list them directly.
    mig_entries = entry.all("MIG Device")
    for group in entry.all("MIG Devices"):
        mig_entries.extend(group.all("MIG Device"))
    return Gpu(
        uuid=uuid,
        index=index,
        minor=parse_int(minor, f"{what} Minor Number", source),
        bus_id=parse_bus_id(entry.get("PCI", "Bus Id") or header_bus, f"{what} bus id", source),
        name=entry.get("Product Name") or "",
        memory_mib=parse_mib(entry.get("FB Memory Usage", "Total"), f"{what} FB Memory Usage Total", source),
        mig_mode=parse_mig_mode(entry.get("MIG Mode", "Current"), f"{what} MIG Mode Current", source),
        mig_devices=tuple(_parse_mig(m, f"{what} MIG device #{pos}", source)
                          for pos, m in enumerate(mig_entries)),
    )


def parse_smi_query_text(text: str, source: str) -> SmiReport:
    """Parse ``nvidia-smi -q`` text (starting at its NVSMI LOG banner) into a report."""
    root = _build_tree(text, source)
    gpus: list[Gpu] = []
    for entry in root.children:
        m = _GPU_HEADER_RE.match(entry.key) if entry.value is None else None
        if m is not None:
            gpus.append(_parse_gpu(entry, m.group("bus"), len(gpus), source))
    attached_text = root.get("Attached GPUs")
    attached = None if attached_text is None else parse_int(attached_text, "Attached GPUs", source)
    return finish_report(root.get("Driver Version"), root.get("CUDA Version"), attached, gpus, source,
                         "Attached GPUs")


@dataclass(frozen=True, slots=True)
class ListedMig:
    """One ``MIG <profile> Device <n>: (UUID: …)`` line of ``nvidia-smi -L``."""

    index: int
    profile: str
    uuid: str


@dataclass(frozen=True, slots=True)
class ListedGpu:
    """One ``GPU <n>: <name> (UUID: …)`` line of ``nvidia-smi -L`` and its MIG lines."""

    index: int
    name: str
    uuid: str
    migs: tuple[ListedMig, ...] = ()


_LIST_GPU_RE = re.compile(r"^GPU (?P<index>\d+): (?P<name>.+) \(UUID: (?P<uuid>[^\s)]+)\)$")
_LIST_MIG_RE = re.compile(r"^MIG (?P<profile>\S+)\s+Device\s+(?P<index>\d+): \(UUID: (?P<uuid>[^\s)]+)\)$")


def parse_smi_list(text: str, source: str) -> tuple[ListedGpu, ...]:
    """Parse ``nvidia-smi -L``; MIG profile names must match MIG_PROFILE_RE."""
    gpus: list[ListedGpu] = []
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line:
            continue
        if m := _LIST_GPU_RE.match(line):
            index = parse_int(m.group("index"), f"line {number} GPU index", source)
            gpus.append(ListedGpu(index, m.group("name"), m.group("uuid")))
            continue
        m = _LIST_MIG_RE.match(line)
        if m is None:
            raise CaptureError(f"line {number} is not a GPU or MIG line of nvidia-smi -L: {line[:80]!r}",
                               source)
        if not gpus:
            raise CaptureError(f"line {number} lists a MIG device before any GPU", source)
        profile = m.group("profile")
        if MIG_PROFILE_RE.match(profile) is None:
            raise CaptureError(f"line {number} has unknown MIG profile {profile!r}", source)
        parent = gpus[-1]
        mig = ListedMig(parse_int(m.group("index"), f"line {number} MIG device", source), profile,
                        m.group("uuid"))
        gpus[-1] = replace(parent, migs=(*parent.migs, mig))
    return tuple(gpus)


def _merge_gpu(gpu: Gpu, listed: ListedGpu, source: str) -> Gpu:
    if gpu.index != listed.index:
        raise CaptureError(f"nvidia-smi -L lists GPU {listed.index} where the query has GPU {gpu.index}",
                           source)
    if not (is_placeholder_uuid(gpu.uuid) or is_placeholder_uuid(listed.uuid)) and gpu.uuid != listed.uuid:
        raise CaptureError(f"GPU {gpu.index} is {gpu.uuid} in the query but {listed.uuid} in nvidia-smi -L",
                           source)
    by_index = {m.index: m for m in listed.migs}
    have = sorted(m.index for m in gpu.mig_devices)
    if have != sorted(by_index):
        raise CaptureError(f"GPU {gpu.index} has MIG devices {have} in the query but {sorted(by_index)} "
                           f"in nvidia-smi -L", source)
    migs = tuple(m._replace(profile=by_index[m.index].profile, uuid=by_index[m.index].uuid)
                 for m in gpu.mig_devices)
    return gpu._replace(mig_devices=migs)


def merge_listing(report: SmiReport, listing: tuple[ListedGpu, ...], source: str) -> SmiReport:
    """Fill MIG profiles and UUIDs from ``nvidia-smi -L`` (``source``) into ``report``."""
    if len(listing) != len(report.gpus):
        raise CaptureError(f"nvidia-smi -L lists {len(listing)} GPU(s) but the query describes "
                           f"{len(report.gpus)}", source)
    merged = tuple(_merge_gpu(g, lg, source) for g, lg in zip(report.gpus, listing, strict=True))
    deduped, warnings = dedupe_uuids(merged, source)
    fresh = tuple(w for w in warnings if w not in report.warnings)
    return report._replace(gpus=deduped, warnings=report.warnings + fresh)
