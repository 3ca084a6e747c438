"""``gpuslurm monitor``'s use case: open the node and the store, wire the monitor's parts from the
configuration, run cycles until stopped (see docs/monitor.md).

The scheduler reaches the monitor only as what the entry point hands in (:class:`MonitorParts`):
the adapter (:class:`~gpuslurm.state.scheduler.Scheduler`) for listing jobs, acting on faults and
idle jobs and keeping running jobs' comments, and the few parts that live above watch/ (Slurm's
shares as quotas, the throttle's violations file, the epilog's comment line).
"""

from __future__ import annotations

import grp
import os
import socket
import threading
from collections.abc import Callable, Mapping, Sequence
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, NamedTuple

from gpuslurm.errors import InputError
from gpuslurm.hw.health import read_health
from gpuslurm.hw.live.kmsg import KmsgReader
from gpuslurm.hw.live.nvml_health import NvmlHealthReader
from gpuslurm.policy.detect import Detector
from gpuslurm.report.jobstats_load import files_dir
from gpuslurm.report.jobstats_load import settings as jobstats_settings
from gpuslurm.state.out_of_service import OutOfServiceStore
from gpuslurm.state.store import Store, default_path
from gpuslurm.watch import monitor as mon
from gpuslurm.watch.act import Actor
from gpuslurm.watch.build import build_monitor
from gpuslurm.watch.comments import CommentUpdater, TextFn
from gpuslurm.watch.health import HealthReader, HealthWatch
from gpuslurm.watch.jobfiles import JobFiles
from gpuslurm.watch.notify import JobTextFn, notifier_for

if TYPE_CHECKING:
    from gpuslurm.config import Config
    from gpuslurm.hw.model.node import Node
    from gpuslurm.hw.source import HardwareSource
    from gpuslurm.samples import Cycle, ScanProblem, Violation
    from gpuslurm.state.scheduler import Scheduler
    from gpuslurm.watch.monitor import QuotaFeed

Warn = Callable[[str], None]


class MonitorParts(NamedTuple):
    """What the monitor takes from the layers above watch/, built by the entry point."""

    scheduler_for: Callable[[float], Scheduler]  # the node's adapter, its commands bounded so
    publish: Callable[[str, str, Sequence[Violation]], object]  # (dir, node, violations): throttle's file
    comment_text: TextFn  # (GPU count, figures) → a running job's comment line
    # [detect.share] quota_source → its feed (Slurm's shares for "slurm"); "config" needs none
    quota_feeds: Mapping[str, Callable[[Config, int], QuotaFeed]] = MappingProxyType({})
    # [notify]: a job's name and comment from the scheduler, for its end-of-job message
    job_text: Callable[[float], JobTextFn] | None = None


class Exporting(NamedTuple):
    """``--prometheus-port``: where the metrics server listens."""

    addr: str
    port: int


def run_monitor(cfg: Config, source: HardwareSource, parts: MonitorParts, *, db: str | None = None,
                interval: float | None = None, once: bool = False,
                on_cycle: Callable[[Cycle], None] | None = None, prometheus: Exporting | None = None,
                warn: Warn = lambda message: None) -> None:
    """Sample ``source`` (a replayed bundle, or NVML) every ``interval`` seconds (default ``[monitor]
    interval_s``), or ``once``, into the store ``db`` (default ``[monitor] db``), until SIGTERM or
    SIGINT. InputError when a cycle could not be stored, or for a bad store path or group."""
    mc = cfg.monitor
    path = db or mc.db or default_path(cfg.paths.state_dir)
    if not os.path.isabs(path):
        raise InputError(f"the store must be an absolute path, not {path!r}",
                         source="--db" if db else "monitor.db")
    node_name = mc.node_name or socket.gethostname().split(".")[0]
    sampler, node = mon.open_sampler(source)
    os.makedirs(os.path.dirname(path), mode=0o755, exist_ok=True)
    store = Store.open(path, group=_db_group(mc.db_group))
    for change in store.tightened:
        warn(f"the store is {'readable by its group only' if mc.db_group else 'root-only'}: {change}")
    if store.moved_aside:
        warn(f"{path} was not a usable store; moved it to {store.moved_aside} and started a new one")
    detector = Detector(cfg.detect)
    settings = jobstats_settings(cfg)
    files = JobFiles(files_dir(cfg), store, settings, interval_s=cfg.jobstats.write_interval_s,
                     keep_s=cfg.jobstats.keep_days * 86400, warn=warn)
    try:
        notifier = notifier_for(cfg, store, settings, warn=warn, job_text=None if parts.job_text is None
                                else parts.job_text(mc.command_timeout_s))
    except BaseException:
        store.close()
        sampler.close()
        raise
    exporter = None
    if prometheus is not None:
        from gpuslurm.watch.exporter import MetricsState, start_exporter

        exporter = start_exporter(prometheus.addr, prometheus.port,
                                  MetricsState(per_process=mc.prometheus_per_process,
                                               interval_s=interval or mc.interval_s),
                                  timeout_s=mc.prometheus_timeout_s,
                                  max_connections=mc.prometheus_max_connections, warn=warn)
        warn(f"serving metrics on http://{prometheus.addr}:{prometheus.port}/metrics (at most "
             f"{exporter.max_connections} connections, each closed after {exporter.timeout_s:g} s)")
    monitor = build_monitor(sampler, store, node_name, jobs_dir=cfg.paths.jobs_dir, node=node,
                            scheduler=parts.scheduler_for(mc.command_timeout_s),
                            squeue_interval_s=mc.squeue_interval_s,
                            raw_window_s=mc.raw_window_s, warn=warn, detector=detector,
                            **_parts(cfg, parts, node, node_name, source, store, warn),
                            observe=exporter.state.update if exporter else None,
                            jobfiles=files if notifier is None else _each(files, notifier, warn))
    stop = threading.Event()
    restore = mon.stop_on_signals(stop)
    try:
        mon.run(monitor, interval or mc.interval_s, once=once, stop=stop, on_cycle=on_cycle)
    finally:
        restore()
        if notifier is not None:
            notifier.close()
        if exporter is not None:
            exporter.close()
        store.close()
        sampler.close()
    if monitor.pending:
        raise InputError(f"{len(monitor.pending)} cycle(s) could not be stored", source=path)


