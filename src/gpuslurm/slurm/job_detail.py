"""Parse ``scontrol show -d job`` (Slurm 22.05): each running job's CPUs and GPU indices per node (pure).

The detail lines (``-d``) name, per node, ``CPU_IDs`` — Slurm's *abstract* CPU ids on that node
(cores numbered socket by socket in hwloc's logical order, each core's threads in turn: id =
core × threads_per_core + thread), not OS CPU ids — and the GRES with ``IDX``, the positions of
the devices in the node's gres.conf, not NVML indices or minors::

     Nodes=gpu01 CPU_IDs=0-3 Mem=0 GRES=gpu:nvidia_h100:2(IDX:0-1)
"""

from __future__ import annotations

import re
from typing import NamedTuple

from gpuslurm.errors import InputError
from gpuslurm.ranges import MAX_CPUS, MAX_GPUS, parse_ranges
from gpuslurm.topo.hostlist import expand_hostlist

_FIELD_RE = re.compile(r"(?:^|\s)(JobId|UserId|JobState|Nodes|CPU_IDs|GRES)=(\S*)")
_GPU_IDX_RE = re.compile(r"(?:^|,)gpu(?::[^:(),]+)?(?::\d+)?\(IDX:([^)]*)\)")


class NodeShare(NamedTuple):
    """What one job holds on some nodes: abstract CPU ids and gres.conf positions of its GPUs."""

    nodes: tuple[str, ...]
    cpu_ids: tuple[int, ...]
    gpu_idx: tuple[int, ...]


class JobDetail(NamedTuple):
    job_id: str
    user: str
    state: str
    shares: tuple[NodeShare, ...]

    def on(self, node: str) -> NodeShare | None:
        """The job's share of ``node``, or None when it has none there."""
        return next((s for s in self.shares if node in s.nodes), None)


def parse_job_detail(text: str, source: str = "scontrol show -d job") -> tuple[JobDetail, ...]:
    """Every job in ``text``; a detail line that does not parse is an InputError naming the job."""
    jobs: list[JobDetail] = []
    current: dict[str, str] = {}
    shares: list[NodeShare] = []

    def close() -> None:
        if current.get("JobId"):
            jobs.append(JobDetail(current["JobId"], current.get("UserId", "").split("(", 1)[0],
                                  current.get("JobState", ""), tuple(shares)))

    for line in text.splitlines():
        fields = dict(_FIELD_RE.findall(line))
        if "JobId" in fields:
            close()
            current, shares = {}, []
        if "Nodes" in fields and "CPU_IDs" in fields:
            shares.append(_share(fields, current.get("JobId", "?"), source))
            continue
        for key in ("JobId", "UserId", "JobState"):
            if key in fields:
                current[key] = fields[key]
    close()
    return tuple(jobs)


def _share(fields: dict[str, str], job: str, source: str) -> NodeShare:
    try:
        nodes = expand_hostlist(fields["Nodes"])
        cpus = parse_ranges(fields["CPU_IDs"], MAX_CPUS) if fields["CPU_IDs"] not in ("", "N/A") else ()
        idx: tuple[int, ...] = ()
        for m in _GPU_IDX_RE.finditer(fields.get("GRES", "")):
            if m.group(1) not in ("", "N/A"):
                idx += parse_ranges(m.group(1), MAX_GPUS)
    except ValueError as exc:
        raise InputError(f"job {job}: cannot read its detail line: {exc}", source) from None
    return NodeShare(nodes, cpus, tuple(sorted(set(idx))))
