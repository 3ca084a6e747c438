"""One GPU out of service on Slurm 22.05 without losing the node for good: the graceful path.

Slurm has no per-GPU drain, and 22.05 cannot shrink a node's GPUs while jobs hold GPUs there.
Measured in the test cluster (docs/health.md): ``scontrol update NodeName=… Gres=gpu:…:7`` is
refused ("Invalid generic resource (gres) specification") for GPUs tied to device files, before
and after gres.conf changes; a gres.conf with one line fewer makes slurmctld set the node
``INVAL+DRAIN`` ("gres/gpu count reported lower than configured (7 < 8)") on the next
registration, even with ``SlurmdParameters=config_overrides``, and that survives restarts of both
daemons; removing a line renumbers the GRES indices of running jobs. What slurmctld accepts is
the node's ``Gres=`` in slurm.conf and gres.conf changed together, then ``scontrol reconfigure``.
So, as ``mig apply`` does:

1. Drain the node for new jobs, the reason naming the GPU (``gpuslurm: GPU out: index 3
   (/dev/nvidia3, GPU-…): Xid 79 …; resumes with 7 GPUs when its jobs end``). Running jobs go on.
2. Once no job runs on the node: write gres.conf without the out-of-service GPUs and the node's
   ``Gres=`` in ``[gpu_out] slurm_conf`` (the cluster's slurm.conf, or a file it includes that
   holds this node's line), both atomically; ``scontrol reconfigure``; resume.
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

from gpuslurm.errors import InputError
from gpuslurm.gres.records import GresOptions
from gpuslurm.runner import run_command
from gpuslurm.slurm.mig_apply import busy_jobs, is_drained, node_field, write_atomic
from gpuslurm.slurm.scontrol import check_node_name, clean_reason

if TYPE_CHECKING:
    from gpuslurm.hw.model import Node
    from gpuslurm.state.out_of_service import OutOfService

REASON_PREFIX = "gpuslurm: GPU out"  # state.out_of_service.GPU_OUT_REASON
COMMENT_PREFIX = "gpuslurm: out of service:"
_GPU_COUNT = re.compile(r"(?:^|,)gpu(?::[^:,(]+)?:(\d+)")


class GpuOutOptions(NamedTuple):
    node_name: str
    scontrol: str = "/usr/bin/scontrol"
    squeue: str = "/usr/bin/squeue"
    gres_conf: Path | None = None  # regenerate this file; None: leave the node drained for an admin
    slurm_conf: Path | None = None  # the file with this node's NodeName= line (its Gres= is rewritten)
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
    from gpuslurm.state.out_of_service import gpu_out_reason

    present = {g.uuid for g in node.gpus}
    return gpu_out_reason(len(node.gpus), {u: r for u, r in out.items() if u in present})


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
    if not drained or not reason.startswith(new_reason):  # Slurm appends " [user@time]"
        _scontrol(opts, "update", f"NodeName={name}", "State=DRAIN", f"Reason={new_reason}")
    if want == 0 or opts.gres_conf is None or opts.slurm_conf is None:
        why = "no GPU left" if want == 0 else "[gpu_out] gres_conf and slurm_conf are not both set"
        return f"{name}: drained ({why})"
    jobs = busy_jobs(run_command([opts.squeue, "-h", "-w", name, "-o", "%i %T"],
                                 timeout=opts.timeout_s).stdout)
    if jobs:
        return f"{name}: drained; waiting for jobs {','.join(jobs)} to end"
    kept = without_gpus(node, set(gone))
    conf_text = _read(opts.slurm_conf)
    new_conf = set_node_gres(conf_text, name, _summary(kept, opts), str(opts.slurm_conf))
    _regenerate(kept, opts)
    if new_conf != conf_text:
        write_atomic(opts.slurm_conf, new_conf, _mode(opts.slurm_conf))
    _scontrol(opts, "reconfigure")
    _scontrol(opts, "update", f"NodeName={name}", "State=RESUME")
    return f"{name}: gres.conf and Gres= now without {len(gone)} GPU(s); resumed with {want} GPUs"


def set_node_gres(conf: str, node_name: str, gres: str, source: str) -> str:
    """``conf`` with the GPU part of ``Gres=`` on ``NodeName=<node_name>``'s line set to ``gres``.

    Other gres of the line (``nic:2``) are kept. Exactly one line must name the node alone: a
    line for a node range cannot change for one node, and that is bad input.
    """
    lines = conf.splitlines(keepends=True)
    found = [i for i, line in enumerate(lines) if _names_node(line, node_name)]
    if len(found) != 1:
        why = "no line" if not found else f"{len(found)} lines"
        raise InputError(f"{why} with NodeName={node_name} alone (a node range cannot change for "
                         "one node)", source)
    i = found[0]
    line = lines[i]
    end = line[len(line.rstrip("\r\n")):]
    words = line.rstrip("\r\n").split()
    ours = {"gpu", "mps", "shard"}
    for j, word in enumerate(words):
        if word.lower().startswith("gres="):
            others = [p for p in word[5:].split(",") if p and p.split(":")[0] not in ours]
            words[j] = "Gres=" + ",".join([gres, *others])
            break
    else:
        words.append(f"Gres={gres}")
    lines[i] = " ".join(words) + end
    return "".join(lines)


def _names_node(line: str, node_name: str) -> bool:
    words = line.split()
    return bool(words) and words[0].lower() == f"nodename={node_name.lower()}"


def _read(path: Path) -> str:
    from gpuslurm.safedir import read_regular_text

    try:
        return read_regular_text(str(path), 1 << 22)
    except (OSError, ValueError) as exc:
        raise InputError(f"cannot read: {getattr(exc, 'strerror', None) or exc}", path) from None


def _mode(path: Path) -> int:
    import os
    import stat

    return stat.S_IMODE(os.stat(path).st_mode)


def _summary(node: Node, opts: GpuOutOptions) -> str:
    from gpuslurm.gres.records import plan_gres
    from gpuslurm.gres.render import gres_summary

    return gres_summary(plan_gres(node, opts.gres))


def _regenerate(kept: Node, opts: GpuOutOptions) -> None:
    from gpuslurm.gres.records import plan_gres
    from gpuslurm.gres.render import render_plan

    assert opts.gres_conf is not None
    write_atomic(opts.gres_conf, render_plan(kept, plan_gres(kept, opts.gres), opts.gres, None))


def _set_comment(opts: GpuOutOptions, name: str, current: str, wanted: str) -> None:
    if current == wanted or (not wanted and not current.startswith(COMMENT_PREFIX)):
        return  # a comment of someone else's is left alone when nothing is out
    if current and not current.startswith(COMMENT_PREFIX) and current != "(null)":
        return
    _scontrol(opts, "update", f"NodeName={name}", f"Comment={wanted}")


def _scontrol(opts: GpuOutOptions, *args: str) -> str:
    return run_command([opts.scontrol, *args], timeout=opts.timeout_s).stdout
