"""Slurm's side of ``gpuslurm throttle auto``: the load from slurmctld, per-user GPU limits in slurmdbd.

- configured GPUs: the ``Gres=`` of every node in ``scontrol -o show node`` (``gpu:h100:8(S:0-1)``
  counts 8; mps and shard are not GPUs);
- GPUs held per user: the running jobs' ``gres_detail`` in ``squeue --json`` (GRES indices);
- limits: ``sacctmgr -nP show assoc format=User,GrpTRES`` (``gres/gpu=N`` in GrpTRES), set with
  ``sacctmgr -i modify user where name=USER set GrpTRES=gres/gpu=N`` and lifted with ``=-1``.
  Slurm enforces them only with ``AccountingStorageTRES=gres/gpu`` and
  ``AccountingStorageEnforce=limits`` (docs/throttle.md).

- utilisation (for the band controller): the node monitors' exporters through Prometheus,
  ``avg(avg_over_time(gpuslurm_gpu_utilization_ratio[5m]))``, every GPU of the cluster.

The parsers are pure; the commands go through :mod:`gpuslurm.runner`.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from gpuslurm.errors import InputError
from gpuslurm.policy.throttle import check_user
from gpuslurm.runner import run_command
from gpuslurm.slurm.squeue import SqueueJob, gpu_indices, parse_squeue_json
from gpuslurm.watch.admission import MAX_LIMIT as MAX_LIMIT  # the round is neutral; kept importable here
from gpuslurm.watch.admission import STATE_FILE as STATE_FILE
from gpuslurm.watch.admission import UTILISATION_METRIC as UTILISATION_METRIC
from gpuslurm.watch.admission import auto_round as auto_round
from gpuslurm.watch.admission import load_state as load_state
from gpuslurm.watch.admission import prometheus_utilisation
from gpuslurm.watch.admission import save_state as save_state

_GRES_ITEM = re.compile(r"^gpu(?::[^:(]*)?:(\d{1,6})(?:\(.*\))?$")
_GPU_TRES = re.compile(r"(?:^|,)gres/gpu=(-?\d{1,9})(?:,|$)")
_NODE_GRES = re.compile(r"(?:^| )Gres=(\S*)")


def node_gpu_count(gres: str) -> int:
    """GPUs in one node's ``Gres=`` value: ``gpu:h100:8(S:0-1),mps:800`` → 8; ``(null)`` → 0."""
    total = 0
    depth = 0
    item = ""
    for ch in gres + ",":  # split on commas outside parentheses: "(S:0-1)" holds none, IDX may
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth = max(0, depth - 1)
        if ch == "," and depth == 0:
            m = _GRES_ITEM.match(item)
            if m:
                total += int(m.group(1))
            item = ""
        else:
            item += ch
    return total


def configured_gpus(text: str) -> int:
    """GPUs over every node of ``scontrol -o show node`` (one node per line)."""
    total = 0
    for line in text.splitlines():
        m = _NODE_GRES.search(line)
        if m:
            total += node_gpu_count(m.group(1))
    return total


def gpus_held(jobs: Iterable[SqueueJob]) -> dict[str, int]:
    """User → GPUs their running jobs hold (every node of each job)."""
    out: dict[str, int] = {}
    for job in jobs:
        if job.state != "RUNNING":
            continue
        n = sum(len(gpu_indices(d)) for d in job.gres_detail)
        if n:
            out[job.user] = out.get(job.user, 0) + n
    return out


def parse_gpu_limits(text: str) -> dict[str, tuple[int | None, ...]]:
    """User → the ``gres/gpu`` limit of each of their associations (None: no limit) from
    ``sacctmgr -nP show assoc format=User,GrpTRES``; rows without a user (accounts) are skipped."""
    out: dict[str, tuple[int | None, ...]] = {}
    for line in text.splitlines():
        user, sep, tres = line.partition("|")
        if not sep or not user.strip():
            continue
        if "|" in tres:
            raise InputError(f"expected 'User|GrpTRES', not {line[:80]!r}", source="sacctmgr show assoc")
        m = _GPU_TRES.search(tres.strip())
        value = int(m.group(1)) if m else None
        out[user.strip()] = (*out.get(user.strip(), ()), None if value is None or value < 0 else value)
    return out


class SlurmAdmission:
    """The commands, with the programs' absolute paths and a timeout."""

    limit_key = "gres/gpu"

    def __init__(self, *, squeue: str = "/usr/bin/squeue", scontrol: str = "/usr/bin/scontrol",
                 sacctmgr: str = "/usr/bin/sacctmgr", timeout: float = 30.0,
                 env: dict[str, str] | None = None, utilisation_source: str = "") -> None:
        self.squeue, self.scontrol, self.sacctmgr = squeue, scontrol, sacctmgr
        self.timeout, self.env = timeout, env
        self.utilisation_source: str | None = None
        if utilisation_source:
            from gpuslurm.report.prometheus import parse_source

            self.utilisation_source = parse_source(utilisation_source)

    def read_load(self) -> tuple[int, dict[str, int]]:
        """(GPUs configured, user → GPUs held)."""
        nodes = run_command([self.scontrol, "-o", "show", "node"], timeout=self.timeout, env=self.env)
        jobs = run_command([self.squeue, "--json"], timeout=self.timeout, env=self.env)
        return configured_gpus(nodes.stdout), gpus_held(parse_squeue_json(jobs.stdout))

    def read_limits(self) -> dict[str, tuple[int | None, ...]]:
        result = run_command([self.sacctmgr, "-nP", "show", "assoc", "format=User,GrpTRES"],
                             timeout=self.timeout, env=self.env)
        return parse_gpu_limits(result.stdout)

    def read_utilisation(self, now: float) -> float | None:
        """The GPUs' mean utilisation over the last 5 minutes (0..1), or None without a source."""
        return prometheus_utilisation(self.utilisation_source, now, self.timeout)

    def set_limit(self, user: str, limit: int | None) -> None:
        """``GrpTRES=gres/gpu=limit`` on every association of ``user`` (None lifts it)."""
        value = -1 if limit is None else limit
        run_command([self.sacctmgr, "-i", "modify", "user", "where", f"name={check_user(user)}", "set",
                     f"GrpTRES=gres/gpu={value}"], timeout=self.timeout, env=self.env)

    def limit_text(self, limit: int) -> str:
        return f"GrpTRES=gres/gpu={limit}"

    def cannot_limit(self, user: str, existing: dict[str, tuple[int | None, ...]]) -> str | None:
        return None if user in existing else "no association in slurmdbd"
