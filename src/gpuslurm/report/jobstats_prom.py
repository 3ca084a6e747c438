"""One job's record read from Prometheus (the node monitors' exporters), for a job that spanned
nodes: every node's series of the job's devices, as :class:`JobRecord` (``jobstats --source``).

What the exporters give (watch/exporter.py) and how it is read, all evaluated at one time ``now``
over :data:`LOOKBACK_S`:

- the job: ``gpuslurm_job_start_timestamp_seconds`` and ``..._last_seen_...`` per node, with its
  ``user`` and ``account`` labels; its devices: ``gpuslurm_gpu_allocated{job_id=...}``;
- each device's raw scrapes between the job's start and last sighting on that node (utilisation,
  memory, power: range-vector selectors, so every scraped sample, not a resampled grid);
- its processes (``gpuslurm_process_gpu_memory_bytes``, where the exporter has per-process series).

Prometheus keeps no energy counter and no uid: energy is the power readings integrated (bounded
as the store's: samples.interval_energy_j); the job's owner is the ``user`` label the monitor (as
root) wrote from the scheduler. Who may see the job is decided by the caller's uid, through this
host's name for it, against that label (report/jobstats_load.py); docs/jobstats.md says what that
does and does not protect. Every request is bounded (timeout, answer size) and every failure is
one line (exit 2).
"""

from __future__ import annotations

import json
import math
import re
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterable
from typing import Any

from gpuslurm.report.prometheus import PrometheusError, parse_source
from gpuslurm.state.store_job import DeviceSeries, JobProcess, JobRecord, SeriesPoint
from gpuslurm.state.store_values import Checked

LOOKBACK_S = 31 * 86400  # how far back a job is looked for (Prometheus' default retention is 15 d)
TIMEOUT_S = 30.0
MAX_BYTES = 64 << 20  # one answer: a week of 10 s scrapes of 8 GPUs is about 20 MiB
MAX_DEVICES = 256  # per job, over all its nodes
MAX_POINTS = 400_000  # per device, as the store's
MIB = float(1 << 20)
_UUID = re.compile(r"\A(GPU|MIG)-[0-9A-Za-z-]{1,80}\Z")
_GAUGES = {"util": "gpuslurm_gpu_utilization_ratio", "mem": "gpuslurm_gpu_memory_used_bytes",
           "total": "gpuslurm_gpu_memory_total_bytes", "power": "gpuslurm_gpu_power_watts"}

Device = tuple[str, str, str]  # node, gpu_uuid, mig_uuid ("" for a whole GPU)


def read_owner(url: str, job_id: str, now: float,
               timeout_s: float = TIMEOUT_S) -> tuple[str, str | None] | None:
    """The job's ``user`` and ``account`` as its nodes' exporters labelled it, or None when
    Prometheus holds no such job within :data:`LOOKBACK_S` of ``now``; InputError when its nodes
    disagree on the user."""
    found = _sightings(url, job_id, now, timeout_s)
    return None if found is None else found[1:]


def _sightings(url: str, job_id: str, now: float,
               timeout_s: float) -> tuple[dict[str, float], str, str | None] | None:
    """Each node's last sighting of the job, its user and account (None: no such job)."""
    check = Checked(f"prometheus:{parse_source(url)}", "series")
    seen = _vector(url, "max by (node, user, account) (last_over_time("
                        f"gpuslurm_job_last_seen_timestamp_seconds{{job_id={_quote(job_id)}}}[{LOOKBACK_S}s]))",
                   now, timeout_s)
    users = {_label(m, "user") for m, _ in seen}
    if not users:
        return None
    if len(users) > 1:
        raise PrometheusError(f"job {job_id}: its nodes' series name different users "
                              f"({', '.join(sorted(users))[:200]})", source=f"prometheus:{parse_source(url)}")
    ends: dict[str, float] = {}
    for m, v in seen:
        node = _label(m, "node")
        ends[node] = max(ends.get(node, -math.inf), check.time(v, "gpuslurm_job_last_seen_timestamp_seconds"))
    accounts = sorted({_label(m, "account") for m, _ in seen} - {""})
    return ends, users.pop(), accounts[0] if accounts else None


