"""Bucketed ``*_over_time`` queries over a report's window, from raw samples or the 5-minute rules.

A whole bucket is one point of a ``query_range`` at its right edge over the bucket; a bucket
clipped by the window is an instant query with its own range; requests cover one node group and
one chunk of the window each, :data:`WORKERS` at a time.
"""

from __future__ import annotations

import concurrent.futures
from collections.abc import Callable, Iterator
from typing import TypeVar

from gpuslurm.report.prom_client import Key, PrometheusClient, series_key
from gpuslurm.report.prom_decode import Matrix, as_float, ms, selector, value

WORKERS = 4  # requests at once: Prometheus evaluates one while the client reads another
DEFAULT_SCRAPE_S = 10.0  # the scrape interval when Prometheus does not say
RULE_STEP_S = 300.0  # the shipped 5-minute recording rules (packaging/gpuslurm-rules.yml)
RULE_MEMORY = "device:gpuslurm_gpu_memory_total_bytes:count_5m"


def _job_util(held: str, util_sum: str, counted: str, every_ms: int) -> tuple[str, str]:
    """A job's devices' utilisation summed, and their samples counted, while it held them: each
    ``every_ms`` (the series' own interval, 1 ms short, so that each sample counts once)."""
    d, r = "node, gpu_uuid, mig_uuid", f"[{every_ms - 1}ms]"
    parts = [f"sum by (node, job_id) (sum_over_time((max_over_time({held}{{mj}}{r}) * on ({d}) group_left() "
             f"{inner}_over_time({series}{{m}}{r}))[{{r}}:{every_ms}ms]))"
             for inner, series in (("sum", util_sum), (counted, util_sum))]
    return parts[0], parts[1]


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
    "monitor_interval": ("max_over_time(gpuslurm_monitor_interval_seconds{m}[{r}])",) * 2,
    # per job (the per-user report's idle jobs): its devices' utilisation while held, and samples
    "job_util": (_job_util("gpuslurm_gpu_allocated", "gpuslurm_gpu_utilization_ratio", "count",
                           round(DEFAULT_SCRAPE_S * 1000))[0],) * 2,
    "job_samples": (_job_util("gpuslurm_gpu_allocated", "gpuslurm_gpu_utilization_ratio", "count",
                              round(DEFAULT_SCRAPE_S * 1000))[1],) * 2,
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
    "monitor_interval": _RAW["monitor_interval"],  # one gauge a node: no rule needed
    # per job: its devices' utilisation while it held them, and their samples (the per-user rules)
    "job_util": ("sum by (node, job_id) ("
                 "sum_over_time(job:gpuslurm_gpu_utilization_ratio_held:sum_5m{m}[{r}]))",) * 2,
    "job_samples": ("sum by (node, job_id) ("
                    "sum_over_time(job:gpuslurm_gpu_utilization_ratio_held:count_5m{m}[{r}]))",) * 2,
}


class Grid:
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

    def matrix(self, template: str, clipped_template: str | None = None, raw: bool = False,
               only: str = "", nan: bool = False) -> Matrix:
        """``template`` with ``{m}`` the selector's matchers (``{mj}``, ``{mn}``: and a job's, none's),
        ``{r}`` the range and ``{s}`` it in seconds, per series and
        bucket (``clipped_template`` for a clipped bucket; ``raw``: a template of raw samples);
        buckets without data left out. ``only``: ``"whole"`` or ``"clipped"`` buckets alone.
        ``nan``: a NaN kept (for the caller to refuse), not left out."""
        matchers: tuple[str, ...] = ()
        clipped_template = clipped_template or template
        whole = [b for b in range(self.n) if b not in self._clipped]
        per = max(1, round((self.raw_chunk_s if raw else self.chunk_s) / self.step_s))
        runs = [whole[i:i + per] for i in range(0, len(whole), per)]
        clipped = [b for b in sorted(self._clipped) if self.span(b)[1] - self.span(b)[0] >= 0.001]

        def part(job: tuple[str, list[int] | int]) -> list[tuple[Key, int, float]]:
            group, which = job
            sel = selector(*matchers, group)
            got: list[tuple[Key, int, float]] = []
            if isinstance(which, int):
                lo, hi = self.span(which)
                query = clipped_template.format(m=sel, r=f"{ms(hi - lo)}ms", s=repr(float(hi - lo)),
                                                **_job_selectors(group))
                for r in self.prom.instant(query, hi):
                    x = value(r, nan)
                    if x is not None:
                        got.append((series_key(r), which, x))
                return got
            query = template.format(m=sel, r=f"{ms(self.step_s)}ms", rr=f"{ms(self.step_s) - 1}ms",
                                    s=repr(float(self.step_s)), **_job_selectors(group))
            first, last = self._full(which[0])[1], self._full(which[-1])[1]
            for r in self.prom.range(query, first, last, self.step_s):
                key = series_key(r)
                for t, v in r.get("values") or ():
                    b = round((float(t) - self.start) / self.step_s) - 1
                    x = as_float(v, nan)
                    if 0 <= b < self.n and x is not None:
                        got.append((key, b, x))
            return got

        parts: list[list[int] | int] = [*(runs if only != "clipped" else ()),
                                        *(clipped if only != "whole" else ())]
        jobs = [(g, w) for g in self.groups for w in parts]
        out: Matrix = {}
        for got in parallel(part, jobs):
            for key, b, got_value in got:
                out.setdefault(key, {})[b] = got_value
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
            query = template.format(m=selector(*matchers, group), r=f"{ms(hi - lo)}ms",
                                    **_job_selectors(group))
            return [(r.get("metric") or {}, v) for r in self.prom.instant(query, hi)
                    if (v := value(r)) is not None]

        for got in parallel(part, [(g, e) for g in self.groups for e in edges]):
            yield from got

    def _full(self, b: int) -> tuple[float, float]:
        lo = self.start + b * self.step_s
        return lo, lo + self.step_s

    def span(self, b: int) -> tuple[float, float]:
        lo, hi = self._full(b)
        return max(lo, self.since), min(hi, self.until)

    def whole(self, b: int) -> bool:
        return b not in self._clipped


def _job_selectors(group: str) -> dict[str, str]:
    """A template's ``{mj}`` and ``{mn}``: the group's series of some job, and of none."""
    return {"mj": selector('job_id!=""', group), "mn": selector('job_id=""', group)}


T = TypeVar("T")
R = TypeVar("R")


def parallel(fn: Callable[[T], R], items: list[T]) -> Iterator[R]:
    """``fn`` over ``items``, WORKERS at a time (Prometheus evaluates while we parse), in order."""
    if len(items) <= 1:
        yield from map(fn, items)
        return
    with concurrent.futures.ThreadPoolExecutor(max_workers=WORKERS) as pool:
        yield from pool.map(fn, items)
