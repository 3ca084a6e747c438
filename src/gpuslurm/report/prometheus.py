"""Read a report window out of Prometheus (the node monitors' exporters) into :class:`ReportData`.

The same buckets as :func:`gpuslurm.report.query.load_sqlite`: bucket ``i`` covers
``[start + i·step, start + (i+1)·step)`` clipped to ``[since, until)``. Prometheus answers a
``*_over_time(x[R])`` evaluated at ``t`` from the samples in ``(t - R, t]``, so a whole bucket is
one point of a ``query_range`` evaluated at its right edge with ``R = step``; a bucket clipped by
the window (the first when ``since`` is not on the grid, the last when ``until`` is not) is an
instant query with its own range. A range query asks for at most :data:`MAX_POINTS` points, so
long windows are split (Prometheus refuses more than 11,000 points per series).

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

import concurrent.futures
import json
import math
import re
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

from gpuslurm.errors import InputError
from gpuslurm.policy.wording import span
from gpuslurm.report.data import (
    AllocationSpan,
    GpuSeries,
    ProcSeries,
    ReportData,
    Sparse,
    bucket_count,
    bucket_start,
    held_until,
)
from gpuslurm.samples import Violation
from gpuslurm.state.store_values import MAX_PCT, Checked

MAX_POINTS = 10_000  # per series and query; Prometheus' own limit is 11,000
# One request's reach: this many nodes over a chunk of the window holding about SAMPLES_PER_QUERY
# samples of one metric (DEVICES_PER_NODE devices a node, scraped at the targets' shortest
# interval, else DEFAULT_SCRAPE_S): a tenth of Prometheus' default --query.max-samples (50M), so
# neither the cluster's size nor the window's length makes any one request costlier.
NODES_PER_QUERY = 16
DEVICES_PER_NODE = 8
SAMPLES_PER_QUERY = 5_000_000
DEFAULT_SCRAPE_S = 10.0
WORKERS = 4  # requests at once: Prometheus evaluates one while the client reads another
TIMEOUT_S = 30.0
MAX_BYTES = 256 << 20
# How far past ``until`` a job's last sighting and a finding's duration are read. SQLite's store
# gives a job's (or finding's) whole span, also when it went on after the window; the report clips
# it. Without this, a job running at ``until`` would seem to end at the last scrape before it.
HORIZON_S = 3600.0
RULE_STEP_S = 300.0  # the shipped 5-minute recording rules (packaging/gpuslurm-rules.yml)
RULE_MEMORY = "device:gpuslurm_gpu_memory_total_bytes:count_5m"

Key = tuple[tuple[str, str], ...]  # a series' labels, sorted
Matrix = dict[Key, dict[int, float]]  # series → bucket index → value


class PrometheusError(InputError):
    """Prometheus could not be asked, or its answer is not what the HTTP API promises."""


def parse_source(text: str) -> str:
    """The base URL of ``prometheus:URL`` (or a bare URL); InputError when it is not http(s)."""
    url = text[len("prometheus:"):] if text.startswith("prometheus:") else text
    try:
        if len(url) > 2048 or not url.isprintable() or any(c.isspace() for c in url):
            raise ValueError("too long, or a space or control character in it")
        parts = urllib.parse.urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError("not http(s)://HOST")
        _ = parts.port  # ValueError when not a number in 0..65535
        if parts.query or parts.fragment:
            raise ValueError("a query or fragment has no place in the base URL")
    except ValueError as exc:
        raise PrometheusError(f"not an http(s) URL: {url[:200]!r} ({exc}; e.g. prometheus:http://prom:9090)",
                              source="--source") from None
    return url.rstrip("/")


class PrometheusClient:
    """The two HTTP API calls the report needs, with timeouts and one-line errors."""

    def __init__(self, url: str, timeout_s: float = TIMEOUT_S) -> None:
        self.url = parse_source(url)
        self.timeout_s = timeout_s

    def instant(self, query: str, at: float) -> list[dict[str, Any]]:
        """``/api/v1/query`` at ``at``: the vector's elements (``metric``, ``value``)."""
        return self._get("query", {"query": query, "time": _ts(at)}, "vector")

    def range(self, query: str, first: float, last: float, step_s: float) -> list[dict[str, Any]]:
        """``/api/v1/query_range`` from ``first`` to ``last`` (both evaluated), split into parts of
        at most MAX_POINTS points; the parts' values of one series are concatenated."""
        points = round((last - first) / step_s) + 1
        merged: dict[Key, dict[str, Any]] = {}
        for part in range(0, points, MAX_POINTS):
            lo = first + part * step_s
            hi = first + (min(part + MAX_POINTS, points) - 1) * step_s
            params = {"query": query, "start": _ts(lo), "end": _ts(hi), "step": repr(float(step_s))}
            for item in self._get("query_range", params, "matrix"):
                key = _key(item)
                if key in merged:
                    merged[key]["values"].extend(item.get("values") or ())
                else:
                    merged[key] = {"metric": item.get("metric") or {},
                                   "values": list(item.get("values") or ())}
        return list(merged.values())

    def label_values(self, label: str, metric: str, first: float, last: float) -> list[str]:
        """``/api/v1/label/LABEL/values`` of ``metric``'s series with samples in ``[first, last]``
        (from the index: no sample is read), sorted."""
        params = {"match[]": metric, "start": _ts(first), "end": _ts(last)}
        data = self._data(f"label/{urllib.parse.quote(label)}/values", params, want=list)
        return sorted(v for v in data if isinstance(v, str))

    def scrape_intervals(self) -> dict[str, float]:
        """``/api/v1/targets``: each active target's scrape interval in seconds, by its ``instance``
        label; {} when Prometheus does not say (an old version, a proxy that refuses the call)."""
        try:
            data = self._data("targets", {"state": "active"})
        except PrometheusError:
            return {}
        out: dict[str, float] = {}
        for t in data.get("activeTargets") or ():
            if not isinstance(t, dict) or not isinstance(t.get("labels"), dict):
                continue
            instance, every = t["labels"].get("instance"), _duration(t.get("scrapeInterval"))
            if isinstance(instance, str) and every:
                out[instance] = every
        return out

    def _get(self, endpoint: str, params: dict[str, str], want: str) -> list[dict[str, Any]]:
        data = self._data(endpoint, params)
        here = f"prometheus:{self.url}"
        if data.get("resultType") != want or not isinstance(data.get("result"), list):
            raise PrometheusError(f"/api/v1/{endpoint} answered {data.get('resultType')!r}, not {want!r}",
                                  source=here)
        return [r for r in data["result"] if isinstance(r, dict)]

    def _data(self, endpoint: str, params: dict[str, str], want: type = dict) -> Any:
        url = f"{self.url}/api/v1/{endpoint}?{urllib.parse.urlencode(params)}"
        here = f"prometheus:{self.url}"
        try:
            with urllib.request.urlopen(url, timeout=self.timeout_s) as resp:  # noqa: S310 - scheme checked
                raw = resp.read(MAX_BYTES + 1)
        except urllib.error.HTTPError as exc:
            why = _api_error(exc)
            raise PrometheusError(_refusal(why, params) or f"HTTP {exc.code} from /api/v1/{endpoint}: {why}",
                                  source=here) from None
        except urllib.error.URLError as exc:
            if isinstance(exc.reason, TimeoutError):
                raise PrometheusError(_too_slow(self.timeout_s, params), source=here) from None
            raise PrometheusError(f"unreachable: {_reason(exc.reason)}", source=here) from None
        except TimeoutError:  # while reading the answer
            raise PrometheusError(_too_slow(self.timeout_s, params), source=here) from None
        except (OSError, ValueError) as exc:  # a reset connection
            raise PrometheusError(f"unreachable: {_reason(exc)}", source=here) from None
        if len(raw) > MAX_BYTES:
            raise PrometheusError(f"answer larger than {MAX_BYTES >> 20} MiB to a query over "
                                  f"{_reach(params)}; use a larger --step or a shorter window", source=here)
        try:
            doc = json.loads(raw)
        except ValueError:
            raise PrometheusError(f"/api/v1/{endpoint} did not answer JSON: is this Prometheus?",
                                  source=here) from None
        data = doc.get("data") if isinstance(doc, dict) else None
        if not isinstance(doc, dict) or doc.get("status") != "success" or not isinstance(data, want):
            why = _one_line(str((doc.get("error") if isinstance(doc, dict) else None) or "no data"))
            raise PrometheusError(_refusal(why, params) or f"/api/v1/{endpoint} failed: {why}", source=here)
        return data


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
        raise PrometheusError(f"no gpuslurm GPU samples between {_iso(since)} and {_iso(until)} "
                              "(is the monitor's exporter scraped?)", source=here)
    groups = [""] if len(nodes) <= NODES_PER_QUERY else \
        [_node_matcher(nodes[i:i + NODES_PER_QUERY]) for i in range(0, len(nodes), NODES_PER_QUERY)]
    scrape_s = min(targets.values(), default=DEFAULT_SCRAPE_S)
    phase = _rule_phase(prom, since, until, step_s, groups[0])
    start = bucket_start(since, step_s) if phase is None else \
        phase + math.floor((since - phase) / step_s) * step_s
    n = bucket_count(start, until, step_s)
    raw = _Grid(prom, since, until, start, step_s, n, groups, chunk_seconds(scrape_s, step_s))
    grid = raw if phase is None or not _rules_cover(raw, nodes) else \
        _Grid(prom, since, until, start, step_s, n, groups, chunk_seconds(RULE_STEP_S, step_s), rules=True)
    if grid is raw and phase is not None:  # the rules miss part of the window: the raw grid
        start = bucket_start(since, step_s)
        n = bucket_count(start, until, step_s)
        grid = _Grid(prom, since, until, start, step_s, n, groups, chunk_seconds(scrape_s, step_s))

    samples = grid.matrix(*grid.read["samples"])
    if not samples:
        raise PrometheusError(f"no gpuslurm GPU samples between {_iso(since)} and {_iso(until)} "
                              "(is the monitor's exporter scraped?)", source=here)
    util = grid.matrix(*grid.read["util"])
    durations = [hi - lo for lo, hi in (grid.span(b) for b in range(n))]
    intervals = _intervals(samples, grid, targets)
    check = Checked(here, "series")
    device_samples: dict[tuple[str, str], dict[int, float]] = {}
    gpus = []
    for key in sorted(samples, key=lambda k: (_device(k), _label(k, "node"))):
        node, device, parent = _label(key, "node"), _device(key), _label(key, "gpu_uuid")
        device_samples[(node, device)] = samples[key]
        u = _checked(check, util.get(key, {}), "gpuslurm_gpu_utilization_ratio", key)
        c, every = samples[key], intervals.get(node)
        cover = tuple(0.0 if b not in c or durations[b] <= 0 else 1.0 if every is None
                      else min(c[b] * every / durations[b], 1.0) for b in range(n))
        gpus.append(GpuSeries(node, device, parent or device, tuple(u.get(b) for b in range(n)), cover))

    return ReportData(here, since, until, start, step_s, tuple(gpus), _processes(grid, check, device_samples),
                      _allocations(grid, intervals),
                      tuple(v for v in load_violations(prom, since, until + HORIZON_S) if v.start <= until))


