"""The fair-share report per user or account from Prometheus' own sums: points per user, not device.

``--by user`` and ``--by account`` need, per bucket, each user's busy GPU time, not each device's:
Prometheus sums it (``sum by (user, account)``) over the same buckets and series as the
per-device path (:func:`gpuslurm.report.prometheus.load_prometheus`), so the client decodes users
× buckets points whatever the cluster's size. Each device's busy time in a bucket (its summed
utilisation × the scrape interval; a bucket's mean × its length where more scrapes than fit
landed in it, as the per-device path's coverage) goes to the users whose processes Prometheus
counted on it, by their share of those counts; a device with no process counted, to the jobs
holding it; processes in no job are their users' use outside jobs; what nobody holds, nobody's.
Jobs come as in the per-device path (start, last sighting, devices: one point per job and chunk),
so allocated time is the jobs' own, exactly; the buckets a device was sampled only in part (found
by Prometheus: only those come back) are unmeasured for the jobs holding it, as there.

Where a bucket's split would differ from the per-device path's (per-process series, whose SM
utilisation splits the device; MIG devices, a fraction of their GPU; nodes scraped at different
intervals), :func:`load_user_buckets` returns None and the caller takes the per-device path. A
device missing from buckets (a node down, added or gone) counts 0 samples there, as per device,
where Prometheus' index names the window's devices once each (else None there too).
What this path does not give: per-process busy hours as an over-quota user's evidence (``--by
process`` has them).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import NamedTuple

from gpuslurm.report.data import AllocationSpan, Gap, ReportData
from gpuslurm.report.prom_client import Key, PrometheusClient, PrometheusError
from gpuslurm.report.prom_decode import Matrix, checked, iso, label, ms, node_matcher, value
from gpuslurm.report.prom_grid import DEFAULT_SCRAPE_S, RULE_MEMORY, RULE_STEP_S, Grid
from gpuslurm.report.prometheus import (
    HORIZON_S,
    NODES_PER_QUERY,
    job_allocations,
    load_violations,
    node_gaps,
    window_grid,
)
from gpuslurm.samples import Violation
from gpuslurm.state.store_values import MAX_PCT, Checked

D = "node, gpu_uuid, mig_uuid"
# the shipped per-user 5-minute rules (packaging/gpuslurm-rules.yml, group gpuslurm_5m)
IN_JOBS = "user:gpuslurm_gpu_utilization_ratio_in_jobs:sum_5m"
HELD = "user:gpuslurm_gpu_utilization_ratio_held:sum_5m"
OUTSIDE = "user:gpuslurm_gpu_utilization_ratio_outside_jobs:sum_5m"
CLUSTER = "cluster:gpuslurm_gpu_utilization_ratio:sum_5m"
# the window's checks, one series for the whole cluster (the same group)
OUT_OF_RANGE = "cluster:gpuslurm_gpu_utilization_out_of_range:count_5m"
SAMPLED = "cluster:gpuslurm_gpu_memory_total_bytes:count_5m"
FEWEST = "cluster:gpuslurm_gpu_memory_total_bytes:min_count_5m"
# a sum joined from raw samples reads about this many selectors' samples: its requests cover as
# much less of the window as the per-device path's
JOINED = 6


class UserBuckets(NamedTuple):
    """What the per-user report needs of a window, summed by Prometheus."""

    source: str
    since: float
    until: float
    start: float
    step_s: float
    gpus: int  # physical GPUs sampled in the window
    allocations: tuple[AllocationSpan, ...]
    violations: tuple[Violation, ...]
    gaps: tuple[Gap, ...]
    in_jobs: dict[tuple[str, str], dict[int, float]]  # (user, account) → bucket → busy GPU-s in jobs
    outside: dict[str, dict[int, float]]  # user → bucket → busy GPU-s of their processes in no job
    total: dict[int, float]  # bucket → every device's busy GPU-s
    unmeasured_s: dict[tuple[str, str], float]  # (node, job) → its held GPU-s without samples
    job_util: dict[tuple[str, str], float]  # (node, job) → its devices' mean utilisation (0-1)


def _templates(ruled: bool, every: float) -> dict[str, tuple[str, str]]:
    """The per-user sums, as (whole buckets, clipped buckets) templates of :meth:`Grid.matrix`:
    whole buckets from the per-user rules where they cover the window (``ruled``), else (and
    clipped buckets) joined from raw samples."""

    def joined() -> dict[str, str]:
        r = "[{r}]"

        def procs(sel: str) -> str:
            return f"count_over_time(gpuslurm_device_processes{sel}{r})"
        # by device alone: a scrape's instance and job labels are on some series and not others
        util = f"sum by ({D}) (sum_over_time(gpuslurm_gpu_utilization_ratio{{m}}{r}))"
        count = f"sum by ({D}) (count_over_time(gpuslurm_gpu_utilization_ratio{{m}}{r}))"
        held = f"max by ({D}, job_id, user, account) (max_over_time(gpuslurm_gpu_allocated{{mj}}{r}))"
        # busy seconds: the summed utilisation × the interval (at most the mean × the bucket)
        busy = f"({util} * on ({D}) group_left() clamp_max({{s}} / {count}, {every!r}))"

        # the processes' part of it: at most as busy as they could have been (the longest seen
        # at 100 %), by their counts; the rest, to a job holding the device without them, else nobody
        most = f"clamp_max(max by ({D}) ({procs('{m}')}) / {util}, 1)"

        def share(who: str, mine: str) -> str:
            return (f"sum by ({D}, {who}) ({procs(mine)}) / on ({D}) group_left() "
                    f"sum by ({D}) ({procs('{m}')}) * on ({D}) group_left() {busy} "
                    f"* on ({D}) group_left() {most}")
        return {
            "in_jobs": f"sum by (user, account) ({share('user, account', '{mj}')})",
            "held": f"sum by (user, account) ({held} / on ({D}) group_left() count by ({D}) ({held}) "
                    f"* on ({D}) group_left() ({busy} unless on ({D}) {procs('{m}')}))",
            "outside": f"sum by (user) ({share('user', '{mn}')})",
            "total": f"sum({busy})",
            "bad": _out_of_range(f"({util} / {count})"),
        }

    clipped = joined()
    if not ruled:
        return {k: (v, v) for k, v in clipped.items()}
    rr, e = "[{rr}]", f" * {every!r}"
    mean = (f"(sum_over_time(device:gpuslurm_gpu_utilization_ratio:sum_5m{{m}}{rr}) / "
            f"sum_over_time(device:gpuslurm_gpu_utilization_ratio:count_5m{{m}}{rr}))")
    return {
        "in_jobs": (f"sum by (user, account) (sum_over_time({IN_JOBS}{rr})){e}", clipped["in_jobs"]),
        "held": (f"sum by (user, account) (sum_over_time({HELD}{rr})){e}", clipped["held"]),
        "outside": (f"sum by (user) (sum_over_time({OUTSIDE}{rr})){e}", clipped["outside"]),
        "total": (f"sum(sum_over_time({CLUSTER}{rr})){e}", clipped["total"]),
        "bad": (_out_of_range(mean), clipped["bad"]),
    }


def _out_of_range(mean: str) -> str:
    """The device-buckets whose ``mean`` utilisation the store would refuse: above MAX_PCT, below 0,
    or NaN (which no comparison but ``!=`` with itself holds)."""
    return f"{mean} > {MAX_PCT / 100!r} or {mean} < 0 or {mean} != {mean}"


def _user_rules_cover(grid: Grid) -> bool:
    """Whether the per-user rules cover the window: at its first and last whole bucket, the
    cluster's sum is the devices' (rules added, or removed, within the window: no)."""
    whole = [b for b in range(grid.n) if grid.whole(b)]
    if not grid.rules or not whole:
        return False
    rr = f"[{ms(grid.step_s) - 1}ms]"
    for b in {whole[0], whole[-1]}:
        sums = [grid.prom.instant(q, grid.span(b)[1]) for q in (
            f"sum(sum_over_time({CLUSTER}{rr}))",
            f"sum(sum_over_time(device:gpuslurm_gpu_utilization_ratio:sum_5m{rr}))")]
        got = [value(x[0]) if x else None for x in sums]
        if got[0] is None or got[1] is None or abs(got[0] - got[1]) > 1e-9 * max(abs(got[1]), 1.0):
            return False
    return True


def load_user_buckets(url: str, since: float, until: float, step_s: float,
                      client: PrometheusClient | None = None) -> UserBuckets | None:
    """The window's per-user sums, or None where only the per-device path is right (see above)."""
    prom = client or PrometheusClient(url)
    here = f"prometheus:{prom.url}"
    nodes = prom.label_values("node", "gpuslurm_gpu_memory_total_bytes", since, until)
    if not nodes:
        raise PrometheusError(f"no gpuslurm GPU samples between {iso(since)} and {iso(until)} "
                              "(is the monitor's exporter scraped?)", source=here)
    if any(prom.label_values("mig_uuid", "gpuslurm_gpu_memory_total_bytes", since, until)) or \
            prom.label_values("node", "gpuslurm_process_gpu_memory_bytes", since, until) or \
            prom.label_values("node", "gpuslurm_process_sm_utilization_ratio", since, until):
        return None
    targets = prom.scrape_intervals()
    grid = window_grid(prom, since, until, step_s, nodes, min(targets.values(), default=DEFAULT_SCRAPE_S))
    every = _one_interval(grid, targets)
    if every is None:
        return None
    # sums over every node at once: a request covers fewer buckets the more nodes there are, so
    # no request reads more samples than the per-device path's
    share = max(1, math.ceil(len(nodes) / NODES_PER_QUERY))
    whole = Grid(prom, since, until, grid.start, step_s, grid.n, [""], grid.chunk_s / share, rules=grid.rules)
    whole.raw_chunk_s = grid.raw_chunk_s / share / JOINED
    ruled = _user_rules_cover(whole)
    t = _templates(ruled, every)
    joined = not ruled  # whole buckets joined from raw samples: the shorter requests
    names = _device_names(prom, since, until)
    in_range, sampled = _window_checks(whole, every, names) if ruled else (False, False)
    found = _short(whole, grid, every, names, sampled)
    if found is None:
        return None
    short, gpus, width = found
    # the sums, NaN kept: a NaN sample makes its bucket's sums NaN, and is refused below
    sums = {what: whole.matrix(*t[what], raw=joined, nan=True)
            for what in ("in_jobs", "held", "outside", "total")}
    in_range = in_range and not any(math.isnan(x) for m in sums.values() for cells in m.values()
                                    for x in cells.values())  # rules older than their NaN count
    check = Checked(here, "series")
    # per device: in requests of a node group each, as the per-device path's, 4 at a time; the
    # whole buckets not where the cluster's rule counted no device out of range in any of them
    bad = grid.matrix(*t["bad"], raw=joined, only="clipped" if in_range else "", nan=True)
    for key, cells in bad.items():
        checked(check, cells, "gpuslurm_gpu_utilization_ratio", key)  # refused as per device
    for what, m in sums.items():  # a NaN no device's mean explains: a forged answer
        for key, cells in m.items():
            for x in cells.values():
                check.number(x, f"{what} sum {dict(key)}"[:200])
    allocations = job_allocations(grid, {node: every for node in nodes})
    in_jobs: dict[tuple[str, str], dict[int, float]] = {}
    for key, cells in (*sums["in_jobs"].items(), *sums["held"].items()):
        mine = in_jobs.setdefault((label(key, "user"), label(key, "account")), {})
        for b, x in cells.items():
            mine[b] = mine.get(b, 0.0) + x
    outside = {label(key, "user"): cells for key, cells in sums["outside"].items()}
    total = next(iter(sums["total"].values()), {})
    jobs = grid if ruled else window_grid(prom, since, until, step_s, nodes, every, rules=False)
    measured, busy = _per_job(jobs, "job_samples"), _per_job(jobs, "job_util")
    job_util = {job: busy.get(job, 0.0) / n for job, n in measured.items() if n > 0}
    gaps = node_gaps(grid, _node_samples(short, whole, width, every), {node: every for node in nodes})
    return UserBuckets(here, since, until, grid.start, step_s, gpus, allocations,
                       tuple(v for v in load_violations(prom, since, until + HORIZON_S) if v.start <= until),
                       gaps, in_jobs, outside, total, _unmeasured(short, whole, allocations, every), job_util)


