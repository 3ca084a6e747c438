"""``gpuslurm monitor``: the node monitor daemon (see docs/monitor.md)."""

from __future__ import annotations

import json
import os
import socket
import sys
from typing import TYPE_CHECKING, Any

import click

from gpuslurm.cli.main import from_option

if TYPE_CHECKING:
    from gpuslurm.hw.source import HardwareSource
    from gpuslurm.state.scheduler import Scheduler


def _warn(message: str) -> None:
    click.echo(f"gpuslurm monitor: {message}", err=True)


def _positive_float(ctx: click.Context, param: click.Parameter, value: float | None) -> float | None:
    if value is not None and not 0.05 <= value <= 3600:
        raise click.BadParameter("must be between 0.05 and 3600 seconds")
    return value


@click.command("monitor")
@click.option("--interval", type=float, metavar="SECONDS", callback=_positive_float,
              help="Seconds between cycles (default: [monitor] interval_s, 10).")
@click.option("--once", is_flag=True, help="Run one cycle, store it, print a summary and exit.")
@click.option("--db", metavar="PATH",
              help="The SQLite store (default: [monitor] db, else <state_dir>/monitor.db).")
@click.option("--json", "as_json", is_flag=True, help="Print every cycle as one JSON line.")
@click.option("--prometheus-port", type=click.IntRange(1, 65535), metavar="PORT",
              help="Serve Prometheus metrics on http://ADDR:PORT/metrics (see docs/prometheus.md).")
@click.option("--prometheus-addr", default="127.0.0.1", show_default=True, metavar="ADDR",
              help="Address the metrics server listens on (0.0.0.0 or :: for every interface).")
@from_option
def monitor(interval: float | None, once: bool, db: str | None, as_json: bool, source: str | None,
            prometheus_port: int | None, prometheus_addr: str) -> None:
    """Sample every GPU and GPU process, attribute them to Slurm or PBS jobs, detect hogs, store it all."""
    import threading

    from gpuslurm.config import load_config
    from gpuslurm.errors import InputError
    from gpuslurm.hw.source import hardware_source
    from gpuslurm.state.store import Store, default_path
    from gpuslurm.watch import monitor as mon
    from gpuslurm.watch.build import build_monitor

    cfg = load_config()
    hardware = hardware_source(source, nvml_library=cfg.paths.nvml_library)
    mc = cfg.monitor
    path = db or mc.db or default_path(cfg.paths.state_dir)
    if not os.path.isabs(path):
        raise InputError(f"the store must be an absolute path, not {path!r}",
                         source="--db" if db else "monitor.db")
    node_name = mc.node_name or socket.gethostname().split(".")[0]
    sampler, node = mon.open_sampler(hardware)
    os.makedirs(os.path.dirname(path), mode=0o755, exist_ok=True)
    store = Store.open(path, group=_db_group(mc.db_group))
    for change in store.tightened:
        _warn(f"the store is {'readable by its group only' if mc.db_group else 'root-only'}: {change}")
    if store.moved_aside:
        _warn(f"{path} was not a usable store; moved it to {store.moved_aside} and started a new one")
    detector, publish = _detection(cfg, node_name)
    exporter = None
    if prometheus_port is not None:
        from gpuslurm.watch.exporter import start_exporter

        exporter = start_exporter(prometheus_addr, prometheus_port, timeout_s=mc.prometheus_timeout_s,
                                  max_connections=mc.prometheus_max_connections, warn=_warn)
        _warn(f"serving metrics on http://{prometheus_addr}:{prometheus_port}/metrics "
              f"(at most {exporter.max_connections} connections, each closed after {exporter.timeout_s:g} s)")
    monitor_ = build_monitor(sampler, store, node_name, jobs_dir=cfg.paths.jobs_dir, node=node,
                             scheduler=_scheduler(cfg), squeue_interval_s=mc.squeue_interval_s,
                             raw_window_s=mc.raw_window_s, detector=detector, publish=publish, warn=_warn,
                             comments=_comments(cfg, store),
                             act=_actions(cfg, node_name),
                             quotas=_slurm_quotas(cfg, node),
                             health=_health(cfg, node, node_name, hardware),
                             observe=exporter.state.update if exporter else None)
    stop = threading.Event()
    restore = mon.stop_on_signals(stop)
    try:
        on_cycle = _print_json if as_json else (_summary if once else None)
        mon.run(monitor_, interval or mc.interval_s, once=once, stop=stop, on_cycle=on_cycle)
    finally:
        restore()
        if exporter is not None:
            exporter.close()
        store.close()
        sampler.close()
    if monitor_.pending:
        raise InputError(f"{len(monitor_.pending)} cycle(s) could not be stored", source=path)


def _db_group(name: str) -> int | None:
    """The gid of ``[monitor] db_group``; None when it is empty (the store stays root's alone)."""
    if not name:
        return None
    import grp

    from gpuslurm.errors import InputError

    try:
        return grp.getgrnam(name).gr_gid
    except KeyError:
        raise InputError(f"no such group: {name!r}", source="monitor.db_group") from None


def _scheduler(cfg: Any) -> Scheduler | None:
    """Slurm or PBS (``[scheduler] kind``), when its command is there to list the jobs."""
    from gpuslurm.cli.schedulers import build_scheduler

    return build_scheduler(cfg, _warn)


