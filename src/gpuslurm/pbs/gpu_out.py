"""One GPU out of service on PBS: the vnode holding it publishes one GPU fewer.

PBS counts a vnode's ``ngpus`` and never names a physical GPU; gpuslurm's execjob_begin does. So a
GPU out of service (``gpuslurm gpu offline``, the monitor's ``gpu_out`` action, ``health --act``)
needs two things, both driven by the out-of-service record (:mod:`gpuslurm.state.out_of_service`):

* PBS gives the vnode's jobs one GPU fewer: its ``resources_available.ngpus`` is lowered by the GPUs
  out on it (``qmgr -c "set node V resources_available.ngpus = N"``) and its ``comment`` names them
  (``gpuslurm: out of service: index 3 (/dev/nvidia3, GPU-…): reason``). On gpuslurm's NUMA vnodes
  (``HOST[n]``) that is the NUMA node's vnode; on any other layout, the natural vnode ``HOST``.
  The vnode stays free: jobs on its other GPUs run on, new jobs are placed on what is left.
* execjob_begin never chooses a GPU in the record (:func:`gpuslurm.pbs.begin.choose`), and
  exechost_startup publishes the counts without them, so a restart of pbs_mom keeps them out.

A running job on the failed GPU is left alone, told (its ``comment``), or requeued (``qrerun``), as
``[gpu_out] job_on_gpu`` says; PBS does not stop a job when a vnode's count drops below what is
assigned. Taking out the last GPU of the host (``--force``) also takes the host offline with a
comment naming the GPUs (``pbsnodes -o``); bringing one back puts it online again, when the comment
is still gpuslurm's. :func:`reconcile` is safe to repeat: the record is the truth, and only
differences become commands. The counts and comments it sets are the planning (:func:`plan`: pure).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, NamedTuple

from gpuslurm.errors import CommandError
from gpuslurm.state.out_of_service import GPU_OUT_REASON, gpu_out_reason

if TYPE_CHECKING:
    from gpuslurm.hw.model.node import Node
    from gpuslurm.pbs.qstat import PbsNode
    from gpuslurm.samples import Allocation
    from gpuslurm.state.out_of_service import OutOfService

COMMENT_PREFIX = "gpuslurm: out of service:"
MAX_VNODE_COMMENT = 500  # qmgr keeps more; people read it in pbsnodes -av


class VnodeCount(NamedTuple):
    """What one vnode of the host should publish."""

    vnode: str
    ngpus: int  # resources_available.ngpus: its GPUs less those out of service
    total: int  # its GPUs
    out: tuple[str, ...]  # UUIDs out of service on it, sorted
    comment: str  # the comment naming them ("" when none is out)


def vnode_gpus(node: Node, host: str, numa_layout: bool) -> dict[str, tuple[str, ...]]:
    """Vnode name → the UUIDs of its whole GPUs: gpuslurm's NUMA vnodes, else the natural vnode."""
    whole = [g for g in node.gpus if not (g.mig_mode and g.mig_devices)]
    if not numa_layout:
        return {host: tuple(g.uuid for g in whole)}
    from gpuslurm.gres.pbs_vnodes import plan_vnodes

    by_minor = {g.minor: g.uuid for g in whole}
    return {f"{host}[{v.numa_node}]": tuple(by_minor[m] for m in v.gpu_minors if m in by_minor)
            for v in plan_vnodes(node)}


def out_comment(out: Mapping[str, OutOfService], uuids: Sequence[str]) -> str:
    """``gpuslurm: out of service: index 3 (/dev/nvidia3, GPU-…): reason; …`` for ``uuids``."""
    parts = [f"index {out[u].index} (/dev/nvidia{out[u].minor}, {u}): {out[u].reason}" for u in uuids]
    text = f"{COMMENT_PREFIX} {'; '.join(parts)}"
    return clean_value(text)[:MAX_VNODE_COMMENT]


def clean_value(text: str) -> str:
    """``text`` as one line that is safe inside a double-quoted qmgr value: printable, no double
    quote (qmgr ends a quoted string at the next one; ``;`` and ``#`` inside quotes are text)."""
    line = " ".join("".join(c if c.isprintable() else " " for c in text).split())
    return line.replace('"', "'")


def plan(node: Node, host: str, out: Mapping[str, OutOfService], numa_layout: bool) -> list[VnodeCount]:
    """Each vnode's count and comment with the GPUs in ``out`` taken away (pure)."""
    counts = []
    for vnode, uuids in vnode_gpus(node, host, numa_layout).items():
        gone = tuple(sorted(u for u in uuids if u in out))
        counts.append(VnodeCount(vnode, len(uuids) - len(gone), len(uuids), gone,
                                 out_comment(out, gone) if gone else ""))
    return counts


