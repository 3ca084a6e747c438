"""A job as the hooks see it, whatever the scheduler: :class:`HookJob`, its GPUs and devices.

A scheduler adapter (:mod:`gpuslurm.slurm.hookenv` for Slurm's hook environment, :mod:`gpuslurm.pbs`
for PBS's event objects) turns its own input into a :class:`HookJob`; the neutral steps in
:mod:`gpuslurm.hooks` (health gate, isolation, MPS, job map, leftovers, summary) take only that.
"""

from __future__ import annotations

from gpuslurm.errors import InputError
from gpuslurm.tuples import TYPE_CHECKING, NamedTuple

if TYPE_CHECKING:
    from gpuslurm.hw.model.node import Gpu, MigDevice, Node


class JobDevice(NamedTuple):
    """One GPU or MIG device given to a job: its physical GPU, and the MIG device if any.

    The GPU and MIG device are the model's (from a ``Node``) or the hooks' light identities (from
    a ``NodeIdentity``), whichever the node given to :func:`resolve_devices` holds.
    """

    gpu: Gpu
    mig: MigDevice | None = None
    gres_index: int | None = None  # position in node_devices() order (Slurm's GRES index), when known

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


class GpuClaim(NamedTuple):
    """Which of the node's devices the scheduler gave a job, as it names them.

    ``uuids`` (``GPU-…``, ``MIG-…`` or the old ``MIG-GPU-<uuid>/<gi>/<ci>``) win when given;
    otherwise ``indices`` are positions in :func:`node_devices` order (Slurm's GRES indices).
    ``source`` names where they came from (a variable, a PBS attribute) for error messages.
    """

    indices: tuple[int, ...] = ()
    uuids: tuple[str, ...] = ()
    source: str = "the scheduler"


class HookJob(NamedTuple):
    """What every job hook needs to know about the job, in the scheduler's own words."""

    scheduler: str  # "slurm", "pbs"
    job_id: str  # validated by the adapter (gpuslurm.jobid)
    uid: int
    user: str
    node_name: str  # the scheduler's name for this node (drain/offline, summaries)
    gpus: GpuClaim | None = None  # None: the job has no GPUs on this node
    gid: int | None = None  # primary group; None: the user's, from the password database
    account: str | None = None  # for --by account reports
    start: float | None = None  # when the scheduler says the job started, if it does
    comment: str | None = None  # free text the user gave (Slurm --comment)
    features: str | None = None  # node features the job asked for (Slurm --constraint)
    mps_share: str | None = None  # the job's MPS share, where the scheduler counts one
    sluid: str | None = None  # Slurm 25.11+: the job's SLUID (SLURM_JOB_SLUID), validated


def node_devices(node: Node) -> tuple[JobDevice, ...]:
    """The node's devices in bus order, a MIG-mode GPU contributing its MIG devices (none if it has
    no instances): gres.conf's ``Name=gpu`` order, so position ``i`` is Slurm's GRES index ``i``."""
    devices: list[JobDevice] = []
    gpus: tuple[Gpu, ...] = node.gpus
    for gpu in sorted(gpus, key=lambda g: g.bus_id):
        for mig in gpu.mig_devices if gpu.mig_mode else (None,):
            devices.append(JobDevice(gpu, mig, len(devices)))
    return tuple(devices)


def resolve_devices(claim: GpuClaim, node: Node) -> tuple[JobDevice, ...]:
    """The devices of ``claim`` on ``node``, in the claim's order, repeats dropped.

    An index out of range or an unknown UUID is an InputError naming ``claim.source``.
    """
    if claim.uuids:
        found = [_by_uuid(item, node, claim.source) for item in claim.uuids]
    else:
        table = node_devices(node)
        found = []
        for i in claim.indices:
            if i >= len(table):
                span = f"0-{len(table) - 1}" if table else "none"
                raise InputError(f"GPU index {i} is out of range: node {node.hostname} has "
                                 f"{len(table)} gpu GRES ({span})", source=claim.source)
            found.append(table[i])
    seen: set[str] = set()
    unique = []
    for dev in found:
        if dev.uuid not in seen:
            seen.add(dev.uuid)
            unique.append(dev)
    return tuple(unique)


def is_uuid(item: str) -> bool:
    """Whether ``item`` names a device by UUID (``GPU-…``, ``MIG-…``) rather than by number."""
    return item.startswith(("GPU-", "MIG-"))


def _by_uuid(item: str, node: Node, source: str) -> JobDevice:
    table = node_devices(node)
    wanted = item.lower()
    for dev in table:
        if dev.uuid.lower() == wanted:
            return dev
        if dev.mig is not None and f"mig-{dev.gpu.uuid}/{dev.mig.gi_id}/{dev.mig.ci_id}".lower() == wanted:
            return dev
    for gpu in node.gpus:  # a whole GPU named by UUID, even one in MIG mode
        if gpu.uuid.lower() == wanted:
            return JobDevice(gpu)
    raise InputError(f"no GPU or MIG device with UUID {item} on node {node.hostname}", source=source)
