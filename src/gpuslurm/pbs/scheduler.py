"""PBS behind :class:`gpuslurm.state.scheduler.Scheduler`: qstat for the jobs on a node, pbsnodes to
take it offline and back, qhold/qrerun/qdel to refuse a job, qalter for a job's comment.

PBS counts a job's ``ngpus`` but does not choose which physical GPUs it gets; gpuslurm's
``execjob_begin`` hook does and writes the job map. So a job's GPUs come from its map; without one,
from ``exec_vnode`` only when the job holds every GPU of a NUMA vnode (``gpuslurm pbs-conf``'s
layout), else they are unknown (an empty tuple).
"""

from __future__ import annotations

import os
import pwd
from typing import TYPE_CHECKING

from gpuslurm.errors import CommandError, GpuslurmError
from gpuslurm.names import check_node_name
from gpuslurm.pbs.facts import PbsJobFacts
from gpuslurm.pbs.qstat import PbsJob, parse_qstat_json
from gpuslurm.runner import run_command
from gpuslurm.samples import Allocation

if TYPE_CHECKING:
    from collections.abc import Mapping

    from gpuslurm.config import Config, GpuOutConfig
    from gpuslurm.hw.model.node import Node
    from gpuslurm.pbs.qstat import PbsNode
    from gpuslurm.state.out_of_service import OutOfService

MAX_COMMENT = 1000  # a job's comment: PBS keeps longer strings, but qstat -f is read by people
MAX_NODE_COMMENT = 79  # pbsnodes -C keeps 79 characters (snprintf(Comment, 80, ...) in pbsnodes.c)


def clean_comment(text: str, limit: int = MAX_COMMENT) -> str:
    """``text`` as one printable line of at most ``limit`` characters (a node's or job's comment)."""
    line = " ".join("".join(c if c.isprintable() else " " for c in text).split())
    return line if len(line) <= limit else line[: limit - 3] + "..."


def check_pbs_job_id(job_id: str) -> str:
    """``job_id`` if it is a PBS job id (``123.server``, ``123[4].server``); InputError else."""
    from gpuslurm.jobid import check_job_id

    check_job_id(job_id)
    if "." not in job_id:  # a bare number would reach PBS as "the job of the default server"
        from gpuslurm.errors import InputError

        raise InputError(f"not a PBS job id (no server part): {job_id!r}", source="job id")
    return job_id


def vnode_gpus(job: PbsJob, host: str, node: Node) -> tuple[str, ...]:
    """The UUIDs of the GPUs ``exec_vnode`` pins down for ``job`` on ``host``: those of each NUMA
    vnode ``host[n]`` whose GPUs the job holds all of; empty when any share leaves a choice."""
    from gpuslurm.gres.pbs_vnodes import plan_vnodes

    try:
        minors = {v.numa_node: v.gpu_minors for v in plan_vnodes(node)}
    except GpuslurmError:
        return ()
    by_minor = {g.minor: g.uuid for g in node.gpus}
    out: list[str] = []
    for share in job.vnodes_on(host):
        count = share.count("ngpus")
        if not count:
            continue
        _, bracket, index = share.vnode.partition("[")
        held = tuple(by_minor) if not bracket else minors.get(int(index[:-1]), ())
        if count != len(held):
            return ()
        out.extend(by_minor[m] for m in held if m in by_minor)
    return tuple(dict.fromkeys(out))


def _uid(user: str) -> int:
    try:
        return pwd.getpwnam(user).pw_uid
    except (KeyError, ValueError):
        return -1


