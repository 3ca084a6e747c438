"""``gpuslurm mig show|assert|apply``: a declarative per-node MIG layout (see docs/mig.md)."""

from __future__ import annotations

import json
import socket
import sys
from pathlib import Path
from typing import Any

import click

from gpuslurm.cli.main import from_option, json_option
from gpuslurm.config import load_config
from gpuslurm.errors import CheckMismatchError
from gpuslurm.gres.records import GresOptions
from gpuslurm.hw.source import hardware_source
from gpuslurm.isolate.mig import (
    describe_state,
    diff_lines,
    gpu_state,
    layout_toml,
    load_layout,
    resolve_layout,
)
from gpuslurm.isolate.mig_profiles import board_for
from gpuslurm.jsondoc import document
from gpuslurm.names import check_node_name
from gpuslurm.slurm.mig_apply import ApplyOptions, MigApplier
from gpuslurm.slurm.mig_types import target_naming


@click.group("mig")
def mig() -> None:
    """Show, check and apply a MIG layout (which GPUs get which MIG profiles) on this node."""


@mig.command("show")
@from_option
@json_option
@click.option("--as-layout", is_flag=True, help="Print the current layout as a layout file to edit.")
def show(source: str | None, as_json: bool, as_layout: bool) -> None:
    """Show each GPU's MIG mode, GPU instances and MIG device UUIDs."""
    node = hardware_source(source).node()
    if as_layout:
        click.echo(layout_toml(node), nl=False)
    elif as_json:
        click.echo(json.dumps(_show_dict(node), indent=1))
    else:
        _show_table(node)


def _show_dict(node: Any) -> dict[str, Any]:
    gpus = []
    for g in node.gpus:
        state = gpu_state(g)
        board = board_for(g.name, g.memory_mib) if g.mig_mode is not None else None
        gpus.append({
            "index": g.index, "uuid": g.uuid, "name": g.name, "mig_mode": g.mig_mode,
            "profile_table": board.model if board else None,
            "profiles": list(state.profiles), "split_gpu_instances": list(state.split),
            "compute_instances": [list(c) for c in state.compute or ((),) * len(state.profiles)],
            "devices": [{"index": m.index, "gi_id": m.gi_id, "ci_id": m.ci_id, "profile": m.profile,
                         "memory_mib": m.memory_mib, "uuid": m.uuid} for m in g.mig_devices],
        })
    return document("mig-show", {"source": node.source, "gpus": gpus}, node.hostname)


def _show_table(node: Any) -> None:
    click.echo(f"{node.hostname} ({node.source or 'live'})")
    for g in node.gpus:
        click.echo(f"GPU {g.index}  {g.uuid}  {g.name}  {describe_state(gpu_state(g))}")
        for m in g.mig_devices:
            click.echo(f"  MIG {m.index}  GI {m.gi_id} CI {m.ci_id}  {m.profile or '?':<12} "
                       f"{m.memory_mib:>6} MiB  {m.uuid or '(no UUID in the capture)'}")


@mig.command("assert")
@click.argument("layout", type=click.Path(path_type=Path))
@from_option
def assert_(layout: Path, source: str | None) -> None:
    """Exit 0 if the node matches LAYOUT; else print one line per differing GPU and exit 1."""
    wanted_layout = load_layout(layout)
    node = hardware_source(source).node()
    wanted = resolve_layout(wanted_layout, node)
    problems = diff_lines(node, wanted)
    for line in problems:
        click.echo(f"{node.hostname}: {line}")
    if problems:
        raise CheckMismatchError(f"{node.hostname}: {len(problems)} GPU(s) differ from {layout}")
    click.echo(f"{node.hostname}: matches {layout} ({len(wanted)} GPU(s))")


@mig.command("apply")
@click.argument("layout", type=click.Path(path_type=Path))
@from_option
@click.option("--dry-run", is_flag=True, help="Print the plan and change nothing.")
@click.option("--node", "node_name", metavar="NAME",
              help="Slurm NodeName to drain and resume (default: this host's short name).")
@click.option("--gres-conf", type=click.Path(path_type=Path), metavar="PATH",
              help="Regenerate this gres.conf (atomically) and run scontrol reconfigure.")
@click.option("--gres-node-name", metavar="NAME", help="Prefix the gres.conf lines with NodeName=NAME.")
@click.option("--gres-template", type=click.Path(path_type=Path), metavar="FILE",
              help="Render gres.conf with this jinja2 template.")
@click.option("--dev-root", default="", hidden=True, help="Prefix device paths in gres.conf (test clusters).")
@click.option("--no-drain", is_flag=True,
              help="Do not drain, wait for jobs or resume: the node is already out of service.")
@click.option("--wait-s", type=click.FloatRange(min=0), default=600.0, show_default=True, metavar="N",
              help="How long to wait for running jobs to end after draining.")
@click.option("--poll-s", type=click.FloatRange(min=0.05), default=2.0, hidden=True)
@click.option("--slurm-version", metavar="X.Y[.Z]",
              help="Write gres.conf's MIG Types as this Slurm release names them (default: slurmd -V).")
def apply(layout: Path, source: str | None, dry_run: bool, node_name: str | None, gres_conf: Path | None,
          gres_node_name: str | None, gres_template: Path | None, dev_root: str, no_drain: bool,
          wait_s: float, poll_s: float, slurm_version: str | None) -> None:
    """Make the node match LAYOUT: drain, reconfigure MIG, regenerate gres.conf, resume."""
    if node_name is not None:
        check_node_name(node_name, source="--node")
    if gres_node_name is not None:
        check_node_name(gres_node_name, source="--gres-node-name", hostlist=True)
    wanted_layout = load_layout(layout)
    cfg = load_config()
    opts = ApplyOptions(
        node_name=node_name or socket.gethostname().split(".")[0], drain=not no_drain, wait_s=wait_s,
        poll_s=poll_s, gres_conf=gres_conf,
        gres=GresOptions(node_name=gres_node_name, dev_root=dev_root, mig=target_naming(slurm_version)),
        gres_template=gres_template,
        slurm_timeout_s=cfg.hooks.command_timeout_s,
    )
    hardware = hardware_source(source, nvml_library=cfg.paths.nvml_library)
    applier = MigApplier(cfg.paths, opts, hardware.node, sys.stdout)
    node, wanted, changes = applier.plan(wanted_layout)
    if dry_run or not changes:
        return
    applier.apply(wanted, node, changes)
    click.echo(f"{node.hostname}: now matches {layout}")
