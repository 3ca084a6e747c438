"""Parse ``scontrol show -d job`` (Slurm 22.05): each running job's CPUs and GPU indices per node (pure).

The detail lines (``-d``) name, per node, ``CPU_IDs`` — Slurm's *abstract* CPU ids on that node
(cores numbered socket by socket in hwloc's logical order, each core's threads in turn: id =
core × threads_per_core + thread), not OS CPU ids — and the GRES with ``IDX``, the positions of
the devices in the node's gres.conf, not NVML indices or minors::

     Nodes=gpu01 CPU_IDs=0-3 Mem=0 GRES=gpu:nvidia_h100:2(IDX:0-1)

The text holds what users wrote, verbatim: a job name or comment may contain ``JobId=``, and
Slurm 22.05 keeps newlines in both, so a user can write whole lines in scontrol's own layout.
So fields are read only where scontrol puts them — a job starts at a line beginning ``JobId=N``,
``UserId=``/``JobState=`` are the first word of their indented line, a detail line must match
scontrol's format whole — and a job id seen twice is ambiguous: both copies are left out
(:attr:`JobDetails.doubtful`) rather than guessed between. Forged lines can still fabricate a
job in a recording; the live command trusts only jobs ``squeue --json`` lists and reads each with
its own ``scontrol show -d job ID`` (:func:`one_job_share`), where other users' text cannot reach.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

from gpuslurm.errors import InputError
from gpuslurm.ranges import MAX_CPUS, MAX_GPUS, parse_ranges
from gpuslurm.state.running import JobDetail, NodeShare
from gpuslurm.topo.hostlist import expand_hostlist

if TYPE_CHECKING:
    from gpuslurm.slurm.squeue import SqueueJob

_START_RE = re.compile(r"JobId=(\d{1,20})(?:\s|$)")  # at column 0 only (match, not search)
_FIRST_RE = re.compile(r" {3}(UserId|JobState)=(\S*)")  # the first word of an indented line
_DETAIL_RE = re.compile(r" {5}Nodes=(\S+) CPU_IDs=(\S*) Mem=\d+ GRES=(\S*)\s*")
_GPU_IDX_RE = re.compile(r"(?:^|,)gpu(?::[^:(),]+)?(?::\d+)?\(IDX:([^)]*)\)")


class JobDetails(tuple[JobDetail, ...]):
    """The jobs of one ``scontrol show -d job`` text, and the ids left out as ambiguous."""

    doubtful: tuple[str, ...] = ()


def parse_job_detail(text: str, source: str = "scontrol show -d job") -> JobDetails:
    """Every job in ``text`` once; a detail line that does not parse is an InputError naming the job."""
    records: list[tuple[str, list[str]]] = []
    for line in text.splitlines():
        start = _START_RE.match(line)
        if start is not None:
            records.append((start.group(1), []))
        elif records:
            records[-1][1].append(line)
    seen: dict[str, int] = {}
    for job_id, _ in records:
        seen[job_id] = seen.get(job_id, 0) + 1
    jobs = [_job(job_id, lines, source) for job_id, lines in records if seen[job_id] == 1]
    out = JobDetails(j for j in jobs if j is not None)
    out.doubtful = tuple(sorted({*(j for j, k in seen.items() if k > 1),
                                 *(job_id for (job_id, _), j in zip(
                                     (r for r in records if seen[r[0]] == 1), jobs, strict=True)
                                   if j is None)}, key=int))
    return out


def one_job_share(text: str, job_id: str, node: str, source: str) -> NodeShare | None:
    """From ``scontrol show -d job JOB_ID``'s output: that job's share of ``node``, or None when
    the text does not say it unambiguously (the job's own name or comment forged lines)."""
    records = parse_job_detail(text, source)
    first = records[0] if records else None
    if first is None or first.job_id != job_id or job_id in records.doubtful:
        return None
    return first.on(node)


def _job(job_id: str, lines: list[str], source: str) -> JobDetail | None:
    """The job of one record; None when its own lines contradict each other (two different
    ``UserId=`` or ``JobState=`` lines: one was written by the job's name or comment)."""
    fields: dict[str, set[str]] = {}
    shares: list[NodeShare] = []
    for line in lines:
        detail = _DETAIL_RE.fullmatch(line)
        if detail is not None:
            nodes_text, cpus_text, gres = detail.groups()
            shares.append(_share(nodes_text, cpus_text, gres, job_id, source))
            continue
        first = _FIRST_RE.match(line)
        if first is not None:
            fields.setdefault(first.group(1), set()).add(first.group(2))
    if any(len(values) > 1 for values in fields.values()):
        return None
    user = next(iter(fields.get("UserId", {""})))
    return JobDetail(job_id, user.split("(", 1)[0], next(iter(fields.get("JobState", {""}))),
                     tuple(shares))


def _share(nodes_text: str, cpus_text: str, gres: str, job: str, source: str) -> NodeShare:
    try:
        nodes = expand_hostlist(nodes_text)
        cpus = parse_ranges(cpus_text, MAX_CPUS) if cpus_text not in ("", "N/A") else ()
        idx: tuple[int, ...] = ()
        for m in _GPU_IDX_RE.finditer(gres):
            if m.group(1) not in ("", "N/A"):
                idx += parse_ranges(m.group(1), MAX_GPUS)
    except ValueError as exc:
        raise InputError(f"job {job}: cannot read its detail line: {exc}", source) from None
    return NodeShare(nodes, cpus, tuple(sorted(set(idx))))


def live_jobs(squeue_jobs: Iterable[SqueueJob], node: str,
              job_text: Callable[[str], str]) -> tuple[JobDetail, ...]:
    """The running jobs on ``node`` as ``squeue --json`` lists them (id, user, GPU IDX: structured
    values, never text a user wrote), each with the CPUs its own ``scontrol show -d job ID``
    (``job_text(ID)``) gives for the node; no CPUs when that text is ambiguous or names other
    GPUs than squeue does."""
    from gpuslurm.slurm.squeue import gpu_indices

    out: list[JobDetail] = []
    for job in squeue_jobs:
        if "RUNNING" not in job.state.split(",") or node not in job.nodes:
            continue
        pos = job.nodes.index(node)
        idx = tuple(sorted(set(gpu_indices(job.gres_detail[pos] if pos < len(job.gres_detail) else ""))))
        share = one_job_share(job_text(job.job_id), job.job_id, node, f"scontrol show -d job {job.job_id}")
        cpus = share.cpu_ids if share is not None and share.gpu_idx == idx else ()
        out.append(JobDetail(job.job_id, job.user, "RUNNING", (NodeShare((node,), cpus, idx),)))
    return tuple(out)
