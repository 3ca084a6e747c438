"""The live node view of ``gpuslurm status`` and ``gpuslurm watch``: snapshot in, lines out (pure).

A :class:`Snapshot` is one moment of one node: its GPUs with their health, the jobs holding them,
the processes on them (attributed to jobs) and the violations current now. :func:`build_snapshot`
makes one from a monitor :class:`~gpuslurm.samples.Cycle`; :func:`render` lays it out in a
given width, every line at most that wide; :func:`snapshot_dict` is the ``--json`` form. Nothing
here reads a clock, a file or the terminal.

A process is marked rogue as soon as it is seen where its job may not run (the rogue detector's
own rule), without waiting for a stored finding; a job is marked idle only by an idle violation,
since idleness needs a window of history one glance does not have.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

from gpuslurm.hw.model.node import Node
from gpuslurm.policy.rogue import why_rogue
from gpuslurm.policy.usage import view
from gpuslurm.policy.wording import span
from gpuslurm.samples import Cycle, ScanProblem, Violation

MIN_WIDTH = 40
_MARKS = {"rogue": "ROGUE", "idle": "IDLE", "over-share": "OVER SHARE"}


class GpuLine(NamedTuple):
    """One GPU or MIG device as the view shows it; unknown figures are None."""

    label: str  # "0", or "0.1" for MIG device 1 of GPU 0
    uuid: str  # the device's own UUID (MIG UUID for a MIG device)
    model: str
    bus_id: str  # the GPU's PCI bus id (a MIG device's: its GPU's), as NVML prints it
    util_pct: float | None
    mem_used_mib: float | None
    mem_total_mib: float | None
    temp_c: float | None
    power_w: float | None
    health: str  # "ok", "lost", or the first fault ("Xid 79")
    faults: tuple[str, ...]  # every fault, in words
    jobs: tuple[str, ...]  # "812 alice", one per job holding the device


class ProcLine(NamedTuple):
    """One process on a device, with its job and what is wrong with it (if anything)."""

    gpu: str  # the device label
    pid: int
    name: str | None
    user: str | None
    job_id: str | None
    mem_mib: float | None
    sm_util_pct: float | None
    marks: tuple[str, ...]  # violation kinds: "rogue", "over-share"
    why: str | None  # why it is rogue, in the detector's words


class JobLine(NamedTuple):
    """One job holding devices on the node."""

    job_id: str
    user: str
    account: str | None
    gpus: tuple[str, ...]  # device labels
    start: float
    util_pct: float | None  # mean over its devices right now
    procs: int
    marks: tuple[str, ...]  # "idle", "over-share", "rogue"


class Snapshot(NamedTuple):
    """One moment of one node, ready to show."""

    node: str
    ts: float
    source: str  # where the GPUs were read: "NVML", "replay dgx-h100", …
    findings: str  # where the violations came from
    gpus: tuple[GpuLine, ...]
    jobs: tuple[JobLine, ...]
    procs: tuple[ProcLine, ...]
    violations: tuple[Violation, ...]
    problems: tuple[ScanProblem, ...]


class Line(NamedTuple):
    """A rendered line and how to emphasise it: "", "head", "bad", "warn" or "dim"."""

    text: str
    style: str = ""


# ---- building ------------------------------------------------------------------------------------

def device_labels(node: Node) -> dict[str, str]:
    """Device UUID → the short label the view uses ("3", or "3.1" for a MIG device)."""
    labels: dict[str, str] = {}
    for g in node.gpus:
        labels[g.uuid] = str(g.index)
        for m in g.mig_devices:
            if m.uuid:
                labels[m.uuid] = f"{g.index}.{m.index}"
    return labels


def build_snapshot(node: Node, cycle: Cycle, violations: Sequence[Violation], *,
                   faults: Mapping[str, Sequence[str]] | None = None, source: str = "",
                   findings: str = "") -> Snapshot:
    """A snapshot of ``cycle`` on ``node``; ``faults`` are health faults in words, by GPU UUID."""
    faults = faults or {}
    labels = device_labels(node)
    models = {g.uuid: g.name for g in node.gpus}
    buses = {g.uuid: g.bus_id for g in node.gpus}
    for g in node.gpus:
        for m in g.mig_devices:
            if m.uuid:
                models[m.uuid] = f"{g.name} {m.profile}".strip()
                buses[m.uuid] = g.bus_id
    lost = {p.subject for p in cycle.problems if p.kind == "gpu-lost"}
    v = view(cycle)
    by_dev: dict[str, list[str]] = {}
    for a in sorted(cycle.allocations, key=lambda a: _job_key(a.job_id)):
        for u in dict.fromkeys(a.uuids):
            by_dev.setdefault(u, []).append(f"{a.job_id} {a.user}")

    gpu_lines: list[GpuLine] = []
    seen: set[str] = set()
    for s in cycle.gpus:
        dev = s.mig_uuid or s.gpu_uuid
        seen.add(dev)
        said = tuple(faults.get(dev, ()))
        gpu_lines.append(GpuLine(labels.get(dev, dev), dev, models.get(dev, ""), buses.get(dev, ""),
                                 s.util_pct,
                                 s.mem_used_mib, s.mem_total_mib, s.temp_c, s.power_w,
                                 said[0] if said else "ok", said, tuple(by_dev.get(dev, ()))))
    for g in node.gpus:  # a lost GPU has no sample, but the admin must see it is missing
        if g.uuid not in seen:
            said = tuple(faults.get(g.uuid, ())) or (("GPU is lost",) if g.uuid in lost else ("not sampled",))
            gpu_lines.append(GpuLine(labels[g.uuid], g.uuid, g.name, g.bus_id, None, None,
                                     float(g.memory_mib),
                                     None, None, "lost" if g.uuid in lost else said[0], said,
                                     tuple(by_dev.get(g.uuid, ()))))
    order = {g.uuid: i for i, g in enumerate(node.gpus)}
    gpu_lines.sort(key=lambda x: (_label_key(x.label), order.get(x.uuid, 0)))

    marks_of_proc: dict[tuple[int, str], set[str]] = {}
    marks_of_job: dict[str, set[str]] = {}
    for f in violations:
        if f.pid is not None and f.gpu_uuid is not None:
            marks_of_proc.setdefault((f.pid, f.gpu_uuid), set()).add(f.kind)
        if f.job_id is not None:
            marks_of_job.setdefault(f.job_id, set()).add(f.kind)

    proc_lines: list[ProcLine] = []
    for p in cycle.procs:
        dev = p.mig_uuid or p.gpu_uuid
        why = why_rogue(p, v)
        marks = set(marks_of_proc.get((p.pid, dev), ()))
        if why is not None:
            marks.add("rogue")
        else:
            marks.discard("rogue")  # a stored finding from before the job's map appeared
        user = p.user or (v.allocs[p.job_id].user if p.job_id in v.allocs else None)
        proc_lines.append(ProcLine(labels.get(dev, dev), p.pid, p.name, user, p.job_id, p.mem_mib,
                                   p.sm_util_pct, tuple(sorted(marks)), why))
    proc_lines.sort(key=lambda x: (_label_key(x.gpu), x.pid))

    job_lines: list[JobLine] = []
    for a in sorted(cycle.allocations, key=lambda a: _job_key(a.job_id)):
        utils = [u for u in (v.util.get(d) for d in a.uuids) if u is not None]
        mean = sum(utils) / len(utils) if utils else None
        procs = sum(1 for p in cycle.procs if p.job_id == a.job_id)
        gpus = tuple(labels.get(u, u) for u in a.uuids)
        job_lines.append(JobLine(a.job_id, a.user, a.account, gpus, a.start, mean, procs,
                                 tuple(sorted(marks_of_job.get(a.job_id, ())))))
    ordered = tuple(sorted(violations, key=lambda f: (_severity_rank(f.severity), f.kind, f.start)))
    return Snapshot(cycle.node, cycle.ts, source, findings, tuple(gpu_lines), tuple(job_lines),
                    tuple(proc_lines), ordered, cycle.problems)


def _severity_rank(severity: str) -> int:
    return {"critical": 0, "warning": 1}.get(severity, 2)


def _job_key(job_id: str) -> tuple[int, str]:
    head = job_id.partition("_")[0].partition(".")[0].partition("[")[0]  # Slurm 12_3, PBS 12[3].server
    return (int(head) if head.isascii() and head.isdigit() and len(head) <= 18 else -1, job_id)


def _label_key(label: str) -> tuple[int, ...]:
    parts = label.split(".")
    return tuple(int(p) if p.isascii() and p.isdigit() and len(p) <= 9 else 1 << 30 for p in parts)


def short_bus_id(bus_id: str) -> str:
    """``00000000:81:00.0`` → ``81:00.0``: the domain only where it is not 0, as lspci prints it."""
    domain, sep, rest = bus_id.partition(":")
    return rest if sep and domain.strip("0") == "" else bus_id


def short_name(name: str) -> str:
    """``NVIDIA RTX A5000`` → ``RTX A5000``: every GPU here is NVIDIA's, as nvitop shows them."""
    return name[len("NVIDIA "):] if name.startswith("NVIDIA ") else name


