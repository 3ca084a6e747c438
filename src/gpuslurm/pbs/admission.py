"""PBS's side of ``gpuslurm throttle auto``: the load from pbs_server, per-user GPU limits in its
``max_run_res.ngpus`` (:mod:`gpuslurm.pbs.limits`).

- configured GPUs: every vnode's ``resources_available.ngpus`` (``pbsnodes -av -F json``; a GPU out
  of service is already left out of its vnode's count);
- GPUs held per user: the running jobs' ``Resource_List.ngpus`` (``qstat -f -F json``, state R), by
  the account each job runs as (``euser``);
- limits: the server's ``max_run_res.ngpus = "[u:NAME=N],..."``. A job over its owner's limit stays
  queued (state Q) with the scheduler's comment naming the limit ("would exceed user NAME's limit
  on resource ngpus in complex"); nothing is refused. A limit is set or lifted by rewriting the
  value with that user's entry changed and every other entry kept (``[g:]``, ``[p:]``, ``[o:]``,
  other users', ``PBS_GENERIC``); the foreign-limit rule of :func:`gpuslurm.watch.admission.auto_round`
  leaves alone a user whose entry gpuslurm did not write. Queue-level limits are not touched.
- utilisation (the band controller): the node monitors through Prometheus, as for Slurm.

Runs where ``qmgr`` may set server attributes (the PBS server host, as root or a PBS manager).
"""

from __future__ import annotations

from gpuslurm.errors import InputError
from gpuslurm.pbs.limits import (
    parse_limit_entries,
    read_gpu_limit_text,
    set_gpu_limit_entries,
    with_user_limit,
)
from gpuslurm.pbs.qstat import PbsJob, PbsNode, parse_pbsnodes_json, parse_qstat_json
from gpuslurm.runner import run_command
from gpuslurm.watch.admission import prometheus_utilisation


def configured_gpus(nodes: tuple[PbsNode, ...]) -> int:
    """GPUs over every vnode (natural and NUMA vnodes alike: gpuslurm's natural vnode holds none)."""
    return sum(n.ngpus for n in nodes)


def gpus_held(jobs: tuple[PbsJob, ...]) -> dict[str, int]:
    """User → GPUs their running jobs hold."""
    out: dict[str, int] = {}
    for job in jobs:
        if job.state == "R" and job.ngpus:
            out[job.user] = out.get(job.user, 0) + job.ngpus
    return out


class PbsAdmission:
    """The PBS commands (absolute paths), each bounded by ``timeout`` seconds."""

    limit_key = "max_run_res.ngpus"

    def __init__(self, *, qstat: str = "/opt/pbs/bin/qstat", pbsnodes: str = "/opt/pbs/bin/pbsnodes",
                 qmgr: str = "/opt/pbs/bin/qmgr", timeout: float = 30.0,
                 utilisation_source: str = "") -> None:
        self.qstat, self.pbsnodes, self.qmgr, self.timeout = qstat, pbsnodes, qmgr, timeout
        self.utilisation_source: str | None = None
        if utilisation_source:
            from gpuslurm.report.prometheus import parse_source

            self.utilisation_source = parse_source(utilisation_source)

    def read_load(self) -> tuple[int, dict[str, int]]:
        """(GPUs configured, user → GPUs held)."""
        nodes = run_command([self.pbsnodes, "-av", "-F", "json"], timeout=self.timeout)
        jobs = run_command([self.qstat, "-f", "-F", "json"], timeout=self.timeout)
        return configured_gpus(parse_pbsnodes_json(nodes.stdout)), gpus_held(parse_qstat_json(jobs.stdout))

    def read_limits(self) -> dict[str, tuple[int | None, ...]]:
        """User → (their ``[u:NAME=N]`` limit,), for the users the server's value names."""
        entries = parse_limit_entries(read_gpu_limit_text(self.qstat, timeout=self.timeout))
        return {name: (n,) for kind, name, n in entries if kind == "u"}

    def read_utilisation(self, now: float) -> float | None:
        return prometheus_utilisation(self.utilisation_source, now, self.timeout)

    def set_limit(self, user: str, limit: int | None) -> None:
        """``[u:USER=limit]`` in the server's ``max_run_res.ngpus`` (None removes it), the rest kept.
        InputError for a user name that could not be written safely (it is never sent to qmgr)."""
        entries = parse_limit_entries(read_gpu_limit_text(self.qstat, timeout=self.timeout))
        set_gpu_limit_entries(self.qmgr, with_user_limit(entries, user, limit), timeout=self.timeout)

    def limit_text(self, limit: int) -> str:
        return f"max_run_res.ngpus [u:NAME={limit}]"

    def cannot_limit(self, user: str, existing: dict[str, tuple[int | None, ...]]) -> str | None:
        if user == "PBS_GENERIC":
            return "PBS_GENERIC is PBS's name for every other user, not a user"
        from gpuslurm.policy.throttle import check_user

        try:
            check_user(user)
        except InputError as exc:
            return exc.message
        return None
