"""``gpuslurm gpu offline|online|list`` and ``gpuslurm health``: one GPU out of service, and health now.

GPU is a UUID, ``index:N`` (NVML order) or ``minor:N`` (``/dev/nvidiaN``); a bare number is refused
because it names two GPUs wherever minors differ from indices. See docs/health.md.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import click

from gpuslurm.cli.main import from_option, json_option
from gpuslurm.cli.schedulers import scheduler_for
from gpuslurm.config import Config, load_config
from gpuslurm.errors import EXIT_CHECK_FAILED, GpuslurmError, HardwareError
from gpuslurm.hw.health import read_health
from gpuslurm.hw.source import hardware_source
from gpuslurm.jsondoc import document
from gpuslurm.policy.fault_response import LAST_IN_SERVICE, respond
from gpuslurm.policy.health import Fault, drain_reason, gate_faults, gpu_label, running_faults
from gpuslurm.state.out_of_service import (
    OutOfService,
    OutOfServiceStore,
    bring_back,
    resolve_gpu,
    take_out,
    take_out_decided,
)

if TYPE_CHECKING:
    from gpuslurm.hw.model.node import Node
    from gpuslurm.state.scheduler import Scheduler


def _node_name(given: str | None, cfg: Config) -> str:
    """--node-name, else [monitor] node_name, else slurmd's own (a HealthCheckProgram gets
    $SLURMD_NODENAME), else the short host name."""
    return (given or cfg.monitor.node_name or os.environ.get("SLURMD_NODENAME")
            or socket.gethostname().split(".")[0])


def _scheduler(cfg: Config) -> Scheduler:
    """Slurm's or PBS's adapter, as ``[scheduler] kind`` says."""
    return scheduler_for(cfg, cfg.hooks.command_timeout_s)


node_name_option = click.option(
    "--node-name", metavar="NAME",
    help="The Slurm node name or PBS host (default: [monitor] node_name, else the short host name).")
no_slurm_option = click.option("--no-slurm", "--no-scheduler", "no_slurm", is_flag=True,
                               help="Change only gpuslurm's record; leave Slurm (or PBS) as it is.")


@click.group("gpu")
def gpu() -> None:
    """Take one GPU out of service and back, and list the GPUs out (see docs/health.md)."""


@gpu.command("offline")
@click.argument("spec", metavar="GPU")
@click.option("--reason", required=True, metavar="TEXT",
              help="Why; shown in Slurm's node Comment, or the PBS vnode's comment.")
@click.option("--force", is_flag=True, help="Take out the last GPU in service (the node is then drained).")
@node_name_option
@no_slurm_option
@from_option
def offline(spec: str, reason: str, force: bool, node_name: str | None, no_slurm: bool,
            source: str | None) -> None:
    """Take GPU out of service: new jobs never get it; running jobs are not disturbed."""
    cfg = load_config()
    hardware = hardware_source(source, nvml_library=cfg.paths.nvml_library)
    node = hardware.node(links=True)
    target = resolve_gpu(spec, node.gpus)
    store = OutOfServiceStore(cfg.paths.state_dir)
    if not take_out(store, node.gpus, target, reason, "admin", now=time.time(), force=force):
        click.echo(f"GPU index {target.index} ({target.uuid}) was already out of service")
    else:
        click.echo(f"GPU index {target.index} ({target.uuid}) is out of service: {reason}")
    _apply(cfg, node, node_name, no_slurm, store)


@gpu.command("online")
@click.argument("spec", metavar="GPU")
@click.option("--force", is_flag=True, help="Bring it back even if its health check finds a fault.")
@node_name_option
@no_slurm_option
@from_option
def online(spec: str, force: bool, node_name: str | None, no_slurm: bool, source: str | None) -> None:
    """Bring GPU back into service after checking its health again."""
    cfg = load_config()
    hardware = hardware_source(source, nvml_library=cfg.paths.nvml_library)
    node = hardware.node(links=True)
    target = resolve_gpu(spec, node.gpus)
    store = OutOfServiceStore(cfg.paths.state_dir)
    if target.uuid not in store.read():
        click.echo(f"GPU index {target.index} ({target.uuid}) is in service")
    else:
        facts = read_health([target], hardware, captured=True)[target.uuid]
        faults = [f for f in gate_faults(facts, cfg.health) if f.action != "log"]
        if faults and not force:
            raise HardwareError(f"GPU index {target.index} ({target.uuid}) is still unhealthy: "
                                f"{'; '.join(f.message for f in faults)} (--force brings it back anyway)")
        bring_back(store, target)
        click.echo(f"GPU index {target.index} ({target.uuid}) is back in service")
    _apply(cfg, node, node_name, no_slurm, store)


@gpu.command("list")
@json_option
@from_option
def list_(as_json: bool, source: str | None) -> None:
    """Every GPU: in service or out, with the reason, who and when."""
    cfg = load_config()
    node = hardware_source(source, nvml_library=cfg.paths.nvml_library).node(links=False)
    out = OutOfServiceStore(cfg.paths.state_dir).read()
    rows: list[dict[str, Any]] = []
    for g in node.gpus:
        rec = out.get(g.uuid)
        rows.append({"index": g.index, "minor": g.minor, "uuid": g.uuid, "in_service": rec is None,
                     "reason": rec.reason if rec else None, "by": rec.by if rec else None,
                     "since": rec.since if rec else None})
    known = {g.uuid for g in node.gpus}
    for uuid, rec in sorted(out.items()):  # out of service and no longer seen (fell off the bus)
        if uuid not in known:
            rows.append({"index": rec.index, "minor": rec.minor, "uuid": uuid, "in_service": False,
                         "reason": rec.reason, "by": rec.by, "since": rec.since, "missing": True})
    if as_json:
        json.dump(document("gpu-list", {"gpus": rows}, node.hostname), sys.stdout, indent=1)
        sys.stdout.write("\n")
        return
    click.echo(f"{'INDEX':>5} {'MINOR':>5}  {'UUID':<40}  {'STATE':<7}  REASON")
    for r in rows:
        since = time.strftime("%Y-%m-%d %H:%M", time.localtime(r["since"])) if r["since"] else ""
        state = "in" if r["in_service"] else "OUT"
        why = f"{r['reason']} ({r['by']}, {since})" if r["reason"] else ""
        click.echo(f"{_num(r['index']):>5} {_num(r['minor']):>5}  {r['uuid']:<40}  {state:<7}  {why}")


def _num(value: int | None) -> str:
    return "?" if value is None else str(value)


def _apply(cfg: Config, node: Node, node_name: str | None, no_slurm: bool, store: OutOfServiceStore) -> None:
    if no_slurm:
        return
    scheduler = _scheduler(cfg)
    click.echo(scheduler.apply_gpus_out(_node_name(node_name, cfg), node, store.read()))


@click.command("health")
@click.option("--gpu", "gpu_id", metavar="GPU", help="Only this GPU (UUID, index:N or minor:N).")
@click.option("--act", is_flag=True,
              help="Act on faults as [health] says (gpu_out, drain): for Slurm's HealthCheckProgram.")
@node_name_option
@json_option
@from_option
def health(gpu_id: str | None, act: bool, node_name: str | None, as_json: bool, source: str | None) -> None:
    """Each GPU's health now, every fact and the verdict; exit 1 if any GPU in service is unhealthy."""
    cfg = load_config()
    hardware = hardware_source(source, nvml_library=cfg.paths.nvml_library)
    node = hardware.node(links=act)
    gpus = [resolve_gpu(gpu_id, node.gpus)] if gpu_id else list(node.gpus)
    store = OutOfServiceStore(cfg.paths.state_dir)
    out = store.read()
    facts = read_health(gpus, hardware, captured=True)
    report: list[dict[str, Any]] = []
    unhealthy = False
    for g in gpus:
        fact = facts[g.uuid]
        faults = running_faults(fact, cfg.health)
        rec = out.get(g.uuid)
        verdict = "out" if rec else "unhealthy" if any(f.action != "log" for f in faults) else "healthy"
        unhealthy |= verdict == "unhealthy"
        report.append({"index": g.index, "minor": g.minor, "uuid": g.uuid, "verdict": verdict,
                       "out_of_service": rec.to_dict() if rec else None,
                       "facts": {k: v for k, v in fact._asdict().items() if k != "uuid"},
                       "faults": [f._asdict() for f in faults]})
    if not gpu_id:
        report += _lost_rows(node.lost, out, cfg.health.lost_gpu.action)
        unhealthy |= any(r["verdict"] == "unhealthy" for r in report)
    if as_json:
        doc = document("health", {"healthy": not unhealthy, "gpus": report}, node.hostname)
        json.dump(doc, sys.stdout, indent=1, default=list)
        sys.stdout.write("\n")
    else:
        for r in report:
            shown = r["facts"].items()
            facts_line = ", ".join(f"{k}={_fact(v)}" for k, v in shown if v not in (None, (), False))
            named = f"/dev/nvidia{r['minor']}, {r['uuid']}" if r["uuid"] else "no UUID: NVML cannot name it"
            click.echo(f"GPU index {r['index']} ({named}): {r['verdict']}"
                       + (f" [{facts_line}]" if facts_line else ""))
            if r["out_of_service"]:
                click.echo(f"  out of service: {r['out_of_service']['reason']}")
            for f in r["faults"]:
                click.echo(f"  {f['check']}: {f['message']} (action {f['action']})")
    if act:
        _act_now(cfg, node, _node_name(node_name, cfg), report, store)
    if unhealthy:
        raise click.exceptions.Exit(EXIT_CHECK_FAILED)  # a check ran and found a fault