# ---- rendering -----------------------------------------------------------------------------------

def render(snap: Snapshot, width: int = 80) -> list[Line]:
    """The snapshot as lines no wider than ``width`` (at least MIN_WIDTH)."""
    width = max(width, MIN_WIDTH)
    out: list[Line] = []

    def add(text: str, style: str = "") -> None:
        # process names are any user's text (prctl): no control character of theirs reaches a terminal
        out.append(Line(_fit("".join(c if c.isprintable() else "?" for c in text), width), style))

    users = {j.user for j in snap.jobs} | {p.user for p in snap.procs if p.user}
    n_v = len(snap.violations)
    add(f"{snap.node}  {_clock(snap.ts)}  {_count(len(snap.gpus), 'device')}  "
        f"{_count(len(snap.jobs), 'job')}  {_count(len(users), 'user')}  {_count(n_v, 'violation')}", "head")
    if snap.source or snap.findings:
        said = "; ".join(x for x in (f"GPUs: {snap.source}" if snap.source else "",
                                     f"violations: {snap.findings}" if snap.findings else "") if x)
        for i, piece in enumerate(_wrap(said, width, width - 2)):
            add(piece if i == 0 else "  " + piece, "dim")
    add("")
    # rows keyed as nvidia-smi and nvitop key them: index, name, bus id (a UUID prefix is no key:
    # placeholder captures repeat one UUID on every GPU)
    bus_w = max([7, *(len(short_bus_id(g.bus_id)) for g in snap.gpus)])
    name_w = max(10, min(max([0, *(len(short_name(g.model)) for g in snap.gpus)]), 10 + width - 80))
    add(f"{'GPU':>4} {'NAME':<{name_w}} {'BUS-ID':<{bus_w}} {'UTIL':<11} {'MEMORY':>13} {'TEMP':>4} "
        f"{'POWER':>5} {'HEALTH':<7} JOBS", "head")
    for g in snap.gpus:
        style = "bad" if g.health != "ok" else ""
        add(f"{g.label:>4} {_cut(short_name(g.model), name_w):<{name_w}} {short_bus_id(g.bus_id):<{bus_w}} "
            f"{_util(g.util_pct):<11} {_mem(g.mem_used_mib, g.mem_total_mib):>13} {_num(g.temp_c, 'C'):>4} "
            f"{_num(g.power_w, 'W'):>5} {g.health[:7]:<7} {', '.join(g.jobs) or '-'}", style)

    add("")
    if snap.jobs:
        add(f"{'JOB':<9} {'USER':<10} {'ACCOUNT':<9} {'GPUS':<9} {'RUNNING':>11} {'UTIL':>5} {'PROCS':>5}",
            "head")
        for j in snap.jobs:
            mark = "  " + " ".join(_MARKS.get(m, m.upper()) for m in j.marks) if j.marks else ""
            style = "bad" if "rogue" in j.marks else "warn" if j.marks else ""
            add(f"{j.job_id:<9} {j.user[:10]:<10} {(j.account or '-')[:9]:<9} {','.join(j.gpus)[:9]:<9} "
                f"{span(snap.ts - j.start):>11} {_pct(j.util_pct):>5} {j.procs:>5}{mark}", style)
    else:
        add("no jobs hold a GPU on this node", "dim")

    add("")
    if snap.procs:
        add(f"{'GPU':>4} {'PID':>8} {'USER':<10} {'JOB':<9} {'PROCESS':<16} {'GPU MEM':>9} {'SM':>4}", "head")
        for p in snap.procs:
            mark = "  " + " ".join(_MARKS.get(m, m.upper()) for m in p.marks) if p.marks else ""
            style = "bad" if "rogue" in p.marks else "warn" if p.marks else ""
            add(f"{p.gpu:>4} {p.pid:>8} {(p.user or '?')[:10]:<10} {(p.job_id or '-')[:9]:<9} "
                f"{(p.name or '?')[:16]:<16} {_gib(p.mem_mib):>9} {_pct(p.sm_util_pct):>4}{mark}", style)
    else:
        add("no process holds a GPU", "dim")

    if snap.violations:
        add("")
        add(f"VIOLATIONS ({n_v})", "head")
        for f in snap.violations:
            style = "bad" if f.severity == "critical" else "warn"
            head = f"{_MARKS.get(f.kind, f.kind.upper())} for {span(f.duration_s)}: "
            for i, piece in enumerate(_wrap(head + f.evidence, width - 2, width - 4)):
                add(("  " if i == 0 else "    ") + piece, style)
    unhealthy = [g for g in snap.gpus if g.health != "ok"]
    if unhealthy:
        add("")
        add("HEALTH", "head")
        for g in unhealthy:
            for piece in _wrap(f"GPU {g.label} {g.uuid}: " + "; ".join(g.faults or (g.health,)),
                               width - 2, width - 4):
                add("  " + piece, "bad")
    if snap.problems:
        add("")
        add(f"PROBLEMS ({len(snap.problems)})", "head")
        for pr in snap.problems[:10]:
            said = f"{pr.kind}: {pr.subject}" + (f": {pr.detail}" if pr.detail else "")
            for i, piece in enumerate(_wrap(said, width - 2, width - 4)):
                add(("  " if i == 0 else "    ") + piece, "dim")
        if len(snap.problems) > 10:
            add(f"  … and {len(snap.problems) - 10} more", "dim")
    return out