class PbsScheduler(PbsJobFacts):
    """PBS's commands (absolute paths from ``[paths]``), each bounded by ``timeout`` seconds."""

    name = "pbs"

    def __init__(self, *, qstat: str = "/opt/pbs/bin/qstat", pbsnodes: str = "/opt/pbs/bin/pbsnodes",
                 timeout: float = 10.0, jobs_dir: str | None = None,
                 qalter: str = "/opt/pbs/bin/qalter", qhold: str = "/opt/pbs/bin/qhold",
                 qrerun: str = "/opt/pbs/bin/qrerun", qdel: str = "/opt/pbs/bin/qdel",
                 qmgr: str = "/opt/pbs/bin/qmgr", gpu_out: GpuOutConfig | None = None) -> None:
        self.qstat = qstat
        self.qmgr = qmgr
        self.gpu_out = gpu_out
        self.pbsnodes = pbsnodes
        self.qalter = qalter
        self.qhold = qhold
        self.qrerun = qrerun
        self.qdel = qdel
        self.timeout = timeout
        self.jobs_dir = jobs_dir
        self._sessions: dict[int, str] = {}  # the last answer's session id → job id, on this node

    def why_no_job_list(self) -> str | None:
        """None when qstat is there to run; else so (the monitor falls back to the job maps alone)."""
        if os.access(self.qstat, os.X_OK):
            return None
        return f"{self.qstat} is missing: jobs without a job map stay unattributed to GPUs"

    def why_no_node_actions(self) -> str | None:
        """None where qmgr (GPUs out, the node's state) is there to run."""
        return None if os.access(self.qmgr, os.X_OK) else f"{self.qmgr} is missing"

    def sessions(self) -> Mapping[int, str]:
        """Session id → job id of the jobs the last :meth:`node_allocations` found with their
        first host here: a PBS job's processes are its shell's session (no cgroup of PBS's)."""
        return self._sessions

    def constrains_devices(self, cfg: Config) -> bool:
        """False: PBS itself limits no job's devices (its optional cgroups hook does, which only a
        hook's request tells: :class:`gpuslurm.pbs.answer.PbsHookActions`)."""
        return False

    def cancel_job(self, job_id: str) -> str:
        """``qdel JOB``."""
        run_command([self.qdel, check_pbs_job_id(job_id)], timeout=self.timeout)
        return "deleted"

    def running_jobs(self) -> tuple[PbsJob, ...]:
        """Every running job the server knows (``qstat -f -F json``, state R)."""
        result = run_command([self.qstat, "-f", "-F", "json"], timeout=self.timeout)
        return tuple(j for j in parse_qstat_json(result.stdout) if j.state == "R")

    def node_allocations(self, node_name: str, node: Node) -> tuple[Allocation, ...]:
        """The running jobs with a share of ``node_name``; their GPUs from the job map, else from
        exec_vnode where it leaves no choice (see the module's docstring)."""
        jobs = [j for j in self.running_jobs() if j.runs_on(node_name)]
        self._sessions = {j.session_id: j.job_id for j in jobs
                         if j.session_id is not None and j.exec_hosts[:1] == (node_name,)}
        out = []
        for job in jobs:
            uuids, source = self._mapped(job.job_id), "map"
            if uuids is None:
                uuids, source = vnode_gpus(job, node_name, node), "qstat"
            out.append(Allocation(job.job_id, job.user, _uid(job.user), uuids, job.start, job.account,
                                  source=source))
        return tuple(out)

    def _mapped(self, job_id: str) -> tuple[str, ...] | None:
        if self.jobs_dir is None:
            return None
        from gpuslurm.state.jobmap import read_map

        try:
            jmap = read_map(job_id, self.jobs_dir)
        except (GpuslurmError, OSError):
            return None
        return jmap.uuids if jmap is not None else None

    def drain_node(self, node_name: str, reason: str) -> None:
        """``pbsnodes -o -C REASON NODE``: the host and all its vnodes offline, running jobs kept;
        pbsnodes keeps 79 characters of a comment, so a longer reason is cut to that with "..."."""
        run_command([self.pbsnodes, "-o", "-C", clean_comment(reason, MAX_NODE_COMMENT),
                     check_node_name(node_name, source="node name")], timeout=self.timeout)

    def resume_node(self, node_name: str) -> None:
        """``pbsnodes -r -C "" NODE``: back in service, the offline comment cleared."""
        run_command([self.pbsnodes, "-r", "-C", "", check_node_name(node_name, source="node name")],
                    timeout=self.timeout)

    def refuse_job(self, job_id: str, reason: str) -> str:
        """Hold the job and requeue it (it then waits in state H with ``reason`` as its comment,
        released by its owner with ``qrls`` once fixed); a job PBS cannot requeue is deleted.

        The hold comes first: a job requeued before its hold would be run again at once.
        """
        check_pbs_job_id(job_id)
        try:
            run_command([self.qhold, "-h", "u", job_id], timeout=self.timeout)
            run_command([self.qrerun, job_id], timeout=self.timeout)
            done = "held and requeued"
        except CommandError:
            run_command([self.qdel, job_id], timeout=self.timeout)
            return "deleted"
        # after the hold, whose own comment ("Job held by ...") it replaces; best effort
        self.set_admin_comment(job_id, reason, check=False)
        return done

    def set_admin_comment(self, job_id: str, text: str, *, check: bool = True) -> None:
        """The job's ``comment`` (``qalter -W comment=TEXT``): PBS has no AdminComment; this is the
        job attribute only managers and the scheduler set, shown by ``qstat -f`` and kept in the
        job's history. The scheduler writes it when it runs the job, not while the job runs.

        qalter splits ``-W`` values at commas and ``=`` unless quoted, and a quoted value ends at
        the next double quote (which becomes a trailing space): such a text is quoted, its own
        double quotes made single."""
        value = clean_comment(text).replace('"', "'")
        if any(c in value for c in ",=") or value[:1] == "'":
            value = f'"{value}"'
        run_command([self.qalter, "-W", f"comment={value}", check_pbs_job_id(job_id)],
                    timeout=self.timeout, check=check)

    def why_no_running_comments(self) -> str:
        """Always a reason: the monitor keeps no PBS job's comment current."""
        return ("the monitor keeps no running PBS job's comment current "
                "([epilog] admin_comment is Slurm's AdminComment; the job's summary has the figures)")

    def set_running_comment(self, job_id: str, text: str) -> bool:
        """:meth:`set_admin_comment` (qalter takes a running job's comment)."""
        self.set_admin_comment(job_id, text)
        return True

    def requeue_job(self, job_id: str, reason: str) -> str:
        """``qrerun`` (the job goes back to the queue, not held), its comment naming ``reason``;
        a job PBS cannot rerun is deleted."""
        check_pbs_job_id(job_id)
        try:
            run_command([self.qrerun, job_id], timeout=self.timeout)
        except CommandError:
            run_command([self.qdel, job_id], timeout=self.timeout)
            return "deleted (PBS cannot rerun it)"
        self.set_admin_comment(job_id, reason, check=False)
        return "requeued"

    def set_final_comment(self, job_id: str, text: str) -> str:
        """The job's comment as it ends (qalter; PBS refuses it once the job has finished)."""
        self.set_admin_comment(job_id, text)
        return f"comment: {text}"

    def vnodes(self) -> tuple[PbsNode, ...]:
        """Every vnode, as ``pbsnodes -av -F json`` shows it."""
        from gpuslurm.pbs.qstat import parse_pbsnodes_json

        result = run_command([self.pbsnodes, "-av", "-F", "json"], timeout=self.timeout)
        return parse_pbsnodes_json(result.stdout)

    def run_qmgr(self, directive: str) -> None:
        """One ``qmgr -c DIRECTIVE`` (the caller has made every value in it safe to quote)."""
        run_command([self.qmgr, "-c", directive], timeout=self.timeout)

    def apply_gpus_out(self, node_name: str, node: Node, out: Mapping[str, OutOfService]) -> str:
        """The vnode holding each GPU out of service publishes one GPU fewer, with a comment naming
        it (:mod:`gpuslurm.pbs.gpu_out`); safe to repeat."""
        from gpuslurm.config import GpuOutConfig
        from gpuslurm.pbs.gpu_out import PbsGpuOut, reconcile

        host = check_node_name(node_name, source="node name")
        cfg = self.gpu_out or GpuOutConfig()
        cmds = PbsGpuOut(
            read_vnodes=self.vnodes,
            qmgr=self.run_qmgr,
            offline=self.drain_node, online=self.resume_node,
            allocations=lambda: self.node_allocations(host, node),
            notify=self.set_admin_comment, requeue=self.requeue_job, job_on_gpu=cfg.job_on_gpu)
        return reconcile(node, host, out, cmds)


def job_name(job_id: str, *, qstat: str, timeout: float) -> str | None:
    """A job's ``Job_Name`` (``qstat -x -f -F json ID``: an ended job too, where the server keeps
    job history), or None when qstat's answer does not hold that job."""
    result = run_command([qstat, "-x", "-f", "-F", "json", check_pbs_job_id(job_id)], timeout=timeout)
    found = [j for j in parse_qstat_json(result.stdout) if j.job_id == job_id]
    return found[0].name if found else None