def _each(files: Callable[[Cycle], None], notifier: Callable[[Cycle], None],
          warn: Warn) -> Callable[[Cycle], None]:
    """The job files, then the end-of-job messages: at the same cycle, one's failure not the other's."""
    def both(cycle: Cycle) -> None:
        try:
            files(cycle)
        finally:
            try:
                notifier(cycle)
            except Exception as exc:  # messages are a courtesy: they never stop the monitor
                warn(f"[notify] failed this cycle: {type(exc).__name__}: {exc}")
    return both


def _db_group(name: str) -> int | None:
    """The gid of ``[monitor] db_group``; None when it is empty (the store stays root's alone)."""
    if not name:
        return None
    try:
        return grp.getgrnam(name).gr_gid
    except KeyError:
        raise InputError(f"no such group: {name!r}", source="monitor.db_group") from None


def _parts(cfg: Config, parts: MonitorParts, node: Node, node_name: str, source: HardwareSource,
           store: Store, warn: Warn) -> dict[str, Any]:
    """The Monitor's optional parts the configuration turns on."""
    def publish(violations: Sequence[Violation]) -> None:
        parts.publish(cfg.paths.violations_dir, node_name, violations)

    quotas = None
    if (feed := parts.quota_feeds.get(cfg.detect.share.quota_source)) is not None:
        quotas = feed(cfg, sum(1 for _ in node.gpus))
    return {"publish": publish,
            "comments": _comments(cfg, parts, store, warn), "act": _actions(cfg, parts, node_name, warn),
            "quotas": quotas, "health": _health(cfg, parts, node, node_name, source, warn)}


def _comments(cfg: Config, parts: MonitorParts, store: Store, warn: Warn) -> CommentUpdater | None:
    """With ``[epilog] admin_comment``, what keeps running jobs' comments current, through the
    scheduler's adapter (Slurm's AdminComment, never over another tool's)."""
    if not cfg.epilog.admin_comment:
        return None
    sched = parts.scheduler_for(cfg.monitor.command_timeout_s)
    if (why := sched.why_no_running_comments()) is not None:
        warn(why)
        return None
    return CommentUpdater(cfg.monitor.admin_comment_interval_s, stats=store.gpu_stats,
                          text=parts.comment_text, send=sched.set_running_comment)


def _actions(cfg: Config, parts: MonitorParts, node_name: str,
             warn: Warn) -> Callable[[Cycle, Sequence[Violation]], Sequence[ScanProblem]]:
    """What carries out ``[act]`` each cycle (see docs/monitor.md, "Actions")."""
    actor = Actor(cfg, node_name, warn=warn, scheduler=parts.scheduler_for(cfg.act.timeout_s))
    if cfg.act.dry_run and (cfg.act.rogue.kill or cfg.act.idle.scancel):
        warn("[act] dry_run is on: rogue processes and idle jobs are only reported, "
             "never killed or cancelled")
    return actor.act


def _health(cfg: Config, parts: MonitorParts, node: Node, node_name: str, source: HardwareSource,
            warn: Warn) -> Callable[[float], Sequence[ScanProblem]] | None:
    """With ``[monitor] health``: the live health check (see docs/health.md)."""
    if not cfg.monitor.health:
        return None
    kmsg = None
    path = cfg.monitor.kmsg
    if path == "auto":
        path = "" if source.replay else "/dev/kmsg"
    if path:
        reader = KmsgReader(cfg.paths.state_dir, kmsg=path)
        try:
            for why in reader.open():
                warn(why)
            kmsg = reader
        except OSError as exc:
            warn(f"cannot read the kernel log {path} ({exc.strerror}): Xids are not seen")
    adapter = parts.scheduler_for(cfg.monitor.command_timeout_s)
    scheduler: Scheduler | None = adapter
    if (cannot := adapter.why_no_node_actions()) is not None:
        warn(f"{cannot}: faults are logged, GPUs recorded out of service, "
             f"but {adapter.title} is not told")
        scheduler = None

    events = None
    read: HealthReader
    if not source.replay:
        from gpuslurm.hw.live.nvml_events import NvmlEvents  # NVML's event set: a live node only

        read = NvmlHealthReader().read
        events = NvmlEvents(node.gpus)
        if (unavailable := events.start()) is not None:
            warn(unavailable)  # once: the kernel log stays the source
            events = None
    else:
        def read(gpus: Sequence[Any]) -> Mapping[str, Any]:
            return read_health(gpus, source, captured=True)

    watch = HealthWatch(node, cfg.health, read, OutOfServiceStore(cfg.paths.state_dir), node_name,
                        scheduler=scheduler, kmsg=kmsg, events=events, warn=warn)
    return watch.check
