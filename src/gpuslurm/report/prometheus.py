"""Read a report window out of Prometheus (the node monitors' exporters) into :class:`ReportData`.

The same buckets as :func:`gpuslurm.report.query.load_sqlite`: bucket ``i`` covers
``[start + i·step, start + (i+1)·step)`` clipped to ``[since, until)``. Prometheus answers a
``*_over_time(x[R])`` evaluated at ``t`` from the samples in ``(t - R, t]``, so a whole bucket is
one point of a ``query_range`` evaluated at its right edge with ``R = step``; a bucket clipped by
the window (the first when ``since`` is not on the grid, the last when ``until`` is not) is an
instant query with its own range. A range query asks for at most :data:`MAX_POINTS` points, so
long windows are split (Prometheus refuses more than 11,000 points per series).

Where the shipped 5-minute recording rules (``gpuslurm_5m``) cover the window and the step is whole
5 minutes, whole buckets are read from them instead, on their evaluation grid (:func:`_rule_phase`):
sums of their sums, counts and maxima are the raw samples' own, from a tenth of the samples.

A bucket's coverage (:attr:`GpuSeries.cover`) is its scrapes × the scrape interval over its
length; the interval is a whole bucket over the most scrapes one whole bucket of the node holds.

What differs from SQLite, by nature: Prometheus holds the exporter's values at scrape times, so a
cycle the scrape missed is absent and one scraped twice counts twice; the process start time is
not exported, so a PID reused by a process with the same name, job and user continues the same
series; ``uid`` is unknown; a violation's evidence is rebuilt from its labels (the monitor's
sentence carries a growing duration, which would make a new series every minute).
Every failure (unreachable, HTTP error, not Prometheus' JSON) is a one-line InputError: exit 2.
"""

from __future__ import annotations

import itertools
import json
import math
import time

from gpuslurm.policy.wording import span
from gpuslurm.report.data import (
    GAP_INTERVALS,
    AllocationSpan,
    Gap,
    GpuSeries,
    ProcSeries,
    ReportData,
    Sparse,
    bucket_count,
    bucket_start,
    held_until,
)
from gpuslurm.report.prom_client import (
    MAX_POINTS,
    TIMEOUT_S,
    Key,
    PrometheusClient,
    PrometheusError,
    parse_source,
    series_key,
)
from gpuslurm.report.prom_decode import (
    Matrix,
    as_float,
    iso,
    ms,
    node_matcher,
    sample_times,
    selector,
    value,
)
from gpuslurm.report.prom_decode import checked as _checked
from gpuslurm.report.prom_decode import device as _device
from gpuslurm.report.prom_decode import label as _label
from gpuslurm.report.prom_decode import proc_order as _proc_order
from gpuslurm.report.prom_decode import seen as _seen
from gpuslurm.report.prom_grid import DEFAULT_SCRAPE_S, RULE_MEMORY, RULE_STEP_S, Grid
from gpuslurm.samples import Violation
from gpuslurm.state.store_values import Checked

__all__ = ["MAX_POINTS", "TIMEOUT_S", "PrometheusClient", "PrometheusError", "chunk_seconds",
           "load_prometheus", "load_violations", "parse_source"]

# One request's reach: this many nodes over a chunk of the window holding about SAMPLES_PER_QUERY
# samples of one metric (DEVICES_PER_NODE devices a node, scraped at the targets' shortest
# interval, else DEFAULT_SCRAPE_S): a tenth of Prometheus' default --query.max-samples (50M), so
# neither the cluster's size nor the window's length makes any one request costlier.
NODES_PER_QUERY = 16
DEVICES_PER_NODE = 8
SAMPLES_PER_QUERY = 5_000_000
# How far past ``until`` a job's last sighting and a finding's duration are read. SQLite's store
# gives a job's (or finding's) whole span, also when it went on after the window; the report clips
# it. Without this, a job running at ``until`` would seem to end at the last scrape before it.
HORIZON_S = 3600.0
_node_matcher = node_matcher  # the tests' name for it


