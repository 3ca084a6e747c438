"""Prometheus metrics from the node monitor: ``gpuslurm monitor --prometheus-port N``.

Each cycle replaces the whole exposition (:meth:`MetricsState.update`), so a job, process or
violation that is gone from the cycle is gone from ``/metrics`` at once, and Prometheus marks its
series stale at the next scrape. Only the counters (``*_total``) outlive a cycle. The text is
rendered once per cycle, not per scrape: a scrape only copies bytes.

Names follow Prometheus' conventions: base units (bytes, seconds, watts, celsius), ``_ratio`` for
0–1 fractions, ``_total`` for counters. Every device series carries ``node``, ``gpu_uuid`` and
``mig_uuid`` ("" for a whole GPU); job series add ``job_id``, ``user`` and ``account`` ("" when
unknown). No sample carries a timestamp: Prometheus stamps it with the scrape time, which keeps
its staleness handling working. The format is described in docs/prometheus.md; prometheus-client
writes it (escaping, number format), this module only decides what the series are.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import NamedTuple

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from gpuslurm.errors import InputError
from gpuslurm.samples import Allocation, Cycle, Violation
from gpuslurm.watch.http_bounded import LISTEN_BACKLOG, BoundedHttpServer, Responder, connection_cap

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"  # what generate_latest writes
MIB = 1 << 20
PREFIX = "gpuslurm_"
DEFAULT_TIMEOUT_S = 10.0  # a connection's whole life: Prometheus' default scrape_timeout
DEFAULT_MAX_CONNECTIONS = 64
INDEX = b'<html><body><a href="/metrics">gpuslurm metrics</a></body></html>\n'

# name (without PREFIX) → (type, help); the exposition lists families in this order
FAMILIES: dict[str, tuple[str, str]] = {
    "gpu_utilization_ratio": ("gauge", "GPU (or MIG device) utilisation over NVML's sample period, 0-1."),
    "gpu_memory_used_bytes": ("gauge", "Device memory in use."),
    "gpu_memory_total_bytes": ("gauge", "Device memory in total."),
    "gpu_power_watts": ("gauge", "Power draw."),
    "gpu_temperature_celsius": ("gauge", "GPU temperature."),
    "gpu_allocated": ("gauge", "1 for each job holding the device (job labels set), 0 for a free device."),
    "job_start_timestamp_seconds": ("gauge", "When the job holding GPUs here started (Unix seconds)."),
    "job_last_seen_timestamp_seconds": ("gauge", "When a cycle last saw the job (Unix seconds)."),
    "process_gpu_memory_bytes": ("gauge", "Device memory held by one process."),
    "process_sm_utilization_ratio": ("gauge", "SM utilisation of one process, 0-1 (none on MIG devices)."),
    "device_processes": ("gauge", "GPU processes on the device, per job (\"\": in none) and user."),
    "violation_active": ("gauge", "1 while a detector finding (rogue, idle, over-share) lasts."),
    "violation_start_timestamp_seconds": ("gauge", "When the finding's condition began (Unix seconds)."),
    "violation_duration_seconds": ("gauge", "How long the finding's condition has lasted."),
    "monitor_last_cycle_timestamp_seconds": ("gauge", "When the last monitor cycle sampled (Unix seconds)."),
    "monitor_interval_seconds": ("gauge", "The monitor's cycle interval: each cycle's sample stands for it."),
    "monitor_cycles_total": ("counter", "Monitor cycles run since the monitor started."),
    "monitor_problems_total": ("counter", "Things cycles could not read, by kind (pid-gone, gpu-lost, ...)."),
    "violations_started_total": ("counter", "Detector findings that began, by kind."),
}

Labels = tuple[tuple[str, str], ...]


class Sample(NamedTuple):
    family: str  # a key of FAMILIES
    labels: Labels
    value: float


class _Snapshot:
    """prometheus-client's view of one cycle's samples: families in FAMILIES order."""

    def __init__(self, samples: Iterable[Sample]) -> None:
        self._samples = list(samples)

    def collect(self) -> Iterator[Metric]:
        by_family: dict[str, list[Sample]] = {name: [] for name in FAMILIES}
        for s in self._samples:
            by_family[s.family].append(s)
        for name, rows in by_family.items():
            kind, help_text = FAMILIES[name]
            if not rows and kind != "counter":
                continue
            label_names = [k for k, _ in rows[0].labels] if rows else []
            family: GaugeMetricFamily | CounterMetricFamily
            if kind == "counter":
                family = CounterMetricFamily(PREFIX + name, help_text, labels=label_names)
            else:
                family = GaugeMetricFamily(PREFIX + name, help_text, labels=label_names)
            seen: set[Labels] = set()
            for s in rows:
                if s.labels in seen:  # a duplicate series would make the whole scrape fail
                    continue
                seen.add(s.labels)
                family.add_metric([v for _, v in s.labels], s.value)
            yield family


def render(samples: Iterable[Sample]) -> str:
    """The text exposition of ``samples`` (prometheus-client's), each family with HELP and TYPE."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Snapshot(samples))
    return generate_latest(registry).decode()


def _violation_key(v: Violation) -> tuple[object, ...]:
    return (v.kind, v.job_id, v.pid, v.gpu_uuid, v.user, v.start)


def cycle_samples(cycle: Cycle, violations: Sequence[Violation], per_process: bool = True) -> list[Sample]:
    """The gauges describing one cycle (pure). ``per_process`` False: no series per process (no
    ``gpuslurm_process_*``, no ``pid``/``process`` on violations), counts per device, job and user."""
    node = cycle.node
    out: list[Sample] = []
    parent: dict[str, str] = {}
    for g in cycle.gpus:
        if g.mig_uuid:
            parent[g.mig_uuid] = g.gpu_uuid
        dev: Labels = (("node", node), ("gpu_uuid", g.gpu_uuid), ("mig_uuid", g.mig_uuid or ""))
        for family, value, scale in (("gpu_utilization_ratio", g.util_pct, 0.01),
                                     ("gpu_memory_used_bytes", g.mem_used_mib, MIB),
                                     ("gpu_memory_total_bytes", g.mem_total_mib, MIB),
                                     ("gpu_power_watts", g.power_w, 1.0),
                                     ("gpu_temperature_celsius", g.temp_c, 1.0)):
            if value is not None:  # unknown stays absent, never 0
                out.append(Sample(family, dev, value * scale))
    jobs: dict[str, Allocation] = {a.job_id: a for a in cycle.allocations}
    held: set[str] = set()
    for a in cycle.allocations:
        job = (("node", node), *_job_labels(a.job_id, a.user, a.account))
        out.append(Sample("job_start_timestamp_seconds", job, a.start))
        out.append(Sample("job_last_seen_timestamp_seconds", job, cycle.ts))
        for uuid in a.uuids:
            held.add(uuid)
            labels = _device_labels(node, uuid, parent) + _job_labels(a.job_id, a.user, a.account)
            out.append(Sample("gpu_allocated", labels, 1.0))
    for g in cycle.gpus:
        uuid = g.mig_uuid or g.gpu_uuid
        if uuid not in held:
            free = _device_labels(node, uuid, parent) + _job_labels(None, None, None)
            out.append(Sample("gpu_allocated", free, 0.0))
    counts: dict[Labels, int] = {}
    for p in cycle.procs:
        alloc = jobs.get(p.job_id) if p.job_id is not None else None
        owner = (("node", node), ("gpu_uuid", p.gpu_uuid), ("mig_uuid", p.mig_uuid or ""),
                 *_job_labels(p.job_id, p.user, alloc.account if alloc else None))
        counts[owner] = counts.get(owner, 0) + 1
        if not per_process:
            continue
        labels = (*owner, ("pid", str(p.pid)), ("process", p.name or ""))
        if p.mem_mib is not None:
            out.append(Sample("process_gpu_memory_bytes", labels, p.mem_mib * MIB))
        if p.sm_util_pct is not None:
            out.append(Sample("process_sm_utilization_ratio", labels, p.sm_util_pct / 100.0))
    out += [Sample("device_processes", labels, float(n)) for labels, n in counts.items()]
    for v in violations:
        account = jobs[v.job_id].account if v.job_id in jobs else None
        who: Labels = (("pid", "" if v.pid is None else str(v.pid)), ("process", v.process or "")) \
            if per_process else ()
        labels = (_device_labels(v.node, v.gpu_uuid or "", parent) + _job_labels(v.job_id, v.user, account)
                  + who + (("kind", v.kind), ("severity", v.severity)))
        out.append(Sample("violation_active", labels, 1.0))
        out.append(Sample("violation_start_timestamp_seconds", labels, v.start))
        out.append(Sample("violation_duration_seconds", labels, v.duration_s))
    out.append(Sample("monitor_last_cycle_timestamp_seconds", (("node", node),), cycle.ts))
    return out


def _device_labels(node: str, uuid: str, parent: dict[str, str]) -> Labels:
    if uuid.startswith("MIG-"):
        return (("node", node), ("gpu_uuid", parent.get(uuid, "")), ("mig_uuid", uuid))
    return (("node", node), ("gpu_uuid", uuid), ("mig_uuid", ""))


def _job_labels(job_id: str | None, user: str | None, account: str | None) -> Labels:
    return (("job_id", job_id or ""), ("user", user or ""), ("account", account or ""))


class MetricsState:
    """What ``/metrics`` serves: the last cycle's gauges and the counters. Thread-safe."""

    def __init__(self, per_process: bool = False, interval_s: float | None = None) -> None:
        self.per_process = per_process
        self.interval_s = interval_s  # the report ends a job this long after its last cycle
        self._lock = threading.Lock()
        self._body = render(()).encode()
        self._cycles = 0
        self._problems: dict[tuple[str, str], int] = {}
        self._started: dict[tuple[str, str], int] = {}
        self._current: set[tuple[object, ...]] = set()

    def update(self, cycle: Cycle, violations: Sequence[Violation]) -> None:
        """Replace the exposition with ``cycle``'s (called by the monitor after each cycle)."""
        self._cycles += 1
        for p in cycle.problems:
            key = (cycle.node, p.kind)
            self._problems[key] = self._problems.get(key, 0) + 1
        keys: set[tuple[object, ...]] = set()
        for v in violations:
            vkey = _violation_key(v)
            keys.add(vkey)
            if vkey not in self._current:
                self._started[(v.node, v.kind)] = self._started.get((v.node, v.kind), 0) + 1
        self._current = keys
        samples = cycle_samples(cycle, violations, self.per_process)
        if self.interval_s:
            samples.append(Sample("monitor_interval_seconds", (("node", cycle.node),), self.interval_s))
        samples.append(Sample("monitor_cycles_total", (("node", cycle.node),), float(self._cycles)))
        samples += [Sample("monitor_problems_total", (("node", n), ("kind", k)), float(c))
                    for (n, k), c in sorted(self._problems.items())]
        samples += [Sample("violations_started_total", (("node", n), ("kind", k)), float(c))
                    for (n, k), c in sorted(self._started.items())]
        body = render(samples).encode()  # once per cycle: a scrape only copies bytes
        with self._lock:
            self._body = body

    def body(self) -> bytes:
        with self._lock:
            return self._body


def _route(state: MetricsState) -> Responder:
    def respond(method: str, path: str) -> tuple[int, str, bytes]:
        if path == "/metrics":
            return 200, CONTENT_TYPE, state.body()
        if path == "/":
            return 200, "text/html; charset=utf-8", INDEX
        return 404, "text/plain; charset=utf-8", b"not found; try /metrics\n"
    return respond


class Exporter:
    """The metrics server in a thread of its own; :func:`start_exporter` makes one."""

    def __init__(self, server: BoundedHttpServer, state: MetricsState, address: tuple[str, int]) -> None:
        self._server = server
        self.state = state
        self.address = address
        self.max_connections = server.max_connections
        self.timeout_s = server.timeout_s
        server.start()

    def close(self) -> None:
        self._server.close()


def start_exporter(addr: str, port: int, state: MetricsState | None = None, *,
                   timeout_s: float = DEFAULT_TIMEOUT_S, max_connections: int = DEFAULT_MAX_CONNECTIONS,
                   warn: Callable[[str], None] = lambda message: None) -> Exporter:
    """Listen on ``addr:port`` (port 0: any free port) and serve ``state``; InputError if it cannot.

    Each connection is closed ``timeout_s`` after it was accepted, whatever it is doing; at most
    ``max_connections`` (lowered to a quarter of RLIMIT_NOFILE) are open at once, the next ones
    wait in the kernel's listen backlog (see :mod:`gpuslurm.watch.http_bounded`).
    """
    family = socket.AF_INET6 if ":" in addr else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((addr, port))
        sock.listen(LISTEN_BACKLOG)
    except (OSError, OverflowError) as exc:
        sock.close()
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise InputError(f"cannot listen on {addr}:{port}: {why}", source="--prometheus-port") from None
    state = state or MetricsState()
    server = BoundedHttpServer(sock, _route(state), timeout_s=timeout_s,
                               max_connections=connection_cap(max_connections), warn=warn)
    return Exporter(server, state, sock.getsockname()[:2])