def plain(lines: Sequence[Line]) -> str:
    """The lines as plain text, one per line."""
    return "".join(line.text.rstrip() + "\n" for line in lines)


_ANSI = {"head": "\x1b[1m", "bad": "\x1b[31;1m", "warn": "\x1b[33m", "dim": "\x1b[2m"}


def styled(line: Line) -> str:
    """The line with ANSI colour for its style (its visible width is unchanged)."""
    code = _ANSI.get(line.style)
    return f"{code}{line.text}\x1b[0m" if code and line.text else line.text


def _fit(text: str, width: int) -> str:
    text = text.rstrip()
    return text if len(text) <= width else text[:width - 1] + "…"


def _wrap(text: str, first: int, rest: int) -> list[str]:
    """Greedy word wrap; a word longer than the line (a UUID) is cut by :func:`_fit` later."""
    lines: list[str] = []
    current = ""
    limit = first
    for word in text.split():
        if current and len(current) + 1 + len(word) > limit:
            lines.append(current)
            current, limit = word, rest
        else:
            current = f"{current} {word}" if current else word
    if current:
        lines.append(current)
    return lines


def _count(n: int, what: str) -> str:
    return f"{n} {what}" + ("" if n == 1 else "s")


def _clock(ts: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ts))


def _cut(text: str, width: int) -> str:
    return text if len(text) <= width else text[:width - 1] + "…"


