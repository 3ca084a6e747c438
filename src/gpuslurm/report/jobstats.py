"""One job's GPU efficiency, for its user (pure): per GPU utilisation, memory, power, energy and
time idle over the job's lifetime, the processes seen, and a verdict with notes.

Input is the job's record from the node's store (:class:`gpuslurm.state.store_job.JobRecord`);
nothing here reads a file or the clock. docs/jobstats.md says what each figure means.

- Durations: a raw sample stands for the time to the next one, at most ``max_gap_s`` (a longer
  gap is time the monitor did not see); the last sample stands for nothing. A minute row stands
  for its minute.
- Energy: the rises of NVML's total energy counter where the GPU has one; else power integrated
  over the same durations (the trapezoid between two raw samples, the minute's mean power for a
  minute row). Where the counter falls (a driver reload or GPU reset restarted it) or rises by
  more than any GPU draws (``samples.MAX_GPU_POWER_W``: a broken or forged capture), the power
  between those two samples stands in; a power reading beyond that bound counts nothing. Per
  whole GPU. A MIG device has no power reading of its own, so it has no energy; a GPU other jobs
  were given at the same time (shards, MPS) is marked ``shared_with`` and its energy is the whole
  GPU's, not split.
- Idle: a span whose utilisation is at or below ``idle_pct``, whatever memory the job holds then
  (memory held at ~0 % is idle memory, not use); with ``held_busy_mib`` (``[detect.idle]
  held_memory = "busy"``), a span holding at least that much is not idle.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

from gpuslurm.errors import InputError
from gpuslurm.jsondoc import document
from gpuslurm.samples import counter_rise_j, interval_energy_j, plausible_power_w
from gpuslurm.state.store_job import DeviceSeries, JobRecord, SeriesPoint

NOTE_KINDS = ("idle", "busy-then-idle", "smaller", "all")
HEADROOM = 1.1  # a smaller GPU must hold the peak plus this margin
MIB_PER_GIB = 1024.0
J_PER_KWH = 3.6e6


class Settings(NamedTuple):
    """The thresholds and the site's words (from ``[detect.idle]`` and ``[jobstats]``)."""

    idle_pct: float = 5.0
    tail_idle_s: float = 1800.0  # idle this long at the end of a busy job: "busy then idle"
    max_gap_s: float = 180.0
    held_busy_mib: float | None = None  # [detect.idle] held_memory = "busy": holding this is not idle
    offers: tuple[tuple[str, float], ...] = ()  # smaller GPUs / MIG profiles here: name -> GiB
    site_notes: tuple[tuple[str, str], ...] = ()  # note kind -> the site's text for it
    links: tuple[str, ...] = ()


class GpuFigures(NamedTuple):
    uuid: str
    gpu_uuid: str | None
    samples: int
    util_min_pct: float | None  # None once some samples are only in minute rows
    util_mean_pct: float | None
    util_max_pct: float | None
    mem_peak_mib: float | None
    mem_mean_mib: float | None  # raw samples only
    mem_total_mib: float | None
    power_mean_w: float | None
    energy_j: float | None
    energy_covered_s: float  # the time the energy integral spans
    observed_s: float  # the time the samples stand for
    idle_s: float
    idle_tail_s: float  # idle at the end of the job
    shared_with: tuple[str, ...]
    energy_source: str | None = None  # "counter", "power", "counter+power"
    counter_resets: int = 0
    node: str | None = None  # the device's node, where the job's record spans nodes (Prometheus)


class Note(NamedTuple):
    kind: str
    text: str
    site_text: str | None = None


class JobStats(NamedTuple):
    job: JobRecord
    running: bool
    gpus: tuple[GpuFigures, ...]
    energy_j: float | None
    verdict: str
    notes: tuple[Note, ...]
    links: tuple[str, ...]


def may_see(caller_uid: int, caller_gids: Sequence[int], admin_gids: Sequence[int],
             owner_uid: int) -> bool:
    """Whether the caller may see a job of ``owner_uid``: its owner, root, or a member of an
    admin group; decided by the caller's real uid and groups, never by a name they give."""
    return caller_uid in (0, owner_uid) or any(g in admin_gids for g in caller_gids)


