"""Compare an existing gres.conf with what the hardware needs (pure).

Only ``Name=gpu`` lines are compared; mps and shard lines are site policy. Each mismatch names the
line, the device and what the hardware says instead, so an admin can fix it by hand.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

from gpuslurm.gres.conf_parse import ConfEntry
from gpuslurm.gres.records import GresPlan, GresRecord
from gpuslurm.topo.cores import format_ranges


@dataclass(frozen=True, slots=True)
class Mismatch:
    kind: str  # missing | extra | file | cores | type | links
    line: int | None
    message: str


_MINOR_RE = re.compile(r"/dev/nvidia(\d+)$")


def _key(files: tuple[str, ...]) -> str | frozenset[str]:
    return files[0] if len(files) == 1 else frozenset(files)


def check_gres_conf(plan: GresPlan, entries: tuple[ConfEntry, ...]) -> list[Mismatch]:
    expected = {_key(r.files): r for r in plan.gpu_records}
    existing = [e for e in entries if e.name.lower() == "gpu"]
    by_index = {r.gpu.index: r for r in plan.gpu_records if r.mig is None}
    out: list[Mismatch] = []
    seen: set[str | frozenset[str]] = set()
    for entry in existing:
        key = _key(entry.files) if entry.files else None
        if key is None:
            out.append(Mismatch("file", entry.line, "Name=gpu line without File= or MultipleFiles="))
            continue
        record = expected.get(key)
        if record is None:
            out.append(Mismatch("extra", entry.line, f"{_show(entry.files)} is not a GPU of this node"))
            continue
        seen.add(key)
        widened = None
        if plan.whole_sockets and entry.cores is not None and not plan.core_map.is_whole_sockets(entry.cores):
            widened = plan.core_map.whole_sockets(entry.cores)
            if widened == record.cores:  # the right GPU's NUMA cores: one finding, naming the fix
                out.append(_split_socket(entry, record, plan))
                entry = replace(entry, cores=record.cores)
            # else wrong beyond the split: the cores (or numbering) finding says what to write
        out.extend(_compare(entry, record, by_index, widened))
    for key, record in expected.items():
        if key not in seen:
            out.append(Mismatch("missing", None, f"no line for {_describe(record)} ({_show(record.files)})"))
    return out


def renamed_later(entries: tuple[ConfEntry, ...], later: GresPlan, release: str) -> list[Mismatch]:
    """MIG lines whose Type a later Slurm (``later``'s plan, ``release``) would not match."""
    by_files = {_key(r.files): r for r in later.gpu_records if r.mig is not None}
    out: list[Mismatch] = []
    for entry in entries:
        record = by_files.get(_key(entry.files)) if entry.name.lower() == "gpu" and entry.files else None
        if record is None or entry.type is None or record.type is None or entry.type in record.type:
            continue
        out.append(Mismatch("renamed", entry.line, f"Type={entry.type}: Slurm {release} (AutoDetect=nvml) "
                            f"names {_describe(record)} {record.type}; rename it here, in slurm.conf and "
                            "wherever jobs ask for it when the cluster moves to such a Slurm"))
    return out


def _compare(entry: ConfEntry, record: GresRecord, by_index: dict[int, GresRecord],
             widened: tuple[int, ...] | None = None) -> list[Mismatch]:
    out: list[Mismatch] = []
    want_type = record.type or ""
    if entry.type is None:
        out.append(Mismatch("type", entry.line, f"{_show(entry.files)} has no Type=; AutoDetect names it "
                            f"{want_type}"))
    elif entry.type not in want_type:
        out.append(Mismatch("type", entry.line, f"Type={entry.type} would not match AutoDetect's "
                            f"{want_type} (a Type must equal it or be a part of it)"))
    if record.cores is not None and entry.cores != record.cores:
        out.append(_cores_mismatch(entry, record, by_index, widened))
    if record.links is not None and entry.links is not None and entry.links != record.links:
        out.append(Mismatch("links", entry.line, f"Links={','.join(map(str, entry.links))} but the hardware "
                            f"has Links={record.links_text}"))
    return out


def _cores_mismatch(entry: ConfEntry, record: GresRecord, by_index: dict[int, GresRecord],
                    widened: tuple[int, ...] | None = None) -> Mismatch:
    """``widened``: the line's cores as whole sockets, where the release wants them (the records'
    cores are whole sockets then, so a line numbered by index matches another GPU's only so)."""
    have = "no Cores=" if entry.cores is None else f"Cores={format_ranges(entry.cores)}"
    m = _MINOR_RE.search(entry.files[0])
    if m and record.mig is None:
        number = int(m.group(1))
        other = by_index.get(number)
        if other is not None and other is not record and other.cores in (entry.cores, widened):
            return Mismatch("file", entry.line,
                            f"File={entry.files[0]} looks numbered by GPU index: index {number} is "
                            f"{other.gpu.bus_id} at /dev/nvidia{other.gpu.minor}, and /dev/nvidia{number} "
                            f"is {record.gpu.bus_id} (GPU {record.gpu.index}, Cores={record.cores_text})")
    hint = ""
    os_cpus = set(record.gpu.cpu_affinity)
    if entry.cores is not None and set(entry.cores) == os_cpus != set(record.cores or ()):
        hint = " (these are OS CPU ids, as nvidia-smi prints them, not Slurm core ids)"
    return Mismatch("cores", entry.line, f"{_show(entry.files)} has {have} but {_describe(record)} is "
                    f"closest to Cores={record.cores_text}{hint}")


def _split_socket(entry: ConfEntry, record: GresRecord, plan: GresPlan) -> Mismatch:
    cmap = plan.core_map
    first = min(entry.cores or (0,)) // cmap.cores_per_socket
    span = cmap.socket_cores(first)
    return Mismatch("cores", entry.line, f"Cores={format_ranges(entry.cores or ())} is not whole sockets "
                    f"(socket {first} is cores {span.start}-{span.stop - 1}): Slurm 24.11 and later set the "
                    "node INVAL (\"GRES core specification ... doesn't match socket boundaries\"); write "
                    f"Cores={record.cores_text}")


def _describe(record: GresRecord) -> str:
    g = record.gpu
    if record.mig is not None:
        return f"MIG {record.mig.profile} (GI {record.mig.gi_id}, CI {record.mig.ci_id}) on GPU {g.index}"
    return f"GPU {g.index} {g.bus_id}"


def _show(files: tuple[str, ...]) -> str:
    return ",".join(files)