def _util(pct: float | None) -> str:
    if pct is None:
        return "[    ]  n/a"
    cells = round(max(0.0, min(pct, 100.0)) / 25)
    return f"[{'#' * cells}{'.' * (4 - cells)}] {pct:3.0f}%"


def _pct(pct: float | None) -> str:
    return "-" if pct is None else f"{pct:.0f}%"


def _num(value: float | None, unit: str) -> str:
    return "-" if value is None else f"{value:.0f}{unit}"


def _gib(mib: float | None) -> str:
    return "-" if mib is None else f"{mib / 1024:.1f} GiB"


def _mem(used: float | None, total: float | None) -> str:
    if used is None and total is None:
        return "-"
    u = "?" if used is None else f"{used / 1024:.1f}"
    t = "?" if total is None else f"{total / 1024:.1f}"
    return f"{u}/{t} GiB"


# ---- JSON ----------------------------------------------------------------------------------------

def snapshot_dict(snap: Snapshot) -> dict[str, Any]:
    """The snapshot as plain JSON-ready data; units in the field names."""
    return {
        "node": snap.node, "ts": snap.ts, "source": snap.source, "violations_from": snap.findings,
        "gpus": [g._asdict() for g in snap.gpus],
        "jobs": [j._asdict() for j in snap.jobs],
        "processes": [p._asdict() for p in snap.procs],
        "violations": [f._asdict() for f in snap.violations],
        "problems": [p._asdict() for p in snap.problems],
    }