def load_prometheus(url: str, since: float, until: float, step_s: float,
                    client: PrometheusClient | None = None) -> ReportData:
    """The window ``[since, until)`` of every node Prometheus scraped, in buckets of ``step_s``.

    Each request covers at most :data:`NODES_PER_QUERY` nodes over one chunk of the window (see
    :func:`chunk_seconds`), so no request's cost grows with the cluster or the window.
    """
    prom = client or PrometheusClient(url)
    here = f"prometheus:{prom.url}"
    targets = prom.scrape_intervals()
    nodes = prom.label_values("node", "gpuslurm_gpu_memory_total_bytes", since, until)
    if not nodes:
        raise PrometheusError(f"no gpuslurm GPU samples between {iso(since)} and {iso(until)} "
                              "(is the monitor's exporter scraped?)", source=here)
    grid = window_grid(prom, since, until, step_s, nodes, min(targets.values(), default=DEFAULT_SCRAPE_S))
    n, start = grid.n, grid.start
    samples = grid.matrix(*grid.read["samples"])
    if not samples:
        raise PrometheusError(f"no gpuslurm GPU samples between {iso(since)} and {iso(until)} "
                              "(is the monitor's exporter scraped?)", source=here)
    util = grid.matrix(*grid.read["util"], nan=True)  # a NaN mean: refused below, as the store does
    durations = [hi - lo for lo, hi in (grid.span(b) for b in range(n))]
    intervals = _intervals(samples, grid, targets)
    check = Checked(here, "series")
    device_samples: dict[tuple[str, str], dict[int, float]] = {}
    gpus = []
    series_of: dict[tuple[str, str], list[Key]] = {}
    for key in samples:
        series_of.setdefault((_label(key, "node"), _device(key)), []).append(key)
    for (node, device), keys in sorted(series_of.items(), key=lambda item: (item[0][1], item[0][0])):
        parent = _label(keys[0], "gpu_uuid")
        means = [_checked(check, util.get(key, {}), "gpuslurm_gpu_utilization_ratio", key) for key in keys]
        c, u = _one_device([samples[key] for key in keys], means)
        device_samples[(node, device)] = c
        every = intervals.get(node)
        cover = tuple(0.0 if b not in c or durations[b] <= 0 else 1.0 if every is None
                      else min(c[b] * every / durations[b], 1.0) for b in range(n))
        gpus.append(GpuSeries(node, device, parent or device, tuple(u.get(b) for b in range(n)), cover))

    return ReportData(here, since, until, start, step_s, tuple(gpus), _processes(grid, check, device_samples),
                      job_allocations(grid, intervals),
                      tuple(v for v in load_violations(prom, since, until + HORIZON_S) if v.start <= until),
                      node_gaps(grid, samples, intervals))


def _one_device(counts: list[dict[int, float]], means: list[dict[int, float]]
                ) -> tuple[dict[int, float], dict[int, float]]:
    """One device's samples and mean utilisation per bucket from its series: one, or several
    where its labels changed inside the window (a scrape job renamed, a target label added) or
    two targets scrape it. Counts add up; means are weighted by each series' samples. Each
    device is then one row of the report, so a job holding it is counted once."""
    if len(counts) == 1:
        return counts[0], means[0]
    total: dict[int, float] = {}
    for cells in counts:
        for b, x in cells.items():
            total[b] = total.get(b, 0.0) + x
    weighted: dict[int, list[float]] = {}
    for cells, mean in zip(counts, means, strict=True):
        for b, x in mean.items():
            w = cells.get(b, 0.0) or 1.0  # a mean without a count of its own: one sample
            acc = weighted.setdefault(b, [0.0, 0.0])
            acc[0] += x * w
            acc[1] += w
    return total, {b: s / w for b, (s, w) in weighted.items()}


def node_groups(nodes: list[str]) -> list[str]:
    """A node matcher per :data:`NODES_PER_QUERY` nodes ("" alone: every node, when that few)."""
    return [""] if len(nodes) <= NODES_PER_QUERY else \
        [node_matcher(nodes[i:i + NODES_PER_QUERY]) for i in range(0, len(nodes), NODES_PER_QUERY)]


