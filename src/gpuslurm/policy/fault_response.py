"""The one fault response: faults and the node's GPUs in service in, one decision per GPU out (pure).

The Slurm prolog, PBS's execjob_begin and classic prologue, the monitor and ``gpuslurm health
--act`` act on what :func:`respond` decides; they differ only in how they carry it out (Slurm
drains the node, PBS takes a vnode offline; the prolog requeues its job). For each GPU that has a
fault, in the node's order (NVML's, bus order), the first rule that applies decides:

1. the GPU is out of service already: ``log`` (no job is given it; its fault must not drain the
   node again, nor take a PBS vnode offline);
2. the fault names no GPU of the node (a GPU NVML lost before the node was read, ``index:N``):
   it cannot be recorded out of service, so any action but ``log`` is ``drain``;
3. a fault with action ``drain``: ``drain``;
4. a fault with action ``gpu_out``: ``take_out``, unless it would leave the node no GPU in
   service: taking out the last GPU is an admin's decision (``gpuslurm gpu offline --force``),
   never a passing fault's, so that GPU is ``drain`` instead (``last_in_service``). When several
   GPUs would go, all go but the last of them in the node's order;
5. otherwise (only ``log`` faults): ``log``.

A decision carries all of its GPU's faults; :attr:`GpuResponse.acted` are those it acts on (the
drain reason and the out-of-service record name them), the rest are the caller's to log.
"""

from __future__ import annotations

from gpuslurm.tuples import TYPE_CHECKING, NamedTuple

if TYPE_CHECKING:
    from collections.abc import Collection, Iterable, Sequence

    from gpuslurm.hw.model.node import Gpu
    from gpuslurm.policy.health import Fault
    from gpuslurm.state.out_of_service import OutOfService

TAKE_OUT = "take_out"
DRAIN = "drain"
LOG = "log"
RESPONSES = (TAKE_OUT, DRAIN, LOG)

# why a GPU got its response
BY_ACTION = "action"  # its faults' configured action
LAST_IN_SERVICE = "last_in_service"  # gpu_out, but it is the last GPU in service: drain instead
UNNAMED = "unnamed"  # no GPU of the node by that UUID: cannot be recorded, drain instead
ALREADY_OUT = "already_out"  # out of service already: logged only
UNRECORDED = "unrecorded"  # gpu_out, but the record could not be written: drain instead


class GpuResponse(NamedTuple):
    """What is done about one GPU's faults."""

    uuid: str  # the faults' UUID (``index:N`` for a GPU that could not be named)
    response: str  # one of RESPONSES
    why: str  # BY_ACTION, LAST_IN_SERVICE, UNNAMED, ALREADY_OUT or UNRECORDED
    faults: tuple[Fault, ...]  # every fault of this GPU, in the order found
    gpu: Gpu | None = None  # None: the node has no GPU of that UUID

    @property
    def acted(self) -> tuple[Fault, ...]:
        """The faults the response acts on: those whose action is not ``log`` (for ``log``: all)."""
        if self.response == LOG:
            return self.faults
        return tuple(f for f in self.faults if f.action != "log")

    @property
    def reason(self) -> str:
        """Why, in a line: the messages of the faults acted on."""
        return "; ".join(dict.fromkeys(f.message for f in self.acted))


class FaultResponse(NamedTuple):
    """One decision per GPU with a fault, in the node's order (unnamed GPUs last)."""

    decisions: tuple[GpuResponse, ...]

    def of(self, response: str) -> tuple[GpuResponse, ...]:
        return tuple(d for d in self.decisions if d.response == response)

    @property
    def take_outs(self) -> tuple[GpuResponse, ...]:
        return self.of(TAKE_OUT)

    @property
    def drains(self) -> tuple[GpuResponse, ...]:
        return self.of(DRAIN)

    @property
    def drain_faults(self) -> list[Fault]:
        """The faults a drain reason names (:func:`gpuslurm.policy.health.drain_reason`)."""
        return [f for d in self.drains for f in d.acted]

    def unrecorded(self) -> FaultResponse:
        """The response when the out-of-service record cannot be written: each GPU to take out is
        drained for instead (a fault is never left without its action)."""
        return FaultResponse(tuple(d._replace(response=DRAIN, why=UNRECORDED) if d.response == TAKE_OUT
                                   else d for d in self.decisions))

    def out_records(self, by: str, now: float) -> dict[str, OutOfService]:
        """The out-of-service records of the GPUs taken out (``by``: who, ``now``: when)."""
        from gpuslurm.state.out_of_service import OutOfService, clean_reason

        return {d.gpu.uuid: OutOfService(d.gpu.uuid, clean_reason(d.reason) or "no reason given", now, by,
                                         d.gpu.index, d.gpu.minor)
                for d in self.take_outs if d.gpu is not None}


def respond(faults: Iterable[Fault], gpus: Sequence[Gpu], out: Collection[str]) -> FaultResponse:
    """The decision for each GPU with a fault (module docstring): ``gpus`` are the node's GPUs in
    its order, ``out`` the UUIDs out of service (compared without case)."""
    gone = {u.lower() for u in out}
    by_uuid: dict[str, list[Fault]] = {}
    for fault in faults:
        by_uuid.setdefault(fault.uuid, []).append(fault)
    decisions: list[GpuResponse] = []
    taking: list[GpuResponse] = []
    for gpu in gpus:
        mine = by_uuid.pop(gpu.uuid, None)
        if not mine:
            continue
        actions = {f.action for f in mine}
        if gpu.uuid.lower() in gone:
            decisions.append(GpuResponse(gpu.uuid, LOG, ALREADY_OUT, tuple(mine), gpu))
        elif "drain" in actions:
            decisions.append(GpuResponse(gpu.uuid, DRAIN, BY_ACTION, tuple(mine), gpu))
        elif "gpu_out" in actions:
            taking.append(GpuResponse(gpu.uuid, TAKE_OUT, BY_ACTION, tuple(mine), gpu))
            decisions.append(taking[-1])
        else:
            decisions.append(GpuResponse(gpu.uuid, LOG, BY_ACTION, tuple(mine), gpu))
    in_service = sum(1 for g in gpus if g.uuid.lower() not in gone)
    if taking and len(taking) >= in_service:  # the last GPU in service stays, and the node drains
        last = taking[-1]
        decisions[decisions.index(last)] = last._replace(response=DRAIN, why=LAST_IN_SERVICE)
    for uuid, mine in by_uuid.items():  # named by no GPU of the node
        acts = any(f.action != "log" for f in mine)
        decisions.append(GpuResponse(uuid, DRAIN if acts else LOG, UNNAMED if acts else BY_ACTION,
                                     tuple(mine)))
    return FaultResponse(tuple(decisions))
