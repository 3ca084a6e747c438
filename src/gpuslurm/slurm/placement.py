"""``gpuslurm placement``'s use case: for every running GPU job on a node, are its CPUs on its GPUs'
NUMA nodes, and what is the weakest link inside its GPU set.

Slurm's facts, hence slurm/: GRES ``IDX`` (gres.conf positions, :func:`gpuslurm.slurm.hookenv.gres_devices`)
and ``CPU_IDs`` (Slurm's abstract CPU ids) from ``scontrol show -d job`` (a recording, or the jobs
the Scheduler adapter details); :func:`gpuslurm.place.quality.assess` judges each job (pure).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, NamedTuple

from gpuslurm.errors import CommandError, InputError

if TYPE_CHECKING:
    from gpuslurm.hw.model.node import Gpu, Node
    from gpuslurm.state.running import JobDetail
    from gpuslurm.state.scheduler import Scheduler

MAX_NODES_NAMED = 8  # the nodes an error names (a recording of a whole cluster is one line)


class JobPlacement(NamedTuple):
    """One running job's GPUs and CPUs on the node, and how well they sit together."""

    job: str
    user: str
    gres_idx: tuple[int, ...]
    gpus: tuple[Gpu, ...]
    slurm_cpus: str  # Slurm's abstract CPU ids, as ranges
    cpus: str  # the OS CPUs they are, as ranges
    cpu_numa: tuple[int, ...]
    gpu_numa: tuple[int, ...]
    numa_affine: str  # yes, partly, no, unknown
    weakest_link: str | None  # None for one GPU

    def as_dict(self) -> dict[str, object]:
        """The ``placement --json`` row."""
        return {"job": self.job, "user": self.user, "gres_idx": list(self.gres_idx),
                "gpus": [{"index": g.index, "minor": g.minor, "uuid": g.uuid, "numa_node": g.numa_node}
                         for g in self.gpus],
                "slurm_cpus": self.slurm_cpus, "cpus": self.cpus, "cpu_numa": list(self.cpu_numa),
                "gpu_numa": list(self.gpu_numa), "numa_affine": self.numa_affine,
                "weakest_link": self.weakest_link}


def placement_rows(node: Node, text: str | Iterable[JobDetail], node_name: str,
                   warn: Callable[[str], None] = lambda message: None) -> list[JobPlacement]:
    """One row per running job holding GPUs on ``node_name``: from a recorded ``scontrol show -d
    job`` text, or from jobs already read (:meth:`Scheduler.running_job_details`). InputError for a
    recording that does not fit the node."""
    from gpuslurm.place.quality import assess, os_cpus_of_abstract
    from gpuslurm.ranges import format_ranges
    from gpuslurm.slurm.hookenv import gres_devices
    from gpuslurm.slurm.job_detail import parse_job_detail
    from gpuslurm.topo.cores import LayoutError

    table = gres_devices(node)
    rows = []
    jobs = parse_job_detail(text) if isinstance(text, str) else tuple(text)
    for job_id in getattr(jobs, "doubtful", ()):
        warn(f"job {job_id} left out: it appears twice in the scontrol text (a job name or comment "
             "copied scontrol's layout)")
    for job in jobs:
        share = job.on(node_name)
        if job.state != "RUNNING" or share is None or not share.gpu_idx:
            continue
        bad = [i for i in share.gpu_idx if i >= len(table)]
        if bad:
            raise InputError(f"job {job.job_id}: GPU IDX {bad[0]} but {node_name} has {len(table)} "
                             "gpu GRES; is --from this node?", "scontrol show -d job")
        # table rows hold the node's own Gpu values (load_node gives a Node, not identities)
        gpus = [node.gpu(u) for u in dict.fromkeys(table[i].gpu.uuid for i in share.gpu_idx)]
        try:
            cpus = os_cpus_of_abstract(node, share.cpu_ids)
        except LayoutError as exc:
            raise InputError(f"job {job.job_id}: CPU_IDs: {exc}", "scontrol show -d job") from None
        q = assess(node, gpus, cpus)
        rows.append(JobPlacement(job.job_id, job.user, tuple(share.gpu_idx), tuple(gpus),
                                 format_ranges(share.cpu_ids), format_ranges(q.os_cpus), tuple(q.cpu_numa),
                                 tuple(q.gpu_numa), q.affine, q.weakest_link))
    if not rows and isinstance(text, str):  # live, squeue chose this node's jobs
        _none_here(jobs, node_name)
    return rows


def _none_here(jobs: Iterable[JobDetail], node_name: str) -> None:
    """Bad input when no running GPU job is on ``node_name`` but some are elsewhere: a recording
    of another node (or a wrong --node) would otherwise read as a node with no GPU jobs."""
    elsewhere = sorted({n for job in jobs if job.state == "RUNNING"
                        for share in job.shares if share.gpu_idx for n in share.nodes})
    if elsewhere:
        shown = ",".join(elsewhere[:MAX_NODES_NAMED])
        more = f" and {len(elsewhere) - MAX_NODES_NAMED} more" if len(elsewhere) > MAX_NODES_NAMED else ""
        raise InputError(f"no running GPU job on {node_name}; its running GPU jobs are on {shown}{more} "
                         "(name the node with --node)", "scontrol show -d job")


def live_jobs(scheduler: Scheduler, node_name: str) -> tuple[JobDetail, ...]:
    """This node's running jobs with their CPUs and GPUs, as ``scheduler`` details them;
    CommandError for a scheduler that details none."""
    found = scheduler.running_job_details(node_name)
    if found is None:
        raise CommandError(f"{scheduler.name} details no job's CPUs; record `scontrol show -d job` "
                           "and pass --input")
    return found


def summary(node_name: str, rows: Iterable[JobPlacement]) -> str:
    """The last line: how many jobs sit NUMA-affine, partly, misplaced, unknown; the weakest links."""
    rows = list(rows)
    counts = {k: sum(1 for r in rows if r.numa_affine == k) for k in ("yes", "partly", "no", "unknown")}
    links = sorted({r.weakest_link for r in rows if r.weakest_link})
    return (f"{node_name}: {len(rows)} GPU job(s); NUMA-affine {counts['yes']}, partly {counts['partly']}, "
            f"misplaced {counts['no']}, unknown {counts['unknown']}; weakest links "
            f"{', '.join(links) or '-'}")