def window_grid(prom: PrometheusClient, since: float, until: float, step_s: float, nodes: list[str],
                scrape_s: float, rules: bool = True) -> Grid:
    """The window's buckets, on the 5-minute rules' grid where the rules cover it, else (or not
    ``rules``) on the step's own grid from raw samples; requests per node group (:func:`node_groups`)."""
    groups = node_groups(nodes)
    phase = _rule_phase(prom, since, until, step_s, groups[0]) if rules else None
    start = bucket_start(since, step_s) if phase is None else \
        phase + math.floor((since - phase) / step_s) * step_s
    n = bucket_count(start, until, step_s)
    raw = Grid(prom, since, until, start, step_s, n, groups, chunk_seconds(scrape_s, step_s))
    if phase is not None and _rules_cover(raw, nodes):
        return Grid(prom, since, until, start, step_s, n, groups, chunk_seconds(RULE_STEP_S, step_s),
                    rules=True)
    if phase is None:
        return raw
    start = bucket_start(since, step_s)  # the rules miss part of the window: the raw grid
    n = bucket_count(start, until, step_s)
    return Grid(prom, since, until, start, step_s, n, groups, chunk_seconds(scrape_s, step_s))


def _rule_phase(prom: PrometheusClient, since: float, until: float, step_s: float,
                group: str) -> float | None:
    """Where the 5-minute rules' evaluations fall (seconds after a multiple of 5 minutes: a
    Prometheus spreads its rule groups over the interval), when the report can read them: its
    step a whole number of 5 minutes, and the rules' series present at the window's end."""
    if step_s % RULE_STEP_S or until - since < step_s:
        return None
    got = prom.instant(f"max(timestamp({RULE_MEMORY}{selector(group)}))", until)
    last = value(got[0]) if got else None
    if last is None or not math.isfinite(last):
        return None
    return (round(last * 1000) % round(RULE_STEP_S * 1000)) / 1000


def _rules_cover(grid: Grid, nodes: list[str]) -> bool:
    """Whether the rules' series cover the window: at its first and its last whole bucket, their
    counts add up to the raw samples' (rules added, or removed, within the window: no)."""
    whole = [b for b in range(grid.n) if grid.whole(b)]
    if not whole:
        return False
    r = ms(grid.step_s)
    for group, b in ((g, b) for g in grid.groups for b in {whole[0], whole[-1]}):
        at, m = grid.span(b)[1], selector(group)
        counted = [f"sum(count_over_time(gpuslurm_gpu_memory_total_bytes{m}[{r}ms]))",
                   f"sum(sum_over_time({RULE_MEMORY}{m}[{r - 1}ms]))"]
        seen = [(value(got[0]) if got else 0.0) for got in (grid.prom.instant(q, at) for q in counted)]
        if seen[0] != seen[1]:
            return False
    return bool(nodes)


def chunk_seconds(scrape_s: float, step_s: float) -> float:
    """How much of the window one request covers: at most :data:`SAMPLES_PER_QUERY` samples of
    :data:`NODES_PER_QUERY` nodes of :data:`DEVICES_PER_NODE` devices scraped every ``scrape_s``,
    in whole buckets (at least one)."""
    most = SAMPLES_PER_QUERY * max(scrape_s, 0.001) / (NODES_PER_QUERY * DEVICES_PER_NODE)
    return max(1.0, math.floor(most / step_s)) * step_s


def _processes(grid: Grid, check: Checked, device_samples: dict[tuple[str, str], dict[int, float]]
               ) -> tuple[ProcSeries, ...]:
    """Per-process series where the exporter gives them (``prometheus_per_process``); elsewhere one
    series per device, job (or none) and user from ``gpuslurm_device_processes``, PID 0, named
    after no process. Each row holds only the buckets its series lives in (:class:`Sparse`)."""
    n = grid.n
    # a process is present in a scrape when either of its gauges is (an unknown value is absent)
    counts = grid.matrix("count_over_time(gpuslurm_process_gpu_memory_bytes{m}[{r}]) "
                         "or count_over_time(gpuslurm_process_sm_utilization_ratio{m}[{r}])", raw=True)
    sm = grid.matrix("avg_over_time(gpuslurm_process_sm_utilization_ratio{m}[{r}])", raw=True,
                     nan=True) if counts else {}
    per_process = {_label(key, "node") for key in counts}
    devices = grid.matrix(*grid.read["processes"])
    grouped = {key: cells for key, cells in devices.items()
               if _label(key, "node") not in per_process}
    procs = []
    for key in sorted({**counts, **grouped}, key=_proc_order):
        node, device = _label(key, "node"), _device(key)
        mine, dev = counts.get(key) or grouped[key], device_samples.get((node, device), {})
        lo, hi = min(mine), max(mine)
        seen = [0.0] * (hi - lo + 1)
        for b, count in mine.items():  # its own buckets only: most processes live a short while
            seen[b - lo] = _seen(count, dev.get(b))
        if not any(seen):
            continue
        s = _checked(check, sm.get(key, {}), "gpuslurm_process_sm_utilization_ratio", key)
        util: list[float | None] = [None] * (hi - lo + 1)
        for b, v in s.items():
            if lo <= b <= hi:
                util[b - lo] = v
        pid = _label(key, "pid") or "0"  # a forged exporter's pid is refused, as a store's row's is
        number = int(pid) if pid.isascii() and pid.isdigit() else pid
        procs.append(ProcSeries(node, device, check.whole(number, f"the pid label of {key!r}"[:300]),
                                _label(key, "process") or None,
                                _label(key, "user") or None, None, _label(key, "job_id") or None,
                                Sparse(n, lo, seen, 0.0), Sparse(n, lo, util, None)))
    return tuple(procs)