def _rule_phase(prom: PrometheusClient, since: float, until: float, step_s: float,
                group: str) -> float | None:
    """Where the 5-minute rules' evaluations fall (seconds after a multiple of 5 minutes: a
    Prometheus spreads its rule groups over the interval), when the report can read them: its
    step a whole number of 5 minutes, and the rules' series present at the window's end."""
    if step_s % RULE_STEP_S or until - since < step_s:
        return None
    got = prom.instant(f"max(timestamp({RULE_MEMORY}{_selector(group)}))", until)
    last = _value(got[0]) if got else None
    if last is None or not math.isfinite(last):
        return None
    return (round(last * 1000) % round(RULE_STEP_S * 1000)) / 1000


def _rules_cover(grid: _Grid, nodes: list[str]) -> bool:
    """Whether the rules' series cover the window: at its first and its last whole bucket, their
    counts add up to the raw samples' (rules added, or removed, within the window: no)."""
    whole = [b for b in range(grid.n) if grid.whole(b)]
    if not whole:
        return False
    r = _ms(grid.step_s)
    for group, b in ((g, b) for g in grid.groups for b in {whole[0], whole[-1]}):
        at, m = grid.span(b)[1], _selector(group)
        counted = [f"sum(count_over_time(gpuslurm_gpu_memory_total_bytes{m}[{r}ms]))",
                   f"sum(sum_over_time({RULE_MEMORY}{m}[{r - 1}ms]))"]
        seen = [(_value(got[0]) if got else 0.0) for got in (grid.prom.instant(q, at) for q in counted)]
        if seen[0] != seen[1]:
            return False
    return bool(nodes)


