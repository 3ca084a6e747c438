"""A node's GPU identities as light tuples: what the hooks need, without :mod:`gpuslurm.hw.model`.

``NodeIdentity``, ``GpuIdentity`` and ``MigIdentity`` carry the facts the prolog, epilog and task
prolog use (UUIDs, NVML index, ``/dev/nvidia`` minor, bus id, NUMA node and CPU affinity, MIG
devices with their capability minors), under the same attribute names as ``Node``, ``Gpu`` and
``MigDevice``, so the hook-path functions take either (``AnyNode``, ``AnyGpu``, ``AnyMig``).
They were made when the model's types were dataclasses (whose import alone cost a hook about as
long as an interpreter start); the model is NamedTuples now, and these remain the hooks' cache
format (:mod:`gpuslurm.hooks.cache`).

``identity_of`` converts a full ``Node``; ``to_json``/``from_json`` are the cache's format.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, NamedTuple

from gpuslurm.hw.devfiles import mig_device_files
from gpuslurm.hw.strict import as_int, as_text, opt_bool, opt_int

if TYPE_CHECKING:
    from gpuslurm.hw.model import Gpu, MigDevice, Node


class MigIdentity(NamedTuple):
    """A MIG device as the hooks know it (see ``MigDevice``)."""

    index: int  # type: ignore[assignment]  # MigDevice's name; shadows tuple.index on purpose
    gi_id: int
    ci_id: int
    uuid: str | None = None
    gi_minor: int | None = None
    ci_minor: int | None = None

    def device_files(self, parent_minor: int) -> tuple[str, ...]:
        return mig_device_files(parent_minor, self.gi_minor, self.ci_minor)


class GpuIdentity(NamedTuple):
    """A physical GPU as the hooks know it (see ``Gpu``)."""

    uuid: str
    index: int  # type: ignore[assignment]  # Gpu's name; shadows tuple.index on purpose
    minor: int
    bus_id: str
    numa_node: int | None = None
    cpu_affinity: tuple[int, ...] = ()
    mig_mode: bool | None = None
    mig_devices: tuple[MigIdentity, ...] = ()

    @property
    def device_file(self) -> str:
        return f"/dev/nvidia{self.minor}"


class NodeIdentity(NamedTuple):
    """A node's GPUs in index order; ``source`` as in ``Node.source``."""

    hostname: str
    gpus: tuple[GpuIdentity, ...]
    source: str = ""


if TYPE_CHECKING:  # for annotations only: what the hook-path functions accept
    from typing import TypeAlias

    AnyNode: TypeAlias = Node | NodeIdentity
    AnyGpu: TypeAlias = Gpu | GpuIdentity
    AnyMig: TypeAlias = MigDevice | MigIdentity


def identity_of(node: AnyNode) -> NodeIdentity:
    """The identities of ``node``'s GPUs."""
    return NodeIdentity(node.hostname, tuple(
        GpuIdentity(g.uuid, g.index, g.minor, g.bus_id, g.numa_node, tuple(g.cpu_affinity), g.mig_mode,
                    tuple(MigIdentity(m.index, m.gi_id, m.ci_id, m.uuid, m.gi_minor, m.ci_minor)
                          for m in g.mig_devices))
        for g in node.gpus), node.source)


def to_json(node: NodeIdentity) -> dict[str, Any]:
    """A JSON-ready dict (lists for tuples)."""
    return {"hostname": node.hostname, "source": node.source,
            "gpus": [[g.uuid, g.index, g.minor, g.bus_id, g.numa_node, list(g.cpu_affinity), g.mig_mode,
                      [list(m) for m in g.mig_devices]] for g in node.gpus]}


def from_json(doc: Any) -> NodeIdentity:
    """The inverse of ``to_json``; ValueError (or TypeError) when ``doc`` is not one."""
    gpus = []
    for uuid, index, minor, bus_id, numa, cpus, mig_mode, migs in doc["gpus"]:
        gpu = GpuIdentity(as_text(uuid), as_int(index), as_int(minor), as_text(bus_id), opt_int(numa),
                          tuple(as_int(c) for c in cpus), opt_bool(mig_mode),
                          tuple(_mig(m) for m in migs))
        gpus.append(gpu)
    return NodeIdentity(as_text(doc["hostname"]), tuple(gpus), as_text(doc["source"]))


def _mig(item: Any) -> MigIdentity:
    index, gi_id, ci_id, uuid, gi_minor, ci_minor = item
    return MigIdentity(as_int(index), as_int(gi_id), as_int(ci_id), None if uuid is None else as_text(uuid),
                       opt_int(gi_minor), opt_int(ci_minor))


