"""What the neutral core asks of a scheduler, as a small interface the adapters implement.

watch/, report/ and the live view never import a scheduler's commands: the CLI builds an adapter
(:class:`gpuslurm.slurm.adapter.SlurmScheduler`; PBS's later) and passes it in. A test passes a
stand-in.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from gpuslurm.hw.model import Node
    from gpuslurm.samples import Allocation


class Scheduler(Protocol):
    """One scheduler's view of, and actions on, this node."""

    name: str  # "slurm", "pbs"

    def node_allocations(self, node_name: str, node: Node) -> tuple[Allocation, ...]:
        """The running jobs holding GPUs on ``node_name``, as the scheduler lists them."""
        ...

    def drain_node(self, node_name: str, reason: str) -> None:
        """Take ``node_name`` out of service with ``reason`` (drain / offline)."""
        ...

    def resume_node(self, node_name: str) -> None:
        """Put ``node_name`` back into service."""
        ...

    def refuse_job(self, job_id: str, reason: str) -> str:
        """Keep ``job_id`` from running on this node for ``reason`` its user can read, without taking
        the node out of service (Slurm: requeue-hold with a Comment, else cancel); what was done."""
        ...

    def set_admin_comment(self, job_id: str, text: str) -> None:
        """Attach ``text`` to the running job where admins and accounting see it."""
        ...

    def set_final_comment(self, job_id: str, text: str) -> str:
        """Attach ``text`` to ``job_id`` as it ends (the epilog's summary line), wherever this
        scheduler still takes it; what was done, for the log. GpuslurmError when it failed."""
        ...
