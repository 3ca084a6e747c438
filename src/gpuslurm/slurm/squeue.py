"""``squeue --json``: the running jobs on a node and the GPUs Slurm gave them.

The monitor uses this only for jobs the prolog left no map for. ``squeue`` exits 0 even when it
could not reach slurmctld; the reason is in the document's ``errors`` array, so that is read.
Slurm 22.05 gives plain values (``"job_state": "RUNNING"``, ``"start_time": 1700000000``); 23.02
and later wrap them (``["RUNNING"]``, ``{"set": true, "number": …}``): both are read.
A job's GPUs are in ``gres_detail``, one entry per node of the job in node-list order, such as
``gpu:h100:2(IDX:0-1)``; IDX is Slurm's GRES index, which :func:`gres_devices` turns into UUIDs.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any, NamedTuple

from gpuslurm.errors import CommandError, InputError
from gpuslurm.hw.model import Node
from gpuslurm.ranges import MAX_GPUS, parse_ranges
from gpuslurm.runner import run_command
from gpuslurm.topo.hostlist import expand_hostlist

_IDX = re.compile(r"\bgpu(?::[^(,]*)?\(IDX:([0-9,\-]*)\)")


class SqueueJob(NamedTuple):
    job_id: str
    user: str
    uid: int
    account: str | None
    state: str
    nodes: tuple[str, ...]
    start: float
    gres_detail: tuple[str, ...]
    name: str = ""  # the job's name (gpu_out finds its holder jobs by it)


def gpu_indices(detail: str) -> tuple[int, ...]:
    """GRES indices of every ``gpu`` entry in one ``gres_detail`` item (``gpu:a:1(IDX:0),gpu:b:1(IDX:3)``)."""
    out: list[int] = []
    for m in _IDX.finditer(detail):
        if m.group(1):
            out.extend(parse_ranges(m.group(1), MAX_GPUS))
    return tuple(out)


def _number(value: Any) -> float | None:
    if isinstance(value, dict):  # 23.02+: {"set": bool, "infinite": bool, "number": n}
        if not value.get("set", True) or value.get("infinite"):
            return None
        value = value.get("number")
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


def _state(value: Any) -> str:
    if isinstance(value, list):
        return ",".join(str(v) for v in value)
    return str(value or "")


def parse_squeue_json(text: str, source: str = "squeue --json") -> tuple[SqueueJob, ...]:
    """The jobs in a ``squeue --json`` document; its ``errors`` become a CommandError."""
    try:
        doc = json.loads(text)
    except ValueError as exc:
        raise InputError(f"not valid JSON: {exc}", source=source) from None
    if not isinstance(doc, dict):
        raise InputError("not a JSON object", source=source)
    errors = doc.get("errors") or []
    if errors:
        first = errors[0]
        why = first.get("error") or first.get("description") if isinstance(first, dict) else first
        raise CommandError(f"{source}: {why}", ("squeue", "--json"))
    jobs = doc.get("jobs")
    if not isinstance(jobs, list):
        raise InputError("no 'jobs' list", source=source)
    out: list[SqueueJob] = []
    for item in jobs:
        if not isinstance(item, dict) or not isinstance(item.get("job_id"), int):
            raise InputError("a job without a numeric job_id", source=source)
        uid = _number(item.get("user_id"))
        detail = item.get("gres_detail") or []
        try:
            nodes = expand_hostlist(str(item.get("nodes") or ""))
        except ValueError as exc:
            raise InputError(str(exc), source=source) from None
        out.append(SqueueJob(
            job_id=str(item["job_id"]),
            user=str(item.get("user_name") or (int(uid) if uid is not None else "")),
            uid=int(uid) if uid is not None else -1,
            account=str(item["account"]) if item.get("account") else None,
            state=_state(item.get("job_state")),
            nodes=nodes,
            start=_number(item.get("start_time")) or 0.0,
            gres_detail=tuple(str(d) for d in detail) if isinstance(detail, list) else (),
            name=str(item.get("name") or ""),
        ))
    return tuple(out)


class JobGpus(NamedTuple):
    """A running job on this node and the UUIDs of the GPUs (or MIG devices) it holds here."""

    job: SqueueJob
    uuids: tuple[str, ...]


def allocations_on(jobs: Sequence[SqueueJob], node_name: str, node: Node) -> tuple[JobGpus, ...]:
    """The running jobs on ``node_name``; GRES indices become this node's UUIDs."""
    from gpuslurm.slurm.hookenv import gres_devices

    table = gres_devices(node)
    out: list[JobGpus] = []
    for job in jobs:
        if "RUNNING" not in job.state.split(",") or node_name not in job.nodes:
            continue
        pos = job.nodes.index(node_name)
        detail = job.gres_detail[pos] if pos < len(job.gres_detail) else ""
        uuids = tuple(table[i].uuid for i in gpu_indices(detail) if i < len(table))
        out.append(JobGpus(job, uuids))
    return tuple(out)


def node_allocations(squeue: str, node_name: str, node: Node, *, timeout: float,
                     env: dict[str, str] | None = None) -> tuple[JobGpus, ...]:
    """Run ``squeue --json`` and return the running jobs on ``node_name`` with their GPUs.

    ``--nodelist``/``--states`` narrow the answer where Slurm honours them with ``--json``
    (23.02+); 22.05 ignores them, so the filter is applied here as well.
    """
    result = run_command([squeue, "--json", f"--nodelist={node_name}", "--states=RUNNING"],
                         timeout=timeout, env=env)
    return allocations_on(parse_squeue_json(result.stdout), node_name, node)