def chunk_seconds(scrape_s: float, step_s: float) -> float:
    """How much of the window one request covers: at most :data:`SAMPLES_PER_QUERY` samples of
    :data:`NODES_PER_QUERY` nodes of :data:`DEVICES_PER_NODE` devices scraped every ``scrape_s``,
    in whole buckets (at least one)."""
    most = SAMPLES_PER_QUERY * max(scrape_s, 0.001) / (NODES_PER_QUERY * DEVICES_PER_NODE)
    return max(1.0, math.floor(most / step_s)) * step_s


def _processes(grid: _Grid, check: Checked, device_samples: dict[tuple[str, str], dict[int, float]]
               ) -> tuple[ProcSeries, ...]:
    """Per-process series where the exporter gives them (``prometheus_per_process``); elsewhere one
    series per device, job (or none) and user from ``gpuslurm_device_processes``, PID 0, named
    after no process. Each row holds only the buckets its series lives in (:class:`Sparse`)."""
    n = grid.n
    # a process is present in a scrape when either of its gauges is (an unknown value is absent)
    counts = grid.matrix("count_over_time(gpuslurm_process_gpu_memory_bytes{m}[{r}]) "
                         "or count_over_time(gpuslurm_process_sm_utilization_ratio{m}[{r}])", raw=True)
    sm = grid.matrix("avg_over_time(gpuslurm_process_sm_utilization_ratio{m}[{r}])", raw=True) \
        if counts else {}
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