def read_job(url: str, job_id: str, uid: int, now: float,
             timeout_s: float = TIMEOUT_S) -> JobRecord | None:
    """The job's record from every node Prometheus holds it on (``uid``: its owner's, as the
    caller resolved the ``user`` label), or None when it holds no such job."""
    check = Checked(f"prometheus:{parse_source(url)}", "series")
    sel = f"{{job_id={_quote(job_id)}}}"
    found = _sightings(url, job_id, now, timeout_s)
    if found is None:
        return None
    ends, user, account = found
    starts: dict[str, float] = {}
    for m, v in _vector(url, f"min by (node) (min_over_time(gpuslurm_job_start_timestamp_seconds{sel}"
                             f"[{LOOKBACK_S}s]))", now, timeout_s):
        starts[_label(m, "node")] = check.time(v, "gpuslurm_job_start_timestamp_seconds")
    held = _vector(url, f"max by (node, gpu_uuid, mig_uuid) (max_over_time(gpuslurm_gpu_allocated{sel}"
                        f"[{LOOKBACK_S}s]))", now, timeout_s)
    devices = sorted({(_label(m, "node"), _label(m, "gpu_uuid"), _label(m, "mig_uuid"))
                      for m, _ in held if _label(m, "node") in ends})
    devices = [d for d in devices if _UUID.match(d[1]) and (not d[2] or _UUID.match(d[2]))][:MAX_DEVICES]
    last = max(ends.values())
    # a job's series reach back at most the look-back: no start label widens the queries beyond it
    first = max(min(starts.get(n, e) for n, e in ends.items()), last - LOOKBACK_S)
    window = (first, last)
    series = _series(url, devices, window, starts, ends, check, timeout_s)
    shared = _shared(url, job_id, devices, window, timeout_s)
    out = []
    for d in devices:
        uuid = d[2] or d[1]
        out.append(DeviceSeries(uuid, d[1] if d[2] else None, tuple(series.get(d, ())),
                                tuple(shared.get(d, ())), node=d[0]))
    procs = _processes(url, sel, window, ends, check, timeout_s)
    return JobRecord(job_id, ",".join(sorted(ends)), user, uid, account, first, last, "prometheus",
                     tuple(out), procs)


def _series(url: str, devices: list[Device], window: tuple[float, float], starts: dict[str, float],
            ends: dict[str, float], check: Checked, timeout_s: float) -> dict[Device, list[SeriesPoint]]:
    """Each device's raw scrapes within its node's part of the job, one point per scrape time."""
    if not devices:
        return {}
    match = _uuid_matcher(devices)
    wanted = set(devices)
    values: dict[Device, dict[float, dict[str, float]]] = {d: {} for d in devices}
    for key, metric in _GAUGES.items():
        for m, points in _matrix(url, f"{metric}{{{match}}}", window, timeout_s):
            d = (_label(m, "node"), _label(m, "gpu_uuid"), _label(m, "mig_uuid"))
            if d not in wanted:
                continue
            lo, hi = starts.get(d[0], window[0]), ends[d[0]]
            for ts, raw in points[:MAX_POINTS]:
                t = check.time(ts, f"{metric} timestamp")
                if lo <= t <= hi:
                    values[d].setdefault(t, {})[key] = _number(check, raw, metric, key)
    out: dict[Device, list[SeriesPoint]] = {}
    for d, at in values.items():
        pts = []
        for t in sorted(at)[:MAX_POINTS]:
            v = at[t]
            util = v.get("util")
            pts.append(SeriesPoint(t, 0.0, 1, util, util, v.get("mem"), v.get("total"), v.get("power")))
        out[d] = pts
    return out


def _number(check: Checked, raw: object, metric: str, key: str) -> float:
    try:
        value = float(raw) if isinstance(raw, str) else math.nan
    except ValueError:
        value = math.nan
    if key == "util":
        return check.pct(value * 100.0, metric)
    scale = MIB if key in ("mem", "total") else 1.0
    return check.number(value, metric, 0.0) / scale


def _shared(url: str, job_id: str, devices: list[Device], window: tuple[float, float],
            timeout_s: float) -> dict[Device, list[str]]:
    """Other jobs allocated each device at some time of this one."""
    if not devices:
        return {}
    out: dict[Device, set[str]] = {}
    others = f'{_uuid_matcher(devices)},job_id!={_quote(job_id)},job_id!=""'
    for m, _ in _vector(url, f"max by (node, gpu_uuid, mig_uuid, job_id) (max_over_time("
                             f"gpuslurm_gpu_allocated{{{others}}}[{_range(window)}]))", window[1], timeout_s):
        d = (_label(m, "node"), _label(m, "gpu_uuid"), _label(m, "mig_uuid"))
        out.setdefault(d, set()).add(_label(m, "job_id"))
    return {d: sorted(jobs)[:100] for d, jobs in out.items()}