def job_allocations(grid: Grid, intervals: dict[str, float]) -> tuple[AllocationSpan, ...]:
    """Jobs seen in the window: start, the end of the last scrape that saw them (:func:`held_until`;
    up to HORIZON_S after ``until``), devices. Chunk by chunk, each job's series only where it is."""
    ends: dict[tuple[str, str], tuple[dict[str, str], float]] = {}
    for m, v in grid.over_chunks("last_seen", HORIZON_S):
        job = (m.get("node", ""), m.get("job_id", ""))
        if job[1] and (job not in ends or v > ends[job][1]):
            ends[job] = (m, v)
    starts: dict[tuple[str, str], float] = {}
    for m, v in grid.over_chunks("start"):
        job = (m.get("node", ""), m.get("job_id", ""))
        starts[job] = max(v, starts.get(job, v))
    devices: dict[tuple[str, str], set[str]] = {}
    for m, _ in grid.over_chunks("allocated", 0.0, 'job_id!=""'):
        devices.setdefault((m.get("node", ""), m.get("job_id", "")), set()).add(
            m.get("mig_uuid") or m.get("gpu_uuid", ""))
    cycles = _cycle_intervals(grid)
    out = []
    check = Checked(f"prometheus:{grid.prom.url}", "series")  # an infinite time has no bucket
    for job, (m, end) in ends.items():
        begin = starts.get(job)
        if begin is None:
            continue
        where = f"node={json.dumps(job[0])},job_id={json.dumps(job[1])}"[:200]
        begin = check.time(begin, f"gpuslurm_job_start_timestamp_seconds{{{where}}}")
        end = check.time(end, f"gpuslurm_job_last_seen_timestamp_seconds{{{where}}}")
        held = held_until(end, cycles.get(job[0]) or intervals.get(job[0]))
        if held <= grid.since:  # last seen in a rule's 5 minutes before the window
            continue
        out.append(AllocationSpan(job[0], job[1], m.get("user", ""), m.get("account") or None,
                                  tuple(sorted(devices.get(job, ()))), begin, held))
    return tuple(sorted(out, key=lambda a: (a.start, a.job_id, a.node)))


def _cycle_intervals(grid: Grid) -> dict[str, float]:
    """Per node, its monitor's cycle interval (``gpuslurm_monitor_interval_seconds``): what a job's
    last cycle stands for, as in the store, whatever the scrape interval. Absent from an exporter
    older than the gauge: the caller falls back to the scrape interval."""
    out: dict[str, float] = {}
    for m, v in grid.over_chunks("monitor_interval"):
        node = m.get("node", "")
        if 0 < v < 1e6 and v > out.get(node, 0.0):
            out[node] = v
    return out