def _checked(check: Checked, means: dict[int, float], name: str, key: Key) -> dict[int, float]:
    """``means`` (a series' mean utilisation ratio per bucket) in percent, refused as SQLite's store
    refuses its rows when one is not a percentage: one validation for both sources."""
    out = {b: v * 100.0 for b, v in means.items()}
    if all(0.0 <= v <= MAX_PCT for v in out.values()):  # the common case, without a call per value
        return out
    where = f"{name}{{{','.join(f'{k}={json.dumps(v)}' for k, v in key)}}} (a bucket's mean, in %)"
    return {b: check.pct(v, where[:300]) for b, v in out.items()}


def _allocations(grid: _Grid, intervals: dict[str, float]) -> tuple[AllocationSpan, ...]:
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
    out = []
    check = Checked(f"prometheus:{grid.prom.url}", "series")  # an infinite time has no bucket
    for job, (m, end) in ends.items():
        begin = starts.get(job)
        if begin is None:
            continue
        where = f"node={json.dumps(job[0])},job_id={json.dumps(job[1])}"[:200]
        begin = check.time(begin, f"gpuslurm_job_start_timestamp_seconds{{{where}}}")
        end = check.time(end, f"gpuslurm_job_last_seen_timestamp_seconds{{{where}}}")
        if held_until(end, intervals.get(job[0])) <= grid.since:  # a rule's 5 minutes before the window
            continue
        out.append(AllocationSpan(job[0], job[1], m.get("user", ""), m.get("account") or None,
                                  tuple(sorted(devices.get(job, ()))), begin,
                                  held_until(end, intervals.get(job[0]))))
    return tuple(sorted(out, key=lambda a: (a.start, a.job_id, a.node)))


def load_violations(client: PrometheusClient | str, since: float,
                    until: float | None = None) -> list[Violation]:
    """Detector findings that lasted into ``[since, until]`` (until: now), from ``gpuslurm_violation_*``.

    One finding per label set and start time; its duration is the longest the exporters reported.
    """
    prom = client if isinstance(client, PrometheusClient) else PrometheusClient(client)
    until = time.time() if until is None else until
    step = max(15.0, math.ceil((until - since) / 1000))  # ≤ ~1000 points: one query, cheap
    first, last = since + step, since + step * math.ceil((until - since) / step)
    window = f"[{_ms(step)}ms]"
    starts = prom.range(f"max_over_time(gpuslurm_violation_start_timestamp_seconds{window})",
                        first, last, step)
    durations = {(_key(r), float(t)): _float(v) for r in prom.range(
        f"max_over_time(gpuslurm_violation_duration_seconds{window})", first, last, step)
        for t, v in r.get("values") or ()}
    found: dict[tuple[Key, float], float] = {}
    for r in starts:
        key = _key(r)
        for t, v in r.get("values") or ():
            begin = _float(v)
            if begin is None:
                continue
            d = durations.get((key, float(t))) or 0.0
            found[(key, begin)] = max(found.get((key, begin), 0.0), d)
    out = [_violation(dict(key), begin, d) for (key, begin), d in found.items()]
    return sorted(out, key=lambda v: (v.start, v.node, v.kind, v.job_id or "", v.pid or 0))


