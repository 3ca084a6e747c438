"""One GPU out of service on Slurm 22.05 without losing the node for good: the graceful path.

Slurm has no per-GPU drain, and 22.05 offers no way to shrink a node's GPU count while jobs hold
GPUs on it (``scontrol update Gres=`` refuses a count tied to device files unless it is 0, and
removing a gres.conf line renumbers the GRES indices of running jobs). So, as ``mig apply`` does:

1. Drain the node for new jobs, the reason naming the GPU (``gpuslurm: GPU out: index 3
   (/dev/nvidia3, GPU-…): Xid 79 …; resumes with 7 GPUs when its jobs end``). Running jobs go on.
2. Once no job runs on the node: write gres.conf without the out-of-service GPUs (atomically),
   ``scontrol reconfigure``, set the node's ``Gres=`` to the remaining count, resume.
3. The node's ``Comment`` names the GPUs out while it serves the rest, so ``scontrol show node``
   shows them after the drain is gone (``sinfo -R`` lists only drained and down nodes).

:func:`reconcile` does whichever step is due and is safe to call every monitor cycle, after a
restart of anything: the out-of-service record is the truth, Slurm is brought to it. A node
drained by someone else (another reason) is never resumed here. Taking the last GPU out leaves the
node drained (no zero-GPU gres.conf is written: a GPU node without GPUs takes no GPU jobs).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

from gpuslurm.errors import CommandError
from gpuslurm.gres.records import GresOptions
from gpuslurm.runner import run_command
from gpuslurm.slurm.mig_apply import busy_jobs, is_drained, node_field, write_atomic
from gpuslurm.slurm.scontrol import check_node_name, clean_reason

if TYPE_CHECKING:
    from gpuslurm.hw.model import Node
    from gpuslurm.state.out_of_service import OutOfService

REASON_PREFIX = "gpuslurm: GPU out"
COMMENT_PREFIX = "gpuslurm: out of service:"
_GPU_COUNT = re.compile(r"(?:^|,)gpu(?::[^:,(]+)?:(\d+)")


class GpuOutOptions(NamedTuple):
    node_name: str
    scontrol: str = "/usr/bin/scontrol"
    squeue: str = "/usr/bin/squeue"
    gres_conf: Path | None = None  # regenerate this file; None: leave the node drained for an admin
    gres: GresOptions = GresOptions()
    timeout_s: float = 10.0


def without_gpus(node: Node, out: set[str]) -> Node:
    """``node`` with the GPUs in ``out`` removed (and their rows and columns of the link matrix)."""
    keep = [i for i, g in enumerate(node.gpus) if g.uuid not in out]
    links = None if node.links is None else tuple(tuple(node.links[i][j] for j in keep) for i in keep)
    return dataclasses.replace(node, gpus=tuple(node.gpus[i] for i in keep), links=links)


def gres_gpu_count(gres: str) -> int | None:
    """The GPU count in a node's ``Gres=`` (``gpu:h100:7(S:0-1),mps:700``); None when none is named."""
    found = _GPU_COUNT.findall(gres)
    return sum(int(n) for n in found) if found else None


def drain_reason(node: Node, out: Mapping[str, OutOfService]) -> str:
    left = len(node.gpus) - len([u for u in out if any(g.uuid == u for g in node.gpus)])
    parts = [f"index {r.index} (/dev/nvidia{r.minor}, {u}): {r.reason}" for u, r in sorted(out.items())]
    tail = f"resumes with {left} GPUs when its jobs end" if left else "no GPU left in service"
    return clean_reason(f"{REASON_PREFIX}: {'; '.join(parts)}; {tail}")


def comment(out: Mapping[str, OutOfService]) -> str:
    if not out:
        return ""
    return clean_reason(COMMENT_PREFIX + " " + "; ".join(
        f"GPU index {r.index} ({u}) {r.reason}" for u, r in sorted(out.items())))


def reconcile(node: Node, out: Mapping[str, OutOfService], opts: GpuOutOptions) -> str:
    """Bring Slurm to the record (see the module doc); one line saying where the node stands."""
    name = check_node_name(opts.node_name)
    present = {g.uuid for g in node.gpus}
    gone = {u: r for u, r in out.items() if u in present}
    want = len(node.gpus) - len(gone)
    shown = _scontrol(opts, "-o", "show", "node", name)
    state, reason = node_field(shown, "State"), node_field(shown, "Reason")
    have = gres_gpu_count(node_field(shown, "Gres"))
    ours = reason.startswith(REASON_PREFIX)
    drained = is_drained(state)
    _set_comment(opts, name, node_field(shown, "Comment"), comment(gone))
    if have == want:
        if drained and ours:
            _scontrol(opts, "update", f"NodeName={name}", "State=RESUME")
            return f"{name}: resumed with {want} GPUs"
        return f"{name}: {want} GPUs in service" + (" (drained by someone else)" if drained else "")
    if drained and not ours:
        return f"{name}: drained by someone else ({reason}); GPU count left at {have}"
    new_reason = drain_reason(node, gone)
    if not drained or reason != new_reason:
        _scontrol(opts, "update", f"NodeName={name}", "State=DRAIN", f"Reason={new_reason}")
    if want == 0 or opts.gres_conf is None:
        why = "no GPU left" if want == 0 else "no gres_conf configured to regenerate"
        return f"{name}: drained ({why})"
    jobs = busy_jobs(run_command([opts.squeue, "-h", "-w", name, "-o", "%i %T"],
                                 timeout=opts.timeout_s).stdout)
    if jobs:
        return f"{name}: drained; waiting for jobs {','.join(jobs)} to end"
    _regenerate(node, set(gone), opts)
    _scontrol(opts, "reconfigure")
    _scontrol(opts, "update", f"NodeName={name}", f"Gres={_summary(without_gpus(node, set(gone)), opts)}")
    _scontrol(opts, "update", f"NodeName={name}", "State=RESUME")
    return f"{name}: gres.conf rewritten without {len(gone)} GPU(s); resumed with {want} GPUs"


def _summary(node: Node, opts: GpuOutOptions) -> str:
    from gpuslurm.gres.records import plan_gres
    from gpuslurm.gres.render import gres_summary

    return gres_summary(plan_gres(node, opts.gres))


def _regenerate(node: Node, gone: set[str], opts: GpuOutOptions) -> None:
    from gpuslurm.gres.records import plan_gres
    from gpuslurm.gres.render import render_plan

    assert opts.gres_conf is not None
    kept = without_gpus(node, gone)
    write_atomic(opts.gres_conf, render_plan(kept, plan_gres(kept, opts.gres), opts.gres, None))


def _set_comment(opts: GpuOutOptions, name: str, current: str, wanted: str) -> None:
    if current == wanted or (not wanted and not current.startswith(COMMENT_PREFIX)):
        return  # a comment of someone else's is left alone when nothing is out
    if current and not current.startswith(COMMENT_PREFIX) and current != "(null)":
        return
    _scontrol(opts, "update", f"NodeName={name}", f"Comment={wanted}")


def _scontrol(opts: GpuOutOptions, *args: str) -> str:
    try:
        return run_command([opts.scontrol, *args], timeout=opts.timeout_s).stdout
    except CommandError:
        raise