def check_site_notes(notes: Sequence[tuple[str, str]]) -> None:
    for kind, _ in notes:
        if kind not in NOTE_KINDS:
            raise InputError(f"unknown note kind {kind!r} in [jobstats] notes: use one of "
                             f"{', '.join(NOTE_KINDS)}", source="[jobstats] notes")


def gpu_figures(series: DeviceSeries, s: Settings) -> GpuFigures:
    """One device's figures over the job (see the module docstring for durations and energy)."""
    pts = series.points
    max_gap = _max_gap(pts, s.max_gap_s)
    util_w = util_sum = observed = idle = idle_tail = 0.0
    for i, p in enumerate(pts):
        if p.span_s:
            span = p.span_s
        elif i + 1 < len(pts) and pts[i + 1].ts - p.ts <= max_gap:
            span = pts[i + 1].ts - p.ts
        else:
            span = 0.0
        observed += span
        if p.util_pct is not None:
            util_w += p.samples
            util_sum += p.util_pct * p.samples
            if p.util_pct <= s.idle_pct and not _holds(p.mem_mib, s.held_busy_mib):
                idle += span
                idle_tail += span
            else:
                idle_tail = 0.0
    energy = _energy(pts, max_gap)
    raw = [p for p in pts if not p.span_s]
    rolled = len(raw) < len(pts)
    utils = [p.util_pct for p in raw if p.util_pct is not None]
    mems = [p.mem_mib for p in raw if p.mem_mib is not None]
    powers = [(p.power_w, p.samples) for p in pts if p.power_w is not None]
    return GpuFigures(
        series.uuid, series.gpu_uuid, sum(p.samples for p in pts),
        None if rolled or not utils else min(utils),
        util_sum / util_w if util_w else None,
        _max(p.util_max_pct for p in pts), _max(p.mem_mib for p in pts),
        sum(mems) / len(mems) if mems and not rolled else None,
        _max(p.mem_total_mib for p in pts),
        sum(w * n for w, n in powers) / sum(n for _, n in powers) if powers else None,
        energy.joules, energy.covered_s, observed, idle, idle_tail, series.shared_with,
        energy.source, energy.resets, series.node)


class Energy(NamedTuple):
    joules: float | None
    covered_s: float
    source: str | None  # "counter", "power", "counter+power" (across a reset, or mixed), None
    resets: int  # times the counter fell (a driver reload, a GPU reset)


class EnergyPart(NamedTuple):
    ts: float  # where the span it counts begins
    joules: float
    span_s: float  # the time it covers (0: a counter's step out of a minute row)
    source: str  # "counter" or "power"


def energy_parts(pts: Sequence[SeriesPoint], max_gap: float) -> tuple[list[EnergyPart], int]:
    """Each span's energy, and how often the counter was not counted: NVML's energy counter's rises
    where it has one; else power integrated (the trapezoid between raw samples, a minute row's mean
    power over its minute). Where the counter fell (it restarted) or jumped beyond any GPU
    (samples.counter_rise_j), the power between the two samples stands in; a power reading beyond
    any GPU counts nothing."""
    parts: list[EnergyPart] = []
    resets = 0
    for i, p in enumerate(pts):
        if p.span_s:  # a minute row: what lies between its samples
            inside = counter_rise_j(0.0, p.energy_inside_mj, p.span_s)
            power = plausible_power_w(p.power_w)
            if inside is not None:
                parts.append(EnergyPart(p.ts, inside, p.span_s, "counter"))
            elif power is not None:
                parts.append(EnergyPart(p.ts, power * p.span_s, p.span_s, "power"))
            else:
                continue
        if i + 1 == len(pts):
            break
        q = pts[i + 1]
        if q.ts - p.ts > max_gap + p.span_s or (p.span_s and p.energy_last_mj is None):
            continue  # a gap the monitor did not see, or a minute counted whole by its power
        a, b = p.energy_last_mj, q.energy_first_mj
        # the counter's two readings lie at most this far apart (a minute row's are inside it)
        apart = q.ts + q.span_s - p.ts
        gap = 0.0 if p.span_s else q.ts - p.ts  # the time this part stands for
        rise = counter_rise_j(a, b, apart)
        if rise is not None:
            parts.append(EnergyPart(p.ts + p.span_s, rise, gap, "counter"))
            continue
        resets += a is not None and b is not None
        got = interval_energy_j(None, None, p.power_w, None if q.span_s else q.power_w, gap)
        if got is not None:
            parts.append(EnergyPart(p.ts, got[0], gap, got[1]))
    return parts, resets