def _violation(m: dict[str, str], begin: float, duration: float) -> Violation:
    pid = int(m["pid"]) if m.get("pid", "").isdigit() else None
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


# What the report reads, as (whole buckets, clipped buckets) query templates: from the raw samples,
# (``{r}``: the bucket; ``{rr}``: the bucket less 1 ms, so that a rule sample on its left edge,
# which Prometheus 2's closed ranges hold, counts in one bucket only)
# or from the 5-minute rules' series (whole buckets on the rules' grid: the sums of their sums
# and counts are the raw samples' own; a clipped bucket is not on that grid: raw samples).
_RAW = {
    "samples": ("count_over_time(gpuslurm_gpu_memory_total_bytes{m}[{r}])",) * 2,
    "util": ("avg_over_time(gpuslurm_gpu_utilization_ratio{m}[{r}])",) * 2,
    "processes": ("count_over_time(gpuslurm_device_processes{m}[{r}])",) * 2,
    "start": ("max_over_time(gpuslurm_job_start_timestamp_seconds{m}[{r}])",) * 2,
    "last_seen": ("max_over_time(gpuslurm_job_last_seen_timestamp_seconds{m}[{r}])",) * 2,
    "allocated": ("max_over_time(gpuslurm_gpu_allocated{m}[{r}])",) * 2,
}
_RULES = {
    "samples": (f"sum_over_time({RULE_MEMORY}{{m}}[{{rr}}])", _RAW["samples"][1]),
    "util": ("sum_over_time(device:gpuslurm_gpu_utilization_ratio:sum_5m{m}[{rr}]) / "
             "sum_over_time(device:gpuslurm_gpu_utilization_ratio:count_5m{m}[{rr}])", _RAW["util"][1]),
    "processes": ("sum_over_time(device_job:gpuslurm_device_processes:count_5m{m}[{rr}])",
                  _RAW["processes"][1]),
    # a chunk's rule samples cover it and up to 5 minutes before it: the latest start and sighting
    # are the same; a job last seen in those 5 minutes before the window ends before it
    "start": ("max_over_time(job:gpuslurm_job_start_timestamp_seconds:max_5m{m}[{r}])",) * 2,
    "last_seen": ("max_over_time(job:gpuslurm_job_last_seen_timestamp_seconds:max_5m{m}[{r}])",) * 2,
    "allocated": ("max_over_time(device_job:gpuslurm_gpu_allocated:max_5m{m}[{r}])",) * 2,
}


