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

from gpuslurm.errors import CommandError, InputError, one_line
from gpuslurm.hw.model.node import Node
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
    admin_comment: str = ""  # set by admins and their tools only (users cannot); the user's is "comment"
    comment: str = ""  # the user's own text (end-of-job messages show it, as data)


def gpu_indices(detail: str) -> tuple[int, ...]:
    """GRES indices of every ``gpu`` entry in one ``gres_detail`` item (``gpu:a:1(IDX:0),gpu:b:1(IDX:3)``)."""
    out: list[int] = []
    for m in _IDX.finditer(detail):
        if m.group(1):
            out.extend(parse_ranges(m.group(1), MAX_GPUS))
    return tuple(out)


# What one answer may hold. A real ``squeue --json`` is a few kB per job (23.02+ about 6 kB), so
# this is room for tens of thousands of jobs; past it the document is refused before json.loads
# builds a copy several times its size. Slurm's ids and uids are 32-bit, its times 64-bit seconds.
MAX_SQUEUE_CHARS = 256 << 20
MAX_ID = 2**32 - 1
MAX_TIME = 253402300799  # 9999-12-31T23:59:59Z: the last second datetime can show
MAX_FIELD_CHARS = 1 << 16  # one string field (a name, a node list, one gres_detail item)


def _number(value: object, what: str, most: float, source: str) -> float | None:
    """A number field: None when absent or unset (23.02+: ``{"set": false}``, ``"infinite"``);
    InputError for anything but a finite number from 0 to ``most`` (JSON's ``1e999`` is inf)."""
    if isinstance(value, dict):  # 23.02+: {"set": bool, "infinite": bool, "number": n}
        if not value.get("set", True) or value.get("infinite"):
            return None
        value = value.get("number")
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= most:
        raise InputError(f"{what} is not a number from 0 to {most:.0f}: {_shown(value)}", source=source)
    return float(value)


def _text(value: object, what: str, source: str) -> str:
    """A string field ("" when absent); InputError for another type or a string past the bound."""
    if value is None:
        return ""
    if not isinstance(value, str):
        raise InputError(f"{what} is not a string: {_shown(value)}", source=source)
    if len(value) > MAX_FIELD_CHARS:
        raise InputError(f"{what} is longer than {MAX_FIELD_CHARS} characters", source=source)
    return value


def _texts(value: object, what: str, source: str) -> tuple[str, ...]:
    """A list of strings (``()`` when absent); 22.05's plain string is a list of one."""
    if value is None or isinstance(value, str):
        return (_text(value, what, source),) if value else ()
    if not isinstance(value, list):
        raise InputError(f"{what} is not a list: {_shown(value)}", source=source)
    return tuple(_text(v, what, source) for v in value)


def _shown(value: object) -> str:
    """A short description of a JSON value for a message (never its whole text: it can be nested
    a thousand deep, or be a thousand digits long)."""
    if isinstance(value, float | bool) or value is None:
        return repr(value)
    if isinstance(value, int):
        return str(value) if abs(value) < 10**20 else "a number of more than 20 digits"
    if isinstance(value, str):
        return repr(value[:40]) + ("..." if len(value) > 40 else "")
    return f"a JSON {'list' if isinstance(value, list) else 'object'}"


def _errors(doc: dict[str, Any], source: str) -> None:
    """``errors``: squeue exits 0 when it could not reach slurmctld; the reason is here."""
    errors = doc.get("errors")
    if errors is None or errors == []:
        return
    if not isinstance(errors, list):
        raise InputError(f"'errors' is not a list: {_shown(errors)}", source=source)
    first = errors[0]
    why: Any = first
    if isinstance(first, dict):
        why = first.get("error") or first.get("description")
    why = why[:200] if isinstance(why, str) and why else "an error it does not describe"
    raise CommandError(one_line(f"{source}: {why}"), ("squeue", "--json"))


def _job(item: object, source: str) -> SqueueJob:
    if not isinstance(item, dict):
        raise InputError(f"a job that is not a JSON object: {_shown(item)}", source=source)
    job_id = item.get("job_id")
    if isinstance(job_id, bool) or not isinstance(job_id, int) or not 0 < job_id <= MAX_ID:
        raise InputError(f"a job without a numeric job_id from 1 to {MAX_ID}: {_shown(job_id)}",
                         source=source)
    where = f"{source}: job {job_id}"
    uid = _number(item.get("user_id"), "user_id", MAX_ID, where)
    if uid is not None and uid != int(uid):
        raise InputError(f"user_id is not a whole number: {uid!r}", source=where)
    nodes_text = _text(item.get("nodes"), "nodes", where)
    try:
        nodes = expand_hostlist(nodes_text)
    except ValueError as exc:
        raise InputError(f"nodes: {exc}", source=where) from None
    detail = _texts(item.get("gres_detail"), "gres_detail", where)
    for d in detail:  # every reader of the job's GPUs (gpu_indices) can trust what is kept
        try:
            gpu_indices(d)
        except ValueError as exc:
            raise InputError(f"gres_detail: {exc}", source=where) from None
    user = _text(item.get("user_name"), "user_name", where)
    return SqueueJob(
        job_id=str(job_id),
        user=user or (str(int(uid)) if uid is not None else ""),
        uid=int(uid) if uid is not None else -1,
        account=_text(item.get("account"), "account", where) or None,
        state=",".join(_texts(item.get("job_state"), "job_state", where)),
        nodes=nodes,
        start=_number(item.get("start_time"), "start_time", MAX_TIME, where) or 0.0,
        gres_detail=detail,
        name=_text(item.get("name"), "name", where),
        admin_comment=_text(item.get("admin_comment"), "admin_comment", where),
        comment=_text(item.get("comment"), "comment", where),
    )


def parse_squeue_json(text: str, source: str = "squeue --json") -> tuple[SqueueJob, ...]:
    """The jobs in a ``squeue --json`` document; its ``errors`` become a CommandError, anything
    malformed (a field of the wrong type, a number out of range, a GRES index past
    :data:`~gpuslurm.ranges.MAX_GPUS`, nesting deeper than the parser's stack, a document past
    :data:`MAX_SQUEUE_CHARS`) one InputError, whatever the document holds."""
    if len(text) > MAX_SQUEUE_CHARS:
        raise InputError(f"longer than {MAX_SQUEUE_CHARS} characters", source=source)
    try:
        doc = json.loads(text)
    except ValueError as exc:  # a number past int's digit limit is one too
        raise InputError(f"not valid JSON: {exc}", source=source) from None
    except RecursionError:
        raise InputError("not valid JSON: nested deeper than the parser's stack", source=source) from None
    if not isinstance(doc, dict):
        raise InputError("not a JSON object", source=source)
    _errors(doc, source)
    jobs = doc.get("jobs")
    if not isinstance(jobs, list):
        raise InputError("no 'jobs' list", source=source)
    return tuple(_job(item, source) for item in jobs)


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


def job_name_comment(job_id: str, *, squeue: str, timeout: float) -> tuple[str, str] | None:
    """The job's name and comment (``squeue --json --jobs=ID --states=all``: the fields by name;
    slurmctld keeps an ended job for MinJobAge), or None when squeue no longer lists it."""
    listed = run_command([squeue, "--json", f"--jobs={job_id}", "--states=all"], timeout=timeout)
    found = [j for j in parse_squeue_json(listed.stdout) if j.job_id == job_id]  # 22.05 lists all
    return (found[0].name, found[0].comment) if found else None