def _per_job(grid: Grid, what: str) -> dict[tuple[str, str], float]:
    """A per-job sum (:attr:`Grid.read`'s ``job_util``, ``job_samples``) over the window: the sum of
    its chunks' (a job running across a chunk's end, or into the raw samples after the rules'
    last whole bucket, has a part in each)."""
    out: dict[tuple[str, str], float] = {}
    for m, v in grid.over_chunks(what):
        job = (m.get("node", ""), m.get("job_id", ""))
        out[job] = out.get(job, 0.0) + v
    return out


def _one_interval(grid: Grid, targets: dict[str, float]) -> float | None:
    """Every node's scrape interval, when they share one (by their targets, else a whole bucket
    over the most samples a node's device had in the window's first, middle or last whole bucket);
    None when they differ or cannot be told, or when a node has more than one target (two scrape
    jobs of one exporter: its series twice, which the per-device path's means take once)."""
    whole = [b for b in range(grid.n) if grid.whole(b)]
    if not whole:
        return None
    most: dict[str, float] = {}
    instances: dict[str, set[str]] = {}
    for b in {whole[0], whole[len(whole) // 2], whole[-1]}:
        at = grid.span(b)[1]
        query = "max by (node, instance) (count_over_time(gpuslurm_gpu_memory_total_bytes" \
                f"[{ms(grid.step_s)}ms]))"
        for r in grid.prom.instant(query, at):
            node, count = (r.get("metric") or {}).get("node", ""), value(r) or 0.0
            most[node] = max(most.get(node, 0.0), count)
            instances.setdefault(node, set()).add((r.get("metric") or {}).get("instance", ""))
    if any(len(ins) > 1 for ins in instances.values()):
        return None  # a node scraped by two targets: sums over its series would count it twice
    told = {node: {targets[i] for i in ins if i in targets} for node, ins in instances.items()}
    every = {next(iter(t)) if len(t) == 1 else grid.step_s / most[node] if most.get(node) else None
             for node, t in told.items()}
    return every.pop() if len(every) == 1 and None not in every else None


def _window_checks(grid: Grid, every: float, names: set[Key] | None) -> tuple[bool, bool]:
    """What the cluster's check rules say of the window's whole buckets: whether no device
    series' 5-minute mean utilisation was out of range (so neither was a bucket's, a mean of
    them); and whether every device series the window ``names`` was sampled in each 5 minutes
    as many times as fit at the scrape interval (so in each bucket: only where the interval
    divides 5 minutes). False where a rule is missing (rules older than them, a failed
    evaluation) or evaluated at other times than the device rules (a copy in another group):
    each must have a sample at every whole bucket's end and k in it."""
    whole = [b for b in range(grid.n) if grid.whole(b)]
    if not whole:
        return False, False
    one = Grid(grid.prom, grid.since, grid.until, grid.start, grid.step_s, grid.n, [""],
               grid.until - grid.since + grid.step_s, rules=True)  # one series: the window at once
    k = round(grid.step_s / RULE_STEP_S)

    def holds(rule: str, *folds: tuple[str, Callable[[float], bool]]) -> bool:
        """Every whole bucket has the rule's k samples, one on its end, and each ``(fold, ok)``:
        ``ok`` of its samples folded (``max``, ``min``)."""
        checks: list[tuple[str, Callable[[float], bool]]] = [
            (f"count_over_time({rule}[{{rr}}])", lambda n: n == k),
            (f"count_over_time({rule}[1ms])", lambda n: n == 1),
            *((f"{fold}_over_time({rule}[{{rr}}])", ok) for fold, ok in folds)]
        for template, want in checks:
            cells = next(iter(one.matrix(template, only="whole").values()), {})
            if len(cells) != len(whole) or not all(want(x) for x in cells.values()):
                return False
        return True

    in_range = holds(OUT_OF_RANGE, ("max", lambda n: n == 0))
    per_5m = RULE_STEP_S / every
    if names is None or abs(per_5m - round(per_5m)) > 1e-9:
        return in_range, False

    def every_series(n: float) -> bool:
        return n == len(names)

    sampled = holds(SAMPLED, ("min", every_series), ("max", every_series)) and \
        holds(FEWEST, ("min", lambda n: n >= round(per_5m)))
    return in_range, sampled


def _device_names(prom: PrometheusClient, since: float, until: float) -> set[Key] | None:
    """The device series of the window, from Prometheus' index (``/api/v1/series``: no sample
    read; a series of a block that only touches the window may be named too); None where the
    call is refused (a proxy's rules) or a device has more than one series: the caller then
    reads without them."""
    try:
        found = prom.series("gpuslurm_gpu_memory_total_bytes", since, until)
    except PrometheusError:
        return None
    names = {tuple(sorted((k, v) for k, v in d.items() if k != "__name__")) for d in found}
    devices = {(label(key, "node"), label(key, "gpu_uuid"), label(key, "mig_uuid")) for key in names}
    # a device under two label sets (a scrape job renamed, a target label added by relabelling):
    # one device, two series, each absent half the window; not this path's to join
    return names if len(devices) == len(names) else None


def _short(grid: Grid, by_node: Grid, every: float, names: set[Key] | None, sampled: bool = False
           ) -> tuple[Matrix, int, dict[str, int]] | None:
    """The device-buckets sampled only in part or not at all (whole buckets with fewer samples
    than fit; every device of a clipped bucket; read per node group of ``by_node``), the devices
    and each node's. ``names``: the window's device series (:func:`_device_names`): a device
    missing from buckets (its node's monitor down, a node added or gone) counts 0 samples there.
    Without them, None where a device is missing from whole buckets. ``sampled``: the cluster's
    rules found every device sampled throughout the whole buckets (:func:`_window_checks`), so
    only the clipped ones are read device by device."""
    count = f"sum_over_time({RULE_MEMORY}{{m}}[{{rr}}])" if grid.rules \
        else "count_over_time(gpuslurm_gpu_memory_total_bytes{m}[{r}])"
    raw = "count_over_time(gpuslurm_gpu_memory_total_bytes{m}[{r}])"
    fit = math.floor(grid.step_s / every + 1e-9)
    whole = [b for b in range(grid.n) if grid.whole(b)]
    if not whole:
        return None
    missing: list[int] = []  # whole buckets where fewer devices were sampled than the window names
    if not sampled:
        devices = grid.matrix(f"count({count})", f"count({raw})")
        counted = next(iter(devices.values()), {})
        seen = {counted.get(b, 0.0) for b in whole}
        if names is None:
            if len(seen) != 1:
                return None
        else:
            if max(seen) > len(names):
                return None  # more devices sampled than the index names: not this path's to explain
            missing = [b for b in whole if counted.get(b, 0.0) < len(names)]
    if names is None:
        at = grid.span(whole[0])[1]
        width = {(r.get("metric") or {}).get("node", ""): round(value(r) or 0.0) for r in grid.prom.instant(
            f"count by (node) (count_over_time(gpuslurm_gpu_memory_total_bytes[{ms(grid.step_s)}ms]))", at)}
        if sum(width.values()) != seen.pop():
            return None
        devices_of: dict[str, list[Key]] = {}
    else:
        devices_of = {}
        for key in sorted(names):
            devices_of.setdefault(label(key, "node"), []).append(key)
    short = by_node.matrix(f"{count} < {fit}", raw, only="clipped" if sampled else "")
    if names is not None:
        absent = _absent(grid, by_node, count, devices_of, missing, short)
        if absent is None:
            return None
        read = sum(1 for b in range(grid.n) if _read(grid, b))
        for key, buckets in absent.items():
            if len(buckets) == read:  # named by the index, sampled in no bucket: not the window's
                devices_of[label(key, "node")].remove(key)
                continue
            for b in buckets:
                short.setdefault(key, {})[b] = 0.0
        width = {node: len(keys) for node, keys in devices_of.items() if keys}
    return short, sum(width.values()), width


def _absent(grid: Grid, by_node: Grid, count: str, devices_of: dict[str, list[Key]], missing: list[int],
            short: Matrix) -> dict[Key, list[int]] | None:
    """Per device of the window, the buckets it has no sample in: in a clipped bucket, those
    ``short`` does not hold (it holds every device sampled there); in the whole buckets where
    fewer devices were sampled than named (``missing``), those of a node sampled there not at all
    (read per node and bucket), and, where a node had some of its devices sampled, those its
    own devices' counts lack (read for that node alone). None where a node had more devices
    sampled than named."""
    absent: dict[Key, list[int]] = {}
    for b in range(grid.n):
        if not grid.whole(b) and _read(grid, b):
            held = {key for key, cells in short.items() if b in cells}
            for keys in devices_of.values():
                for key in keys:
                    if key not in held:
                        absent.setdefault(key, []).append(b)
    if not missing:
        return absent
    per_node = by_node.matrix(f"count by (node) ({count})", only="whole")
    partly: list[str] = []
    for node, keys in devices_of.items():
        cells = per_node.get((("node", node),), {})
        if any(cells.get(b, 0.0) > len(keys) for b in missing):
            return None
        if any(0 < cells.get(b, 0.0) < len(keys) for b in missing):
            partly.append(node)
            continue
        for b in missing:
            if not cells.get(b):
                for key in keys:
                    absent.setdefault(key, []).append(b)
    if partly:  # a device gone while the rest of its node was sampled: those nodes' devices
        groups = [node_matcher(partly[i:i + NODES_PER_QUERY]) for i in range(0, len(partly), NODES_PER_QUERY)]
        counts = Grid(grid.prom, grid.since, grid.until, grid.start, grid.step_s, grid.n, groups,
                      by_node.chunk_s, rules=by_node.rules).matrix(count, only="whole")
        for node in partly:
            for key in devices_of[node]:
                cells = counts.get(key, {})
                for b in missing:
                    if b not in cells:
                        absent.setdefault(key, []).append(b)
    return absent


def _read(grid: Grid, b: int) -> bool:
    """Whether bucket ``b`` is read at all (:meth:`Grid.matrix` reads no empty clipped bucket)."""
    lo, hi = grid.span(b)
    return grid.whole(b) or hi - lo >= 0.001


def _node_samples(short: Matrix, grid: Grid, width: dict[str, int], every: float) -> Matrix:
    """Per node, its devices' most samples per bucket, where short (else as many as fit): what
    :func:`gpuslurm.report.prometheus.node_gaps` reads to find a node's gaps."""
    fit = grid.step_s / every
    per_node: dict[str, dict[int, list[float]]] = {}
    for key, cells in short.items():
        node = label(key, "node")
        for b, c in cells.items():
            per_node.setdefault(node, {}).setdefault(b, []).append(c)
    out: Matrix = {}
    for node, buckets in per_node.items():
        row = {b: fit for b in range(grid.n)}
        for b, counts in buckets.items():
            if len(counts) < width.get(node, 0):
                continue  # some of its devices were sampled throughout: its monitor was up
            if max(counts):
                row[b] = max(counts)
            else:  # none sampled: as the per-device path's samples, no bucket (a gap inside)
                del row[b]
        out[(("node", node),)] = row
    return out


def _unmeasured(short: Matrix, grid: Grid, allocations: tuple[AllocationSpan, ...],
                every: float) -> dict[tuple[str, str], float]:
    """Per job, the GPU-seconds it held a device in a bucket the device was sampled only in part."""
    holders: dict[tuple[str, str], list[AllocationSpan]] = {}
    for a in allocations:
        for d in a.devices:
            holders.setdefault((a.node, d), []).append(a)
    out: dict[tuple[str, str], float] = {}
    for key, cells in short.items():
        device = label(key, "mig_uuid") or label(key, "gpu_uuid")
        for b, count in cells.items():
            lo, hi = grid.span(b)
            cover = min(count * every / (hi - lo), 1.0) if hi > lo else 1.0
            for a in holders.get((label(key, "node"), device), ()):
                held = max(0.0, min(a.end, hi) - max(a.start, lo))
                if held and cover < 1.0:
                    job = (a.node, a.job_id)
                    out[job] = out.get(job, 0.0) + held * (1.0 - cover)
    return out


def as_report_data(u: UserBuckets) -> ReportData:
    """The window's frame (no series) for what a row's violations need."""
    return ReportData(u.source, u.since, u.until, u.start, u.step_s, (), (), u.allocations, u.violations,
                      u.gaps)
