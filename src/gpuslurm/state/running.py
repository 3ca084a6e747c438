"""A running job's CPUs and GPUs per node, as a scheduler details them (the placement check's input).

Slurm fills these from ``scontrol show -d job`` (:mod:`gpuslurm.slurm.job_detail`); a scheduler
with no such detail gives none (:meth:`gpuslurm.state.scheduler.Scheduler.running_job_details`).
"""

from __future__ import annotations

from typing import NamedTuple


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
        """The job's share of ``node``; None when it has none there, or when its lines for the
        node disagree (a forged detail line beside Slurm's own)."""
        found = {s[1:] for s in self.shares if node in s.nodes}
        if len(found) != 1:
            return None
        cpus, idx = found.pop()
        return NodeShare((node,), cpus, idx)
