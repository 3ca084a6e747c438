"""``gpuslurm placement``: for every running GPU job on this node, are its CPUs on its GPUs' NUMA nodes?

Lists this node's running jobs with ``squeue --json`` and reads each one's ``scontrol show -d job
ID`` (or a recorded ``scontrol show -d job``, ``--input``; :mod:`gpuslurm.slurm.job_detail` says
why a recording is trusted less), maps GRES ``IDX`` (gres.conf positions) to the node's GPUs and
``CPU_IDs`` (Slurm's abstract CPU ids) to OS CPUs, and prints per job the GPUs, CPUs, NUMA nodes
on each side, whether they agree and the weakest link inside the GPU set, then a summary line.
The rows are :func:`gpuslurm.slurm.placement.placement_rows`'; this module parses and prints.
"""

from __future__ import annotations

import json
import os
import sys
from typing import TYPE_CHECKING

import click

from gpuslurm.cli.main import from_option, json_option
from gpuslurm.cli.schedulers import scheduler_for
from gpuslurm.config import load_config
from gpuslurm.errors import InputError
from gpuslurm.hw.source import hardware_source
from gpuslurm.jsondoc import document
from gpuslurm.safedir import read_regular
from gpuslurm.slurm.placement import live_jobs, placement_rows, summary

if TYPE_CHECKING:
    from gpuslurm.state.running import JobDetail


def _warn(message: str) -> None:
    click.echo(f"gpuslurm placement: {message}", err=True)


@click.command()
@from_option
@json_option
@click.option("--node", "node_name", metavar="NAME",
              help="The Slurm node name (default: $SLURMD_NODENAME, else the node's short hostname).")
@click.option("--input", "input_file", metavar="FILE",
              help="Read a recorded `scontrol show -d job` instead of running it ('-': stdin).")
def placement(source: str | None, as_json: bool, node_name: str | None, input_file: str | None) -> None:
    """For each running GPU job here: are its CPUs on its GPUs' NUMA nodes, and its weakest link."""
    node = hardware_source(source).node()
    name = node_name or os.environ.get("SLURMD_NODENAME") or node.hostname.split(".", 1)[0]
    source_text: str | tuple[JobDetail, ...]
    if input_file is None:
        cfg = load_config()
        source_text = live_jobs(scheduler_for(cfg, cfg.monitor.command_timeout_s), name)
    elif input_file == "-":
        source_text = sys.stdin.buffer.read(64 << 20).decode("utf-8", errors="replace")
    else:
        try:  # a regular file only (a FIFO would hang), bounded; job names may hold any bytes
            source_text = read_regular(input_file).decode("utf-8", errors="replace")
        except OSError as exc:
            raise InputError(f"cannot read: {exc.strerror}", source=input_file) from None
    rows = placement_rows(node, source_text, name, warn=_warn)
    if as_json:
        doc = document("placement", {"jobs": [r.as_dict() for r in rows], "summary": summary(name, rows)},
                       name)
        json.dump(doc, sys.stdout, indent=2)
        sys.stdout.write("\n")
        return
    if rows:
        click.echo(f"{'JOB':>8} {'USER':10} {'GPUS':10} {'GPU NUMA':9} {'CPUS':24} {'CPU NUMA':9} "
                   f"{'AFFINE':7} WEAKEST")
    for r in rows:
        click.echo(f"{r.job:>8} {r.user[:10]:10} {','.join(str(g.index) for g in r.gpus):10} "
                   f"{','.join(map(str, r.gpu_numa)) or '?':9} {r.cpus[:24]:24} "
                   f"{','.join(map(str, r.cpu_numa)) or '?':9} {r.numa_affine:7} "
                   f"{r.weakest_link or '-'}")
    click.echo(summary(name, rows))