def startup_counts(node: Node, host: str, out: Mapping[str, OutOfService]) -> dict[str, int]:
    """exechost_startup: each NUMA vnode's ``ngpus`` without the GPUs out of service."""
    return {c.vnode: c.ngpus for c in plan(node, host, out, numa_layout=True)}


class PbsGpuOut(NamedTuple):
    """The commands :func:`reconcile` runs, as callables (a test passes its own)."""

    read_vnodes: Callable[[], Sequence[PbsNode]]  # pbsnodes -av -F json
    qmgr: Callable[[str], None]  # one qmgr -c directive
    offline: Callable[[str, str], None]  # pbsnodes -o -C COMMENT HOST
    online: Callable[[str], None]  # pbsnodes -r HOST
    allocations: Callable[[], Sequence[Allocation]]  # the running jobs here and their GPUs
    notify: Callable[[str, str], None]  # a running job's comment
    requeue: Callable[[str, str], str]  # qrerun (qdel when it cannot be rerun)
    job_on_gpu: str = "leave"  # leave | notify | requeue


def reconcile(node: Node, host: str, out: Mapping[str, OutOfService], cmds: PbsGpuOut,
              log: Callable[[str], None] | None = None) -> str:
    """Bring PBS's vnodes of ``host`` to the record ``out``; one line saying where they stand."""
    say = log or (lambda _line: None)
    mine = [v for v in cmds.read_vnodes() if v.host == host or v.name == host
            or v.name.startswith(host + "[")]
    current = {v.name: v for v in mine}
    numa_layout = any(name.startswith(host + "[") for name in current)
    counts = plan(node, host, out, numa_layout)
    for c in counts:
        have = current.get(c.vnode)
        if have is None:
            say(f"vnode {c.vnode} is not known to PBS: its GPU count is left alone")
            continue
        if have.ngpus != c.ngpus:
            cmds.qmgr(f"set node {c.vnode} resources_available.ngpus = {c.ngpus}")
            say(f"vnode {c.vnode}: resources_available.ngpus {have.ngpus} -> {c.ngpus}")
        if c.comment and have.comment != c.comment and (not have.comment or _ours(have.comment)):
            cmds.qmgr(f'set node {c.vnode} comment = "{c.comment}"')
        elif not c.comment and _ours(have.comment):
            cmds.qmgr(f"unset node {c.vnode} comment")
    left = sum(c.ngpus for c in counts)
    natural = current.get(host)
    gone = {u: r for u, r in out.items() if any(u in c.out for c in counts)}
    if natural is not None:
        offline = "offline" in natural.states
        if left == 0 and gone and not offline:
            cmds.offline(host, gpu_out_reason(sum(c.total for c in counts), gone))
            say(f"{host} offline: no GPU left in service")
        elif left > 0 and offline and natural.comment.startswith(GPU_OUT_REASON):
            cmds.online(host)
            say(f"{host} online: {left} GPU(s) in service again")
    if cmds.job_on_gpu != "leave" and gone:
        _jobs_on_gpus(cmds, gone, say)
    shown = ", ".join(f"{c.vnode} ngpus {c.ngpus} of {c.total}" for c in counts if c.vnode in current)
    return f"PBS vnodes of {host}: {shown or 'none known'}" + (
        f"; {len(gone)} GPU(s) out of service" if gone else "")


def _ours(comment: str) -> bool:
    return comment.startswith(COMMENT_PREFIX)


def _jobs_on_gpus(cmds: PbsGpuOut, gone: Mapping[str, OutOfService], say: Callable[[str], None]) -> None:
    """``job_on_gpu``: tell each running job on a GPU out of service, or requeue it."""
    lower = {u.lower(): u for u in gone}
    for alloc in cmds.allocations():
        hit = sorted(lower[u.lower()] for u in alloc.uuids if u.lower() in lower)
        if not hit:
            continue
        why = f"gpuslurm: GPU {hit[0]} of this job is out of service: {gone[hit[0]].reason}"
        try:
            if cmds.job_on_gpu == "requeue":
                say(f"job {alloc.job_id}: {cmds.requeue(alloc.job_id, why)}: {why}")
            else:
                cmds.notify(alloc.job_id, why)
                say(f"job {alloc.job_id} told: {why}")
        except CommandError as exc:  # it may have ended meanwhile; the next call sees
            say(f"job {alloc.job_id}: {exc}")
