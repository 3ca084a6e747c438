"""One GPU out of service on Slurm 22.05 while the node keeps serving its other GPUs: holder jobs.

Slurm has no per-GPU drain, and 22.05 cannot shrink a node's GPUs while it runs. Measured in the
test cluster (docs/health.md): ``scontrol update NodeName=… Gres=gpu:…:7`` is refused for GPUs with
device files; a gres.conf with one line fewer drains the node (``INVAL``, "gres/gpu count reported
lower than configured (7 < 8)"), even with the node's ``Gres=`` in slurm.conf changed as well and
``scontrol reconfigure`` ("Attempt to change gres/gpu Count … invalid with File configuration"):
only a restart of slurmctld takes a new count, and removing a line renumbers the GRES indices of
running jobs.

So gpuslurm leaves Slurm's GPU count alone and gives the failed GPU to a job of its own: a
*holder*, ``sleep`` as root with one GPU, one CPU and a little memory, named
``gpuslurm-gpu-out-<node>`` with the Comment ``gpuslurm:gpu-out-holder`` (the prolog lets root's
job with that Comment through without a health gate). Slurm cannot be told which GPU a job gets,
so when the failed GPU is free gpuslurm submits one holder per free GPU of the node, waits for
them to start, keeps the one Slurm put on the failed GPU and cancels the others: a few seconds.
New jobs never get the failed GPU; the node takes jobs all along; running jobs are not touched.
While a job still runs on the failed GPU its GPU is taken when that job ends (or at once when
``[gpu_out] job_on_gpu = "requeue"``). A job that lands on the failed GPU in between is requeued
by the prolog. The holder survives restarts of slurmctld and slurmd (a running job does); if it
ends (a partition time limit, a reboot), :func:`reconcile` submits a new one. A holder is root's
job of that name: any user can give a job the name, never the owner.

:func:`reconcile` is safe to call every monitor cycle: the out-of-service record is the truth. The
node's ``Comment`` names the GPUs out, so ``scontrol show node`` shows them (``sinfo -R`` lists only
drained and down nodes). Taking the last GPU out drains the node instead (a GPU node without a GPU
should not take GPU jobs); a node the prolog drained for a GPU out (``gpuslurm: GPU out: …``) is
resumed before the holders are submitted (they could not start on it).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, NamedTuple

from gpuslurm.errors import CommandError
from gpuslurm.runner import run_command
from gpuslurm.slurm.mig_apply import is_drained, node_field
from gpuslurm.slurm.scontrol import check_node_name, clean_reason
from gpuslurm.state.out_of_service import GPU_OUT_REASON, HOLDER_COMMENT, gpu_out_reason, holder_name

if TYPE_CHECKING:
    from gpuslurm.hw.model.node import Node
    from gpuslurm.slurm.squeue import JobGpus
    from gpuslurm.state.out_of_service import OutOfService

COMMENT_PREFIX = "gpuslurm: out of service:"


class GpuOutOptions(NamedTuple):
    node_name: str
    scontrol: str = "/usr/bin/scontrol"
    squeue: str = "/usr/bin/squeue"
    sbatch: str = "/usr/bin/sbatch"
    scancel: str = "/usr/bin/scancel"
    timeout_s: float = 10.0
    start_wait_s: float = 20.0  # how long holders may take to start
    holder_mem_mib: int = 64
    job_on_gpu: str = "leave"  # leave | notify | requeue


def comment(out: Mapping[str, OutOfService]) -> str:
    if not out:
        return ""
    return clean_reason(COMMENT_PREFIX + " " + "; ".join(
        f"GPU index {r.index} ({u}) {r.reason}" for u, r in sorted(out.items())))


def reconcile(node: Node, out: Mapping[str, OutOfService], opts: GpuOutOptions,
              sleep: Callable[[float], None] = time.sleep) -> str:
    """Bring Slurm to the record (see the module doc); one line saying where the node stands."""
    name = check_node_name(opts.node_name)
    present = {g.uuid for g in node.gpus}
    gone = {u: r for u, r in out.items() if u in present}
    shown = _scontrol(opts, "-o", "show", "node", name)
    state, reason = node_field(shown, "State"), node_field(shown, "Reason")
    _set_comment(opts, name, node_field(shown, "Comment"), comment(gone))
    if gone and len(gone) == len(node.gpus):
        new_reason = gpu_out_reason(len(node.gpus), gone)
        if not reason.startswith(new_reason):  # Slurm appends " [user@time]"
            _scontrol(opts, "update", f"NodeName={name}", "State=DRAIN", f"Reason={new_reason}")
        return f"{name}: drained (no GPU left in service)"
    if is_drained(state) and reason.startswith(GPU_OUT_REASON):
        # the prolog's guard until a holder is in place: holders cannot start on a drained node,
        # and a job the failed GPU is given meanwhile is requeued by the prolog
        _scontrol(opts, "update", f"NodeName={name}", "State=RESUME")
    jobs = _jobs(node, opts)
    holder = holder_name(name)
    held: dict[str, str] = {}
    for job in jobs:
        if not _is_holder(job, holder):
            continue
        uuid = job.uuids[0] if len(job.uuids) == 1 else ""
        if uuid in gone and uuid not in held:
            held[uuid] = job.job.job_id
        else:  # on a GPU back in service, or a second one: give the GPU back
            _scancel(opts, job.job.job_id)
    busy = {u: j.job.job_id for j in jobs if not _is_holder(j, holder) for u in j.uuids}
    missing = [u for u in gone if u not in held]
    waiting = {u: busy[u] for u in missing if u in busy}
    if waiting and opts.job_on_gpu != "leave":
        _job_on_gpu(opts, waiting, gone)
    if len(waiting) < len(missing):
        held.update(_take(node, opts, {u for u in missing if u not in waiting}, busy, held, sleep))
    left = len(node.gpus) - len(gone)
    parts = [f"{name}: {left} of {len(node.gpus)} GPUs in service"]
    if held:
        parts.append(f"held out by job(s) {','.join(held[u] for u in sorted(held))}")
    if still := [u for u in gone if u not in held]:
        parts.append(f"{len(still)} GPU(s) out not held yet" +
                     (f" (in use by job(s) {','.join(sorted(set(waiting.values())))})" if waiting else ""))
    return "; ".join(parts)


def _take(node: Node, opts: GpuOutOptions, wanted: set[str], busy: Mapping[str, str],
          held: Mapping[str, str], sleep: Callable[[float], None] = time.sleep) -> dict[str, str]:
    """Submit one holder per free GPU, keep those Slurm put on ``wanted`` GPUs, cancel the rest."""
    name = opts.node_name
    free = [g.uuid for g in node.gpus if g.uuid not in busy and g.uuid not in held]
    submitted = [_submit(opts) for _ in free]
    deadline = time.monotonic() + opts.start_wait_s
    kept: dict[str, str] = {}
    while True:
        running = {j.job.job_id: j for j in _jobs(node, opts) if _is_holder(j, holder_name(name))}
        if all(s in running for s in submitted) or time.monotonic() >= deadline:
            break
        sleep(0.5)
    for job_id in submitted:
        job = running.get(job_id)
        uuid = job.uuids[0] if job is not None and len(job.uuids) == 1 else ""
        if uuid in wanted and uuid not in kept:
            kept[uuid] = job_id
        else:
            _scancel(opts, job_id)  # pending, or on a GPU in service
    return kept


def _submit(opts: GpuOutOptions) -> str:
    out = run_command([opts.sbatch, "--parsable", f"--job-name={holder_name(opts.node_name)}",
                       f"--nodelist={opts.node_name}", "--nodes=1", "--ntasks=1", "--cpus-per-task=1",
                       "--gres=gpu:1", f"--mem={opts.holder_mem_mib}M", f"--comment={HOLDER_COMMENT}",
                       "--output=/dev/null", "--no-requeue", "--chdir=/",
                       "--wrap=exec /bin/sleep 2147483647"], timeout=opts.timeout_s).stdout
    return out.strip().split(";")[0]


def _job_on_gpu(opts: GpuOutOptions, waiting: Mapping[str, str], gone: Mapping[str, OutOfService]) -> None:
    """``job_on_gpu``: tell the job on a failed GPU (its AdminComment), or requeue it."""
    from gpuslurm.slurm.scontrol import requeue_job, set_own_admin_comment

    for uuid, job_id in sorted(waiting.items()):
        why = f"gpuslurm: GPU {uuid} of this job is out of service: {gone[uuid].reason}"
        try:
            if opts.job_on_gpu == "requeue":
                requeue_job(job_id, why, scontrol=opts.scontrol, scancel=opts.scancel, timeout=opts.timeout_s)
            else:
                set_own_admin_comment(job_id, why, squeue=opts.squeue, scontrol=opts.scontrol,
                                      timeout=opts.timeout_s)
        except CommandError:
            continue  # it may have ended meanwhile; the next call sees


def _is_holder(job: JobGpus, holder: str) -> bool:
    """Root's job of the holder's name: any user may name a job so, and root would then scancel it
    (or count it as the holder and let the failed GPU go back to jobs when it ends)."""
    return job.job.name == holder and job.job.uid == 0


def _jobs(node: Node, opts: GpuOutOptions) -> tuple[JobGpus, ...]:
    from gpuslurm.slurm.squeue import node_allocations

    return node_allocations(opts.squeue, opts.node_name, node, timeout=opts.timeout_s)


def _scancel(opts: GpuOutOptions, job_id: str) -> None:
    run_command([opts.scancel, job_id], timeout=opts.timeout_s, check=False)


def _set_comment(opts: GpuOutOptions, name: str, current: str, wanted: str) -> None:
    if current == "(null)":
        current = ""
    if current == wanted or (current and not current.startswith(COMMENT_PREFIX)):
        return  # a comment of someone else's is left alone
    _scontrol(opts, "update", f"NodeName={name}", f"Comment={wanted}")


def _scontrol(opts: GpuOutOptions, *args: str) -> str:
    return run_command([opts.scontrol, *args], timeout=opts.timeout_s).stdout