def _processes(url: str, sel: str, window: tuple[float, float], ends: dict[str, float], check: Checked,
               timeout_s: float) -> tuple[JobProcess, ...]:
    procs = []
    for m, points in _matrix(url, f"gpuslurm_process_gpu_memory_bytes{sel}", window, timeout_s):
        if _label(m, "node") not in ends or not points:
            continue
        pid = _label(m, "pid")
        if not (pid.isascii() and pid.isdigit()) or len(pid) > 10:
            continue
        times = [check.time(ts, "gpuslurm_process_gpu_memory_bytes timestamp") for ts, _ in points]
        mem = max(_number(check, raw, "gpuslurm_process_gpu_memory_bytes", "mem") for _, raw in points)
        procs.append(JobProcess(_label(m, "mig_uuid") or _label(m, "gpu_uuid"), int(pid),
                                _label(m, "process") or None, None, _label(m, "user") or None,
                                min(times), max(times), mem))
    procs.sort(key=lambda p: (p.first_seen, p.pid))
    return tuple(procs[:1000])


def _uuid_matcher(devices: Iterable[Device]) -> str:
    # UUIDs are checked (letters, digits, hyphens): nothing in them is special to RE2
    return f'gpu_uuid=~"{"|".join(sorted({d[1] for d in devices}))}"'


def _quote(value: str) -> str:
    return json.dumps(value)  # a PromQL string literal: JSON's escapes are Go's


def _range(window: tuple[float, float]) -> str:
    return f"{max(1, math.ceil(window[1] - window[0]) + 1)}s"


def _label(metric: dict[str, Any], name: str) -> str:
    value = metric.get(name, "")
    return value if isinstance(value, str) else ""


def _vector(url: str, query: str, at: float, timeout_s: float) -> list[tuple[dict[str, Any], float]]:
    out = []
    for item in _query(url, query, at, "vector", timeout_s):
        value = item.get("value")
        if isinstance(value, list) and len(value) == 2 and isinstance(item.get("metric"), dict):
            try:
                number = float(value[1])
            except (TypeError, ValueError):
                continue
            if math.isfinite(number):
                out.append((item["metric"], number))
    return out


def _matrix(url: str, selector: str, window: tuple[float, float],
            timeout_s: float) -> list[tuple[dict[str, Any], list[tuple[float, str]]]]:
    """Every scraped sample of ``selector``'s series in ``window`` (a range-vector selector,
    evaluated at its end)."""
    out = []
    for item in _query(url, f"{selector}[{_range(window)}]", window[1], "matrix", timeout_s):
        values = item.get("values")
        if not isinstance(values, list) or not isinstance(item.get("metric"), dict):
            continue
        points = [(float(v[0]), v[1]) for v in values
                  if isinstance(v, list) and len(v) == 2 and isinstance(v[0], int | float)]
        out.append((item["metric"], points))
    return out


def _query(url: str, query: str, at: float, want: str, timeout_s: float) -> list[dict[str, Any]]:
    """``/api/v1/query`` at ``at``: the result's elements; one-line PrometheusError otherwise."""
    base = parse_source(url)
    here = f"prometheus:{base}"
    full = f"{base}/api/v1/query?{urllib.parse.urlencode({'query': query, 'time': f'{at:.3f}'})}"
    try:
        with urllib.request.urlopen(full, timeout=timeout_s) as resp:  # noqa: S310 - scheme checked
            raw = resp.read(MAX_BYTES + 1)
    except urllib.error.HTTPError as exc:
        raise PrometheusError(f"HTTP {exc.code} from /api/v1/query", source=here) from None
    except (urllib.error.URLError, OSError, ValueError) as exc:
        reason = getattr(exc, "reason", exc)
        raise PrometheusError(f"unreachable: {str(reason)[:200]}", source=here) from None
    if len(raw) > MAX_BYTES:
        raise PrometheusError(f"answer larger than {MAX_BYTES >> 20} MiB: the job's series are too long to "
                              "read at once", source=here)
    try:
        doc = json.loads(raw)
    except ValueError:
        raise PrometheusError("/api/v1/query did not answer JSON: is this Prometheus?", source=here) from None
    data = doc.get("data") if isinstance(doc, dict) else None
    if not isinstance(doc, dict) or doc.get("status") != "success" or not isinstance(data, dict):
        why = str(doc.get("error") if isinstance(doc, dict) else "no data")
        raise PrometheusError(f"/api/v1/query failed: {' '.join(why.split())[:300]}", source=here)
    if data.get("resultType") != want or not isinstance(data.get("result"), list):
        raise PrometheusError(f"/api/v1/query answered {data.get('resultType')!r}, not {want!r}", source=here)
    return [r for r in data["result"] if isinstance(r, dict)]