class _Grid:
    """Bucketed ``*_over_time`` queries, node group by node group and chunk by chunk: whole
    buckets by query_range, clipped ones one by one; requests run :data:`WORKERS` at a time.
    ``rules``: the buckets are on the 5-minute rules' grid and :attr:`read` names their series."""

    def __init__(self, prom: PrometheusClient, since: float, until: float, start: float,
                 step_s: float, n: int, groups: list[str], chunk_s: float, rules: bool = False) -> None:
        self.prom, self.since, self.until = prom, since, until
        self.start, self.step_s, self.n = start, step_s, n
        self.groups = groups  # a node matcher per group ("" for every node)
        self.chunk_s = chunk_s
        self.rules = rules
        self.read = _RULES if rules else _RAW
        # raw samples over a whole chunk of the rules' (10x the samples at 30 s scrapes): shorter
        self.raw_chunk_s = chunk_s * (DEFAULT_SCRAPE_S / RULE_STEP_S) if rules else chunk_s
        # only the first and the last bucket can be clipped by the window
        self._clipped = {b for b in {0, n - 1} if 0 <= b < n and self.span(b) != self._full(b)}

    def matrix(self, template: str, clipped_template: str | None = None, raw: bool = False) -> Matrix:
        """``template`` with ``{m}`` the selector's matchers and ``{r}`` the range, per series and
        bucket (``clipped_template`` for a clipped bucket; ``raw``: a template of raw samples);
        buckets without data left out."""
        matchers: tuple[str, ...] = ()
        clipped_template = clipped_template or template
        whole = [b for b in range(self.n) if b not in self._clipped]
        per = max(1, round((self.raw_chunk_s if raw else self.chunk_s) / self.step_s))
        runs = [whole[i:i + per] for i in range(0, len(whole), per)]
        clipped = [b for b in sorted(self._clipped) if self.span(b)[1] - self.span(b)[0] >= 0.001]

        def part(job: tuple[str, list[int] | int]) -> list[tuple[Key, int, float]]:
            group, which = job
            sel = _selector(*matchers, group)
            got: list[tuple[Key, int, float]] = []
            if isinstance(which, int):
                lo, hi = self.span(which)
                for r in self.prom.instant(clipped_template.format(m=sel, r=f"{_ms(hi - lo)}ms"), hi):
                    value = _value(r)
                    if value is not None:
                        got.append((_key(r), which, value))
                return got
            query = template.format(m=sel, r=f"{_ms(self.step_s)}ms", rr=f"{_ms(self.step_s) - 1}ms")
            first, last = self._full(which[0])[1], self._full(which[-1])[1]
            for r in self.prom.range(query, first, last, self.step_s):
                key = _key(r)
                for t, v in r.get("values") or ():
                    b = round((float(t) - self.start) / self.step_s) - 1
                    value = _float(v)
                    if 0 <= b < self.n and value is not None:
                        got.append((key, b, value))
            return got

        parts: list[list[int] | int] = [*runs, *clipped]
        jobs = [(g, w) for g in self.groups for w in parts]
        out: Matrix = {}
        for got in _parallel(part, jobs):
            for key, b, value in got:
                out.setdefault(key, {})[b] = value
        return out

    def over_chunks(self, what: str, past_s: float = 0.0, *matchers: str
                    ) -> Iterator[tuple[dict[str, str], float]]:
        """``what`` (a max over time, of :attr:`read`) evaluated once per chunk of ``[since, until +
        past_s]`` and node group, at the chunk's end over the chunk: each series' labels and value,
        once per chunk it is in. From the rules up to the last whole bucket's end (the last rule
        sample the window is sure to have), then from raw samples."""
        end = self.until + past_s
        whole = [b for b in range(self.n) if self.whole(b)]
        ruled_to = self._full(whole[-1])[1] if self.rules and whole else self.since
        edges: list[tuple[float, float, str]] = []
        for lo, hi, template, chunk in ((self.since, ruled_to, self.read[what][0], self.chunk_s),
                                        (ruled_to, end, _RAW[what][0], self.raw_chunk_s)):
            while lo < hi:
                edges.append((lo, min(lo + chunk, hi), template))
                lo = edges[-1][1]

        def part(job: tuple[str, tuple[float, float, str]]) -> list[tuple[dict[str, str], float]]:
            group, (lo, hi, template) = job
            query = template.format(m=_selector(*matchers, group), r=f"{_ms(hi - lo)}ms")
            return [(r.get("metric") or {}, v) for r in self.prom.instant(query, hi)
                    if (v := _value(r)) is not None]

        for got in _parallel(part, [(g, e) for g in self.groups for e in edges]):
            yield from got

    def _full(self, b: int) -> tuple[float, float]:
        lo = self.start + b * self.step_s
        return lo, lo + self.step_s

    def span(self, b: int) -> tuple[float, float]:
        lo, hi = self._full(b)
        return max(lo, self.since), min(hi, self.until)

    def whole(self, b: int) -> bool:
        return b not in self._clipped


T = TypeVar("T")
R = TypeVar("R")


def _parallel(fn: Callable[[T], R], items: list[T]) -> Iterator[R]:
    """``fn`` over ``items``, WORKERS at a time (Prometheus evaluates while we parse), in order."""
    if len(items) <= 1:
        yield from map(fn, items)
        return
    with concurrent.futures.ThreadPoolExecutor(max_workers=WORKERS) as pool:
        yield from pool.map(fn, items)


def _selector(*matchers: str) -> str:
    return "{" + ",".join(m for m in matchers if m) + "}"


