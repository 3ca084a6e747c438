"""A job's device, in scheduler-neutral terms: the physical GPU and the MIG device if any.

Slurm's hook adapter (:mod:`gpuslurm.slurm.hookenv`) resolves them from its environment; the job
map, device isolation and the hooks use them whatever the scheduler.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

if TYPE_CHECKING:  # both kinds of node, never loaded here: see gpuslurm.hw.identity
    from gpuslurm.hw.identity import AnyGpu, AnyMig


class JobDevice(NamedTuple):
    """One GPU or MIG device given to a job: its physical GPU, and the MIG device if any.

    The GPU and MIG device are the model's (from a ``Node``) or the hooks' light identities (from
    a ``NodeIdentity``), whichever the node given to :func:`resolve_job_gpus` holds.
    """

    gpu: AnyGpu
    mig: AnyMig | None = None
    gres_index: int | None = None  # position among the node's gpu GRES, when known

    @property
    def uuid(self) -> str:
        """The device's UUID; a MIG device without one is named ``MIG-<gpu uuid>/<gi>/<ci>``,
        the form CUDA accepted before MIG UUIDs existed."""
        if self.mig is None:
            return self.gpu.uuid
        return self.mig.uuid or f"MIG-{self.gpu.uuid}/{self.mig.gi_id}/{self.mig.ci_id}"

    @property
    def minor(self) -> int:
        """The minor of the physical GPU's ``/dev/nvidia<minor>`` (a MIG device's parent)."""
        return self.gpu.minor

    @property
    def device_files(self) -> tuple[str, ...]:
        """Device files the job needs; ValueError for a MIG device with unknown cap minors."""
        if self.mig is None:
            return (self.gpu.device_file,)
        return self.mig.device_files(self.gpu.minor)
