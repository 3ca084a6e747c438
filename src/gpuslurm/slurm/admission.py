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

import json
import re
from collections.abc import Callable, Iterable

from gpuslurm.errors import GpuslurmError, InputError
from gpuslurm.policy.admission import AdmissionConfig, AdmissionState, step
from gpuslurm.policy.throttle import check_user
from gpuslurm.runner import run_command
from gpuslurm.safedir import read_private_file, write_private_file
from gpuslurm.slurm.squeue import SqueueJob, gpu_indices, parse_squeue_json

_GRES_ITEM = re.compile(r"^gpu(?::[^:(]*)?:(\d{1,6})(?:\(.*\))?$")
_GPU_TRES = re.compile(r"(?:^|,)gres/gpu=(-?\d{1,9})(?:,|$)")
_NODE_GRES = re.compile(r"(?:^| )Gres=(\S*)")
UTILISATION_METRIC = "gpuslurm_gpu_utilization_ratio"


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
        if self.utilisation_source is None:
            return None
        from gpuslurm.report.prometheus import PrometheusClient

        client = PrometheusClient(self.utilisation_source, timeout_s=self.timeout)
        items = client.instant(f"avg(avg_over_time({UTILISATION_METRIC}[5m]))", now)
        value = items[0].get("value") if items else None
        try:
            util = float(value[1]) if isinstance(value, list) and len(value) == 2 else None
        except (TypeError, ValueError):
            util = None
        if util is None or not 0 <= util <= 1:
            raise InputError(f"no utilisation in Prometheus ({UTILISATION_METRIC}): are the node "
                             "monitors scraped?", source=f"prometheus:{self.utilisation_source}")
        return util

    def set_limit(self, user: str, limit: int | None) -> None:
        """``GrpTRES=gres/gpu=limit`` on every association of ``user`` (None lifts it)."""
        value = -1 if limit is None else limit
        run_command([self.sacctmgr, "-i", "modify", "user", "where", f"name={check_user(user)}", "set",
                     f"GrpTRES=gres/gpu={value}"], timeout=self.timeout, env=self.env)


# --- one round of `gpuslurm throttle auto` --------------------------------------------------

STATE_FILE = "admission.json"
MAX_STATE_BYTES = 1 << 20


def load_state(directory: str) -> AdmissionState:
    """The state a previous round saved in ``directory`` (root's, private), or a fresh one.

    The file is reached and checked like every root path (:mod:`gpuslurm.safedir`); a missing or
    malformed one is a fresh start, which forgets the limits this set (they are then left alone,
    never lifted: docs/throttle.md).
    """
    data = read_private_file(directory, STATE_FILE, MAX_STATE_BYTES)
    if data is None:
        return AdmissionState()
    try:
        doc = json.loads(data)
        limits = tuple((check_user(str(u)), int(n)) for u, n in doc["limits"])
        opt = [None if doc[k] is None else float(doc[k]) for k in ("low_since", "backoff_s", "eased_at")]
        return AdmissionState(int(doc["tier"]), opt[0], opt[1], opt[2], limits)
    except (ValueError, TypeError, KeyError, InputError):
        return AdmissionState()


def save_state(directory: str, state: AdmissionState) -> None:
    doc = {"tier": state.tier, "low_since": state.low_since, "backoff_s": state.backoff_s,
           "eased_at": state.eased_at, "limits": [list(x) for x in state.limits]}
    write_private_file(directory, STATE_FILE, json.dumps(doc).encode() + b"\n")


def auto_round(adm: SlurmAdmission, state: AdmissionState, cfg: AdmissionConfig, now: float, *,
               dry_run: bool, log: Callable[[str], None]) -> AdmissionState:
    """Read the load, decide (:func:`gpuslurm.policy.admission.step`), apply; the new state.

    A limit is set only on a user whose associations carry no GPU limit of someone else's, and
    lifted only while it is still the one this set; otherwise the user is left alone and forgotten.
    """
    total, usage = adm.read_load()
    load = sum(usage.values()) / total if total else 0.0
    try:
        utilisation = adm.read_utilisation(now)
    except GpuslurmError as exc:  # the tiers still work on allocation alone
        log(f"utilisation not read, the band controller waits: {exc}")
        utilisation = None
    new, changes, notes = step(state, load=load, usage=usage, total_gpus=total, now=now, cfg=cfg,
                               utilisation=utilisation)
    for note in notes:
        log(note)
    if not changes:
        return new
    existing = adm.read_limits()
    applied = dict(state.limits)
    verb = "would " if dry_run else ""
    for change in changes:
        ours = applied.get(change.user)
        foreign = sorted({v for v in existing.get(change.user, ()) if v is not None and v != ours})
        if foreign:
            log(f"leave {change.user} alone: gres/gpu={','.join(map(str, foreign))} was not set by gpuslurm")
            applied.pop(change.user, None)
            continue
        if change.user not in existing:
            log(f"cannot limit {change.user}: no association in slurmdbd")
            continue
        what = f"GrpTRES=gres/gpu={change.limit}" if change.limit is not None else "lift the GPU limit"
        try:
            if not dry_run:
                adm.set_limit(change.user, change.limit)
        except GpuslurmError as exc:
            log(f"failed to set {what} for {change.user}: {exc}")
            continue
        log(f"{verb}{'set ' + what if change.limit is not None else what} for {change.user}: {change.why}")
        if change.limit is None:
            applied.pop(change.user, None)
        else:
            applied[change.user] = change.limit
    if dry_run:
        return new._replace(limits=state.limits)  # nothing was changed in Slurm
    return new._replace(limits=tuple(sorted(applied.items())))
