"""``gpuslurm placement``: for every running GPU job on this node, are its CPUs on its GPUs' NUMA nodes?

Lists this node's running jobs with ``squeue --json`` and reads each one's ``scontrol show -d job
ID`` (or a recorded ``scontrol show -d job``, ``--input``; :mod:`gpuslurm.slurm.job_detail` says
why a recording is trusted less), maps GRES ``IDX`` (gres.conf positions) to the node's GPUs and
``CPU_IDs`` (Slurm's abstract CPU ids) to OS CPUs, and prints per job the GPUs, CPUs, NUMA nodes
on each side, whether they agree and the weakest link inside the GPU set, then a summary line.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import click

from gpuslurm.cli.main import from_option, json_option
from gpuslurm.errors import CommandError, InputError

if TYPE_CHECKING:
    from gpuslurm.state.running import JobDetail

MAX_NODES_NAMED = 8  # the nodes an error names (a recording of a whole cluster is one line)


def placement_rows(node: Any, text: str | Iterable[JobDetail], node_name: str) -> list[dict[str, Any]]:
    """One row per running job holding GPUs on ``node_name``: from a recorded ``scontrol show -d
    job`` text, or from jobs already read (:func:`gpuslurm.slurm.job_detail.live_jobs`)."""
    from gpuslurm.place.quality import assess, os_cpus_of_abstract
    from gpuslurm.ranges import format_ranges
    from gpuslurm.slurm.hookenv import gres_devices
    from gpuslurm.slurm.job_detail import parse_job_detail
    from gpuslurm.topo.cores import LayoutError

    table = gres_devices(node)
    rows = []
    jobs = parse_job_detail(text) if isinstance(text, str) else tuple(text)
    for job_id in getattr(jobs, "doubtful", ()):
        click.echo(f"gpuslurm placement: job {job_id} left out: it appears twice in the scontrol "
                   "text (a job name or comment copied scontrol's layout)", err=True)
    for job in jobs:
        share = job.on(node_name)
        if job.state != "RUNNING" or share is None or not share.gpu_idx:
            continue
        bad = [i for i in share.gpu_idx if i >= len(table)]
        if bad:
            raise InputError(f"job {job.job_id}: GPU IDX {bad[0]} but {node_name} has {len(table)} "
                             "gpu GRES; is --from this node?", "scontrol show -d job")
        gpus = [node.gpu(u) for u in dict.fromkeys(table[i].gpu.uuid for i in share.gpu_idx)]
        try:
            cpus = os_cpus_of_abstract(node, share.cpu_ids)
        except LayoutError as exc:
            raise InputError(f"job {job.job_id}: CPU_IDs: {exc}", "scontrol show -d job") from None
        q = assess(node, gpus, cpus)
        rows.append({"job": job.job_id, "user": job.user, "gres_idx": list(share.gpu_idx),
                     "gpus": [{"index": g.index, "minor": g.minor, "uuid": g.uuid, "numa_node": g.numa_node}
                              for g in gpus],
                     "slurm_cpus": format_ranges(share.cpu_ids), "cpus": format_ranges(q.os_cpus),
                     "cpu_numa": list(q.cpu_numa), "gpu_numa": list(q.gpu_numa),
                     "numa_affine": q.affine, "weakest_link": q.weakest_link})
    if not rows and isinstance(text, str):  # live, squeue chose this node's jobs
        _none_here(jobs, node_name)
    return rows


def _none_here(jobs: Iterable[JobDetail], node_name: str) -> None:
    """Bad input when no running GPU job is on ``node_name`` but some are elsewhere: a recording
    of another node (or a wrong --node) would otherwise read as a node with no GPU jobs."""
    elsewhere = sorted({n for job in jobs if job.state == "RUNNING"
                        for share in job.shares if share.gpu_idx for n in share.nodes})
    if elsewhere:
        shown = ",".join(elsewhere[:MAX_NODES_NAMED])
        more = f" and {len(elsewhere) - MAX_NODES_NAMED} more" if len(elsewhere) > MAX_NODES_NAMED else ""
        raise InputError(f"no running GPU job on {node_name}; its running GPU jobs are on {shown}{more} "
                         "(name the node with --node)", "scontrol show -d job")


def _live(node_name: str) -> tuple[JobDetail, ...]:
    """This node's running jobs with their CPUs and GPUs, as the scheduler details them."""
    from gpuslurm.cli.schedulers import scheduler_for
    from gpuslurm.config import load_config

    cfg = load_config()
    scheduler = scheduler_for(cfg, cfg.monitor.command_timeout_s)
    found = scheduler.running_job_details(node_name)
    if found is None:
        raise CommandError(f"{scheduler.name} details no job's CPUs; record `scontrol show -d job` "
                           "and pass --input")
    return found


def summary(node_name: str, rows: list[dict[str, Any]]) -> str:
    counts = {k: sum(1 for r in rows if r["numa_affine"] == k) for k in ("yes", "partly", "no", "unknown")}
    links = sorted({r["weakest_link"] for r in rows if r["weakest_link"]})
    return (f"{node_name}: {len(rows)} GPU job(s); NUMA-affine {counts['yes']}, partly {counts['partly']}, "
            f"misplaced {counts['no']}, unknown {counts['unknown']}; weakest links "
            f"{', '.join(links) or '-'}")


@click.command()
@from_option
@json_option
@click.option("--node", "node_name", metavar="NAME",
              help="The Slurm node name (default: $SLURMD_NODENAME, else the node's short hostname).")
@click.option("--input", "input_file", metavar="FILE",
              help="Read a recorded `scontrol show -d job` instead of running it ('-': stdin).")
def placement(source: str | None, as_json: bool, node_name: str | None, input_file: str | None) -> None:
    """For each running GPU job here: are its CPUs on its GPUs' NUMA nodes, and its weakest link."""
    from gpuslurm.hw.source import hardware_source

    node = hardware_source(source).node()
    name = node_name or os.environ.get("SLURMD_NODENAME") or node.hostname.split(".", 1)[0]
    source_text: str | tuple[JobDetail, ...]
    if input_file is None:
        source_text = _live(name)
    elif input_file == "-":
        source_text = sys.stdin.buffer.read(64 << 20).decode("utf-8", errors="replace")
    else:
        from gpuslurm.safedir import read_regular

        try:  # a regular file only (a FIFO would hang), bounded; job names may hold any bytes
            source_text = read_regular(input_file).decode("utf-8", errors="replace")
        except OSError as exc:
            raise InputError(f"cannot read: {exc.strerror}", source=input_file) from None
    rows = placement_rows(node, source_text, name)
    if as_json:
        from gpuslurm.jsondoc import document

        doc = document("placement", {"jobs": rows, "summary": summary(name, rows)}, name)
        json.dump(doc, sys.stdout, indent=2)
        sys.stdout.write("\n")
        return
    if rows:
        click.echo(f"{'JOB':>8} {'USER':10} {'GPUS':10} {'GPU NUMA':9} {'CPUS':24} {'CPU NUMA':9} "
                   f"{'AFFINE':7} WEAKEST")
    for r in rows:
        click.echo(f"{r['job']:>8} {r['user'][:10]:10} {','.join(str(g['index']) for g in r['gpus']):10} "
                   f"{','.join(map(str, r['gpu_numa'])) or '?':9} {r['cpus'][:24]:24} "
                   f"{','.join(map(str, r['cpu_numa'])) or '?':9} {r['numa_affine']:7} "
                   f"{r['weakest_link'] or '-'}")
    click.echo(summary(name, rows))