def _health(cfg: Any, node: Any, node_name: str, source: HardwareSource) -> Any:
    """With ``[monitor] health``: the live health check (see docs/health.md)."""
    if not cfg.monitor.health:
        return None
    from gpuslurm.cli.schedulers import action_command, scheduler_for
    from gpuslurm.hw.health import read_health
    from gpuslurm.state.out_of_service import OutOfServiceStore
    from gpuslurm.watch.health import HealthWatch

    kmsg = None
    path = cfg.monitor.kmsg
    if path == "auto":
        path = "" if source.replay else "/dev/kmsg"
    if path:
        from gpuslurm.hw.kmsg import KmsgReader

        reader = KmsgReader(cfg.paths.state_dir, kmsg=path)
        try:
            for why in reader.open():
                _warn(why)
            kmsg = reader
        except OSError as exc:
            _warn(f"cannot read the kernel log {path} ({exc.strerror}): Xids are not seen")
    adapter = scheduler_for(cfg, cfg.monitor.command_timeout_s)
    scheduler: Scheduler | None = adapter
    if not os.access(command := action_command(cfg), os.X_OK):
        _warn(f"{command} is missing: faults are logged, GPUs recorded out of service, "
              f"but {'PBS' if adapter.name == 'pbs' else 'Slurm'} is not told")
        scheduler = None

    events = None
    if not source.replay:
        from gpuslurm.hw.health import NvmlHealthReader
        from gpuslurm.hw.nvml_events import NvmlEvents

        read = NvmlHealthReader().read
        events = NvmlEvents(node.gpus)
        if (unavailable := events.start()) is not None:
            _warn(unavailable)  # once: the kernel log stays the source
            events = None
    else:
        def read(gpus: Any) -> Any:
            return read_health(gpus, source, captured=True)

    watch = HealthWatch(node, cfg.health, read, OutOfServiceStore(cfg.paths.state_dir), node_name,
                        scheduler=scheduler, kmsg=kmsg, events=events, warn=_warn)
    return watch.check


def _comments(cfg: Any, store: Any) -> Any:
    """With ``[epilog] admin_comment``, what keeps running jobs' AdminComment current."""
    if not cfg.epilog.admin_comment:
        return None
    if not os.access(cfg.paths.scontrol, os.X_OK):
        _warn(f"{cfg.paths.scontrol} is missing: jobs' AdminComment is not kept current")
        return None
    from gpuslurm.hooks.epilog import admin_comment
    from gpuslurm.slurm.scontrol import refused_as_finished, set_own_admin_comment
    from gpuslurm.watch.comments import CommentUpdater

    def send(job_id: str, text: str) -> None:  # never over another tool's AdminComment (jobstats')
        set_own_admin_comment(job_id, text, squeue=cfg.paths.squeue, scontrol=cfg.paths.scontrol,
                              timeout=cfg.monitor.command_timeout_s)

    return CommentUpdater(cfg.monitor.admin_comment_interval_s, stats=store.gpu_stats, text=admin_comment,
                          send=send, finished=refused_as_finished)


def _actions(cfg: Any, node_name: str) -> Any:
    """What carries out ``[act]`` each cycle (see docs/monitor.md, "Actions")."""
    from gpuslurm.cli.schedulers import scheduler_for
    from gpuslurm.watch.act import Actor

    actor = Actor(cfg, node_name, warn=_warn, scheduler=scheduler_for(cfg, cfg.act.timeout_s))
    if cfg.act.dry_run and (cfg.act.rogue.kill or cfg.act.idle.scancel):
        _warn("[act] dry_run is on: rogue processes and idle jobs are only reported, "
              "never killed or cancelled")
    return actor.act


def _slurm_quotas(cfg: Any, node: Any) -> Any:
    """With ``quota_source = "slurm"``: Slurm's shares as quotas on this node's GPUs, cached."""
    if cfg.detect.share.quota_source != "slurm":
        return None
    from gpuslurm.slurm.sshare import node_quota_cache

    return node_quota_cache(cfg, sum(1 for _ in node.gpus))


def _detection(cfg: Any, node_name: str) -> tuple[Any, Any]:
    from gpuslurm.policy.detect import Detector
    from gpuslurm.slurm.throttle import append_violations

    def publish(violations: Any) -> None:
        append_violations(cfg.paths.violations_dir, node_name, violations)

    return Detector(cfg.detect), publish


def _print_json(cycle: Any) -> None:
    from gpuslurm.jsondoc import document
    from gpuslurm.watch.monitor import cycle_dict

    doc = document("monitor-cycle", cycle_dict(cycle), cycle.node)
    sys.stdout.write(json.dumps(doc, separators=(",", ":")) + "\n")
    sys.stdout.flush()


def _summary(cycle: Any) -> None:
    jobs = sum(1 for p in cycle.procs if p.job_id is not None)
    click.echo(f"{cycle.node}: {len(cycle.gpus)} devices, {len(cycle.procs)} GPU processes "
               f"({jobs} in jobs), {len(cycle.allocations)} allocations, {len(cycle.problems)} problems")
    for p in cycle.problems:
        click.echo(f"  {p.kind}: {p.subject}: {p.detail}")