def _lost_rows(lost: tuple[int, ...], out: Mapping[str, OutOfService], action: str) -> list[dict[str, Any]]:
    """Report rows for GPUs NVML counts but answers GPU_IS_LOST for (left out of the node): named
    by the out-of-service record where it holds that index, else by the index alone."""
    rows: list[dict[str, Any]] = []
    for index in lost:
        uuid, rec = next(((u, r) for u, r in out.items() if r.index == index), (None, None))
        message = "GPU is lost (NVML answers GPU_IS_LOST: it cannot be read or named)"
        faults = [] if action == "off" else [{"uuid": uuid or f"index:{index}", "check": "lost_gpu",
                                               "action": action, "message": message}]
        verdict = "out" if rec else "unhealthy" if faults and action != "log" else "healthy"
        rows.append({"index": index, "minor": rec.minor if rec else None, "uuid": uuid, "verdict": verdict,
                     "out_of_service": rec.to_dict() if rec else None, "facts": {"lost": True},
                     "faults": faults})
    return rows


def _fact(value: object) -> str:
    if isinstance(value, tuple):
        return "[" + ",".join(str(getattr(v, "pid", v)) for v in value) + "]"
    return str(value)


def _act_now(cfg: Config, node: Node, name: str, report: list[dict[str, Any]],
             store: OutOfServiceStore) -> None:
    """``--act``: each unhealthy GPU's faults acted on as :func:`gpuslurm.policy.fault_response.respond`
    decides (``gpu_out`` takes the GPU out, ``drain`` drains the node); then Slurm is brought to
    the out-of-service record (this is what slurmd's HealthCheckProgram runs)."""
    scheduler = _scheduler(cfg)
    labels = {g.uuid: gpu_label(g.index, g.minor, g.uuid) for g in node.gpus}
    faults: list[Fault] = []
    for r in report:
        if r["verdict"] != "unhealthy":
            continue
        if r["uuid"] is None:  # lost, with no UUID to record it by: the response drains instead
            labels[f"index:{r['index']}"] = f"index {r['index']} (lost)"
        faults += [Fault(**f) for f in r["faults"]]
    try:
        response = take_out_decided(store, lambda out: respond(faults, node.gpus, out), "health",
                                    now=time.time(), out=store.read())
    except GpuslurmError as exc:
        click.echo(f"gpuslurm health: {exc}; draining the node instead", err=True)
        response = respond(faults, node.gpus, store.read()).unrecorded()
    for d in response.drains:
        if d.why == LAST_IN_SERVICE:
            click.echo(f"gpuslurm health: GPU {labels[d.uuid]} is the last GPU in service on this node: "
                       "draining the node instead of taking it out", err=True)
    if drains := response.drain_faults:
        reason = drain_reason(drains, labels)
        scheduler.drain_node(name, reason)
        click.echo(f"drained {name}: {reason}")
    if out := store.read():  # nothing out: no scheduler command (slurmd runs this every interval)
        click.echo(scheduler.apply_gpus_out(name, node, out))