def node_gaps(grid: Grid, samples: Matrix, intervals: dict[str, float]) -> tuple[Gap, ...]:
    """Times inside the window a node's exporter went unscraped (its monitor down): scrapes more
    than :data:`GAP_INTERVALS` scrape intervals apart. Only buckets short of scrapes are read
    sample by sample (with their neighbours, where a gap may begin or end), so a cluster whose
    scrapes all land costs no request more."""
    most: dict[str, dict[int, float]] = {}
    for key, cells in samples.items():
        mine = most.setdefault(_label(key, "node"), {})
        for b, count in cells.items():
            mine[b] = max(count, mine.get(b, 0.0))
    out: list[Gap] = []
    for node, cells in sorted(most.items()):
        every = intervals.get(node)
        if not every:
            continue
        first, last = min(cells), max(cells)
        short = [b for b in range(first, last + 1)
                 if cells.get(b, 0.0) * every < grid.span(b)[1] - grid.span(b)[0] - 1.5 * every]
        runs: list[list[int]] = []
        for b in short:
            if runs and b <= runs[-1][1] + 1:
                runs[-1][1] = b
            else:
                runs.append([b, b])
        for lo_b, hi_b in runs:
            lo, hi = grid.span(max(first, lo_b - 1))[0], grid.span(min(last, hi_b + 1))[1]
            query = f"gpuslurm_monitor_last_cycle_timestamp_seconds{selector(node_matcher([node]))}" \
                    f"[{ms(hi - lo)}ms]"
            times = sorted({t for r in grid.prom.samples(query, hi) for t in sample_times(r)})
            out += [Gap(node, a, b) for a, b in itertools.pairwise(times)
                    if b - a > GAP_INTERVALS * every and b > grid.since and a < grid.until]
    return tuple(out)


def load_violations(client: PrometheusClient | str, since: float,
                    until: float | None = None) -> list[Violation]:
    """Detector findings that lasted into ``[since, until]`` (until: now), from ``gpuslurm_violation_*``.

    One finding per label set and start time; its duration is the longest the exporters reported.
    """
    prom = client if isinstance(client, PrometheusClient) else PrometheusClient(client)
    until = time.time() if until is None else until
    step = max(15.0, math.ceil((until - since) / 1000))  # ≤ ~1000 points: one query, cheap
    first, last = since + step, since + step * math.ceil((until - since) / step)
    window = f"[{ms(step)}ms]"
    starts = prom.range(f"max_over_time(gpuslurm_violation_start_timestamp_seconds{window})",
                        first, last, step)
    durations = {(series_key(r), float(t)): as_float(v) for r in prom.range(
        f"max_over_time(gpuslurm_violation_duration_seconds{window})", first, last, step)
        for t, v in r.get("values") or ()}
    found: dict[tuple[Key, float], float] = {}
    for r in starts:
        key = series_key(r)
        for t, v in r.get("values") or ():
            begin = as_float(v)
            if begin is None:
                continue
            d = durations.get((key, float(t))) or 0.0
            found[(key, begin)] = max(found.get((key, begin), 0.0), d)
    out = [_violation(dict(key), begin, d) for (key, begin), d in found.items()]
    return sorted(out, key=lambda v: (v.start, v.node, v.kind, v.job_id or "", v.pid or 0))


def _violation(m: dict[str, str], begin: float, duration: float) -> Violation:
    text = m.get("pid", "")
    pid = int(text) if text.isascii() and text.isdigit() and len(text) <= 10 else None
    who = " and ".join(x for x in (f"user {m['user']}" if m.get("user") else "",
                                   f"job {m['job_id']}" if m.get("job_id") else "") if x)
    proc = f"{m.get('process') or 'process'} (PID {pid})" if pid is not None else ""
    where = m.get("mig_uuid") or m.get("gpu_uuid") or "a GPU"
    evidence = (f"{m.get('kind', '?')} on {where} of node {m.get('node', '?')}"
                f"{': ' + proc if proc else ''}{' of ' + who if who else ''}, for {span(duration)} "
                "(reported through Prometheus)")
    return Violation(m.get("kind", ""), m.get("node", ""), m.get("user") or None, m.get("job_id") or None,
                     pid, m.get("process") or None, m.get("mig_uuid") or m.get("gpu_uuid") or None,
                     begin, duration, evidence, m.get("severity") or "warning")


def _intervals(samples: Matrix, grid: Grid, targets: dict[str, float]) -> dict[str, float]:
    """Per node, the scrape interval: its target's (by the series' ``instance``), else a whole
    bucket over the most samples any whole bucket of its GPUs holds. Absent: neither is known."""
    out: dict[str, float] = {}
    most: dict[str, float] = {}
    for key, cells in samples.items():
        node = _label(key, "node")
        every = targets.get(_label(key, "instance"))
        if every:
            out[node] = every
        for b, count in cells.items():
            if grid.whole(b) and count > most.get(node, 0.0):
                most[node] = count
    return {**{node: grid.step_s / count for node, count in most.items()}, **out}