def _energy(pts: Sequence[SeriesPoint], max_gap: float) -> Energy:
    parts, resets = energy_parts(pts, max_gap)
    if not parts:
        return Energy(None, 0.0, None, resets)
    return Energy(sum(e.joules for e in parts), sum(e.span_s for e in parts),
                  "+".join(sorted({e.source for e in parts})), resets)


def _max_gap(pts: Sequence[SeriesPoint], floor_s: float) -> float:
    """The longest gap between raw samples still counted as seen: three times the store's usual
    interval (its median gap), and at least ``floor_s`` (three of the configured intervals)."""
    gaps = sorted(b.ts - a.ts for a, b in itertools.pairwise(pts) if not a.span_s and not b.span_s)
    return max(floor_s, 3 * gaps[len(gaps) // 2]) if gaps else floor_s


def compute(job: JobRecord, s: Settings, *, running: bool) -> JobStats:
    """The job's figures, verdict and notes."""
    check_site_notes(s.site_notes)
    gpus = tuple(gpu_figures(d, s) for d in job.devices)
    site = dict(s.site_notes)
    notes: list[Note] = []
    idle = [g for g in gpus if g.util_mean_pct is not None and g.util_mean_pct <= s.idle_pct
            and not _holds(g.mem_peak_mib, s.held_busy_mib)]
    if idle:
        held = _max(g.mem_peak_mib for g in idle)
        holding = f", holding up to {_gib(held)} of memory" if held else ""
        notes.append(Note("idle", f"{len(idle)} of {len(gpus)} GPU(s) were idle (mean utilisation "
                          f"at or below {s.idle_pct:g} %){holding}: {', '.join(g.uuid for g in idle)}. "
                          "Request only the GPUs your code uses.", site.get("idle")))
    tail = [g for g in gpus if g not in idle and g.idle_tail_s >= s.tail_idle_s]
    if tail:
        longest = max(g.idle_tail_s for g in tail)
        notes.append(Note("busy-then-idle", f"{len(tail)} GPU(s) were busy, then idle for the last "
                          f"{_duration(longest)} of the job: end the job (or release the GPUs) when "
                          "the GPU work is done.", site.get("busy-then-idle")))
    smaller = _smaller(gpus, s.offers)
    if smaller is not None:
        notes.append(Note("smaller", smaller, site.get("smaller")))
    if "all" in site:
        notes.append(Note("all", "", site["all"]))
    energies = [g.energy_j for g in gpus if g.energy_j is not None]
    verdict = "idle GPUs" if idle else "room to improve" if tail or smaller else "good"
    if not any(g.samples for g in gpus):
        verdict = "no samples"
    return JobStats(job, running, gpus, sum(energies) if energies else None, verdict, tuple(notes),
                    s.links)


def _smaller(gpus: Sequence[GpuFigures], offers: Sequence[tuple[str, float]]) -> str | None:
    """The smallest GPU or MIG profile here that would hold every GPU's peak, when smaller."""
    peaks = [g.mem_peak_mib for g in gpus]
    totals = [g.mem_total_mib for g in gpus]
    if not gpus or not offers or any(p is None for p in peaks) or any(t is None for t in totals):
        return None
    peak = max(p for p in peaks if p is not None)
    total = min(t for t in totals if t is not None)
    fits = sorted((gib, name) for name, gib in offers
                  if gib * MIB_PER_GIB >= peak * HEADROOM and gib * MIB_PER_GIB < total)
    if not fits:
        return None
    gib, name = fits[0]
    return (f"Peak GPU memory was {_gib(peak)} of {_gib(total)}: a {name} ({gib:g} GiB) would hold it; "
            "asking for one leaves the larger GPUs to jobs that need them.")


def _holds(mem_mib: float | None, busy_mib: float | None) -> bool:
    return busy_mib is not None and mem_mib is not None and mem_mib >= busy_mib


def _max(values: Any) -> float | None:
    known = [v for v in values if v is not None]
    return max(known) if known else None


def _gib(mib: float | None) -> str:
    return "-" if mib is None else f"{mib / MIB_PER_GIB:.1f} GiB"


def _duration(seconds: float) -> str:
    minutes = int(seconds // 60)
    return f"{minutes // 60} h {minutes % 60:02d} min" if minutes >= 60 else f"{minutes} min"


def to_json(st: JobStats) -> dict[str, Any]:
    """The ``jobstats`` JSON document (schemas/jobstats.json)."""
    j = st.job
    return document("jobstats", {
        "job": {"id": j.job_id, "user": j.user, "uid": j.uid, "account": j.account, "start": j.start,
                "last_seen": j.last_seen, "duration_s": j.last_seen - j.start, "running": st.running,
                "source": j.source},
        "gpus": [_gpu_json(g) for g in st.gpus],
        "processes": [p._asdict() for p in j.processes],
        "energy_j": st.energy_j,
        "energy_kwh": None if st.energy_j is None else st.energy_j / J_PER_KWH,
        "verdict": st.verdict,
        "notes": [n._asdict() for n in st.notes],
        "links": list(st.links),
    }, node=j.node)


def _gpu_json(g: GpuFigures) -> dict[str, Any]:
    out = {**g._asdict(), "shared_with": list(g.shared_with)}
    if g.node is None:  # a node's own store: its one node is the document's
        del out["node"]
    return out


def table(doc: Mapping[str, Any]) -> list[str]:
    """The ``jobstats`` text from its JSON document (:func:`to_json`, or the job's file): the job,
    a row per GPU, the processes, the verdict and notes."""
    j = doc["job"]
    state = "running" if j["running"] else "ended"
    lines = [f"Job {j['id']} on {doc.get('node', '?')}: user {j['user']} (uid {j['uid']}), account "
             f"{j['account'] or '-'}, {_duration(j['duration_s'])}, {state}"]
    lines.append(f"{'GPU':<22} {'UTIL% min/mean/max':>18} {'MEM GiB peak/mean':>17} {'POWER W':>8} "
                 f"{'ENERGY kWh':>10} {'IDLE':>10}")
    nodes = sorted({g["node"] for g in doc["gpus"] if isinstance(g.get("node"), str)})
    node = None
    for g in sorted(doc["gpus"], key=lambda g: str(g.get("node") or "")) if nodes else doc["gpus"]:
        if nodes and g.get("node") != node:
            node = g.get("node")
            energy = [x["energy_j"] for x in doc["gpus"]
                      if x.get("node") == node and x["energy_j"] is not None]
            lines.append(f"On {node}:" + (f" {sum(energy) / J_PER_KWH:.3f} kWh" if energy else ""))
        util = "/".join(_num(g[k], 1, 0) for k in ("util_min_pct", "util_mean_pct", "util_max_pct"))
        mem = f"{_num(g['mem_peak_mib'], MIB_PER_GIB)}/{_num(g['mem_mean_mib'], MIB_PER_GIB)}"
        lines.append(f"{_short(g['uuid']):<22} {util:>18} {mem:>17} {_num(g['power_mean_w'], 1, 0):>8} "
                     f"{_num(g['energy_j'], J_PER_KWH, 3):>10} {_duration(g['idle_s']):>10}"
                     + (f"  shared with {', '.join(g['shared_with'])}" if g["shared_with"] else ""))
    if doc["energy_j"] is not None:
        lines.append(f"Energy (whole GPUs): {doc['energy_j'] / J_PER_KWH:.3f} kWh")
    if doc["processes"]:
        lines.append("Processes seen:")
        for p in doc["processes"]:
            lines.append(f"  {p['pid']:>8} {p['name'] or '?':<16} on {_short(p['device'])}, "
                         f"peak {_num(p['mem_max_mib'], MIB_PER_GIB)} GiB")
    lines.append(f"Verdict: {doc['verdict']}")
    for n in doc["notes"]:
        for text in (n["text"], n["site_text"]):
            if text:
                lines.append(f"  * {text}")
    for link in doc["links"]:
        lines.append(f"  See {link}")
    # a process's name and a PBS account are the user's text, read by root and admins: no control
    # character (escape sequence, line break) of theirs reaches a terminal
    return ["".join(c if c.isprintable() else "?" for c in line) for line in lines]


def _short(uuid: str) -> str:
    return uuid if len(uuid) <= 22 else uuid[:21] + "…"


def _num(value: float | None, unit: float = 1.0, digits: int = 1) -> str:
    return "-" if value is None else f"{value / unit:.{digits}f}"