def _node_matcher(nodes: list[str]) -> str:
    """``node=~"a|b"`` for these nodes (their names escaped for RE2, then for PromQL's string)."""
    alternatives = "|".join(re.sub(r"([\\.+*?()|\[\]{}^$])", r"\\\1", n) for n in nodes)
    return "node=~" + json.dumps(alternatives)


def _intervals(samples: Matrix, grid: _Grid, targets: dict[str, float]) -> dict[str, float]:
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


_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0, "y": 31536000.0}


def _duration(text: object) -> float | None:
    """A Prometheus duration (``15s``, ``1m30s``, ``500ms``) in seconds; None if it is not one."""
    if not isinstance(text, str) or not text:
        return None
    parts = re.findall(r"(\d+)(ms|s|m|h|d|w|y)", text)
    if not parts or "".join(n + u for n, u in parts) != text:
        return None
    total = sum(int(n) * _UNITS[u] for n, u in parts)
    return total if 0 < total < 1e9 else None


def _seen(count: float, device_samples: float | None) -> float:
    """As SQLite: a process's samples over its device's samples in the bucket."""
    if not count:
        return 0.0
    return 1.0 if not device_samples else min(count / device_samples, 1.0)


def _key(item: dict[str, Any]) -> Key:
    metric = item.get("metric") or {}
    return tuple(sorted((str(k), str(v)) for k, v in metric.items() if k != "__name__"))


def _label(key: Key, name: str) -> str:
    for k, v in key:
        if k == name:
            return v
    return ""


def _device(key: Key) -> str:
    return _label(key, "mig_uuid") or _label(key, "gpu_uuid")


def _proc_order(key: Key) -> tuple[str, str, int, str]:
    pid = _label(key, "pid")
    return (_label(key, "node"), _device(key), int(pid) if pid.isdigit() else 0, _label(key, "job_id"))


def _job(item: dict[str, Any]) -> tuple[str, str]:
    m = item.get("metric") or {}
    return (str(m.get("node", "")), str(m.get("job_id", "")))


def _value(item: dict[str, Any]) -> float | None:
    value = item.get("value")
    return _float(value[1]) if isinstance(value, list) and len(value) == 2 else None


def _float(text: object) -> float | None:
    if not isinstance(text, (str, int, float)):  # what float() takes of JSON's values
        return None
    try:
        value = float(text)
    except ValueError:
        return None
    return None if math.isnan(value) else value


def _ts(t: float) -> str:
    return f"{t:.3f}"


def _ms(seconds: float) -> int:
    return max(1, round(seconds * 1000))


def _api_error(exc: urllib.error.HTTPError) -> str:
    try:
        doc = json.loads(exc.read(1 << 16))
        return _one_line(str(doc.get("error") or exc.reason))
    except (ValueError, OSError, AttributeError):
        return _one_line(str(exc.reason))


def _reach(params: dict[str, str]) -> str:
    """What one request asked for, for an error: the span of the window it covers."""
    if "start" in params and "end" in params and "step" in params:
        seconds = float(params["end"]) - float(params["start"]) + float(params["step"])
    else:
        ranges = re.findall(r"\[(\d+)ms\]", params.get("query", ""))
        seconds = max((int(r) / 1000 for r in ranges), default=0.0)
    return span(seconds) if seconds else "an instant"


def _refusal(why: str, params: dict[str, str]) -> str | None:
    """Prometheus' own limits, named: a site's shared Prometheus keeps its defaults."""
    if "too many samples" in why:
        return (f"prometheus refused a query over {_reach(params)}: too many samples (its "
                "--query.max-samples); use a larger --step or a shorter window")
    if "query timed out" in why or "context deadline exceeded" in why:
        return (f"prometheus gave up on a query over {_reach(params)} (its --query.timeout); "
                "use a larger --step or a shorter window")
    return None


def _too_slow(timeout_s: float, params: dict[str, str]) -> str:
    return (f"no answer within {timeout_s:g} s to a query over {_reach(params)}: Prometheus is "
            "overloaded or the window too long for it; use a larger --step or a shorter window")


def _reason(reason: object) -> str:
    if isinstance(reason, OSError) and reason.strerror:
        return reason.strerror
    return _one_line(str(reason)) or type(reason).__name__


def _one_line(text: str) -> str:
    return " ".join(text.split())[:300]


def _iso(ts: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S %Z", time.localtime(ts))
