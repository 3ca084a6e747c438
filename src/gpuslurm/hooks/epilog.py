"""``gpuslurm epilog``: runs as root in slurmd's environment after each job on the node.

Steps: read the job map (else the GPUs Slurm names); check that the job left nothing on its
GPUs (processes, memory) when those facts can be read, else skip; remove the map; write a
per-job summary ``<state_dir>/jobs/<jobid>-summary.json``.

Failure policy. A fault with action ``drain`` drains the node with a reason naming the GPU; the
epilog then exits 0 so that Slurm keeps that reason (it exits 1 only when the drain itself failed,
so that Slurm drains the node instead). Facts that cannot be read are logged and the check is
skipped: the next job's prolog gates the GPU anyway. The map removal and the summary are
bookkeeping: a failure there is logged and never drains the node.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping, Sequence
from typing import Any

from gpuslurm.errors import CommandError, GpuslurmError
from gpuslurm.hooks.prolog import EXIT_INTERNAL, EXIT_UNHEALTHY, HookLog, node_name

SUMMARY_VERSION = 1


def run_epilog(environ: Mapping[str, str], log: HookLog | None = None,
               now: float | None = None) -> int:
    """Run the epilog; 0 unless a drain was needed and failed (see module docstring)."""
    log = log or HookLog("epilog")
    try:
        return _epilog(environ, log, time.time() if now is None else now)
    except GpuslurmError as exc:  # no job id, a broken config: nothing safe to do
        log.error(str(exc))
        return exc.exit_code
    except Exception as exc:
        log.error(f"internal error: {type(exc).__name__}: {exc}")
        return EXIT_INTERNAL


def _epilog(environ: Mapping[str, str], log: HookLog, now: float) -> int:
    from gpuslurm.config import load_config
    from gpuslurm.hooks.jobmap import read_map, remove_map
    from gpuslurm.slurm.hookenv import HookEnv

    env = HookEnv.from_environ(environ)
    job_id, uid, user = env.require_job()
    log.job_id = job_id
    cfg = load_config(environ=environ)
    jobs_dir = cfg.paths.jobs_dir
    try:
        jmap = read_map(job_id, jobs_dir)
    except GpuslurmError as exc:
        log.error(f"cannot read the job map: {exc}")
        jmap = None
    spec = environ.get("GPUSLURM_CAPTURE") or None
    gpus: list[dict[str, Any]] = []
    start: float | None = None
    if jmap is not None:
        start = jmap.start
        gpus = [{"uuid": d.uuid, "minor": d.minor, "gres_index": d.gres_index,
                 "parent_uuid": d.parent_uuid} for d in jmap.devices]
    elif env.job_gpus is not None or env.step_gpus is not None:
        gpus = _gpus_from_env(env, spec, log)

    faults, labels = _release_check(gpus, cfg, spec, log)
    rc = 0
    drains = [f for f in faults if f.action == "drain"]
    if drains:
        rc = _drain(environ, drains, labels, cfg, log)

    try:
        if remove_map(job_id, jobs_dir):
            log.info(f"removed the job map from {jobs_dir}")
    except (GpuslurmError, OSError) as exc:
        log.error(f"cannot remove the job map: {exc}")
    if cfg.epilog.summary:
        summary = {"version": SUMMARY_VERSION, "job_id": job_id, "user": user, "uid": uid,
                   "node": node_name(environ), "start": start, "end": now, "gpus": gpus,
                   "faults": [f._asdict() for f in faults]}
        try:
            path = write_summary(summary, os.path.join(cfg.paths.state_dir, "jobs"), job_id)
            log.info(f"wrote {path}")
        except (GpuslurmError, OSError) as exc:
            log.error(f"cannot write the job summary: {exc}")
        except Exception as exc:  # bookkeeping: a bug here must not drain the node
            log.error(f"internal error writing the job summary: {type(exc).__name__}: {exc}")
    return rc


def _gpus_from_env(env: Any, spec: str | None, log: HookLog) -> list[dict[str, Any]]:
    """No map (the prolog did not run, or failed): the GPUs Slurm names, if the node can be read."""
    from gpuslurm.hw.source import load_node
    from gpuslurm.slurm.hookenv import resolve_job_gpus

    try:
        devices = resolve_job_gpus(env, load_node(spec))
    except GpuslurmError as exc:
        log.error(f"no job map, and the job's GPUs cannot be resolved: {exc}")
        return []
    return [{"uuid": d.uuid, "minor": d.minor, "gres_index": d.gres_index,
             "parent_uuid": d.gpu.uuid if d.mig is not None else None} for d in devices]


def _release_check(gpus: Sequence[Mapping[str, Any]], cfg: Any, spec: str | None,
                   log: HookLog) -> tuple[list[Any], dict[str, str]]:
    """Faults on the job's physical GPUs, and their NVML indices for the drain reason."""
    from gpuslurm.policy.health import release_enabled, released_faults

    if not gpus or not release_enabled(cfg.health):
        return [], {}
    from gpuslurm.hw.health import read_health
    from gpuslurm.hw.source import load_node

    physical = {g["parent_uuid"] or g["uuid"] for g in gpus}
    try:
        node = load_node(spec)
        mine = [g for g in node.gpus if g.uuid in physical]
        health = read_health(mine, spec)
    except GpuslurmError as exc:
        log.error(f"cannot read GPU health, skipping the release check: {exc}")
        return [], {}
    if missing := sorted(physical - {g.uuid for g in mine}):
        log.warning(f"GPU(s) {', '.join(missing)} of the job are not on this node any more")
    faults = []
    for gpu in mine:
        for fault in released_faults(health[gpu.uuid], cfg.health):
            log.warning(f"GPU {gpu.index} {gpu.uuid}: {fault.check}: {fault.message} "
                        f"(action {fault.action})")
            faults.append(fault)
    return faults, {g.uuid: str(g.index) for g in mine}


def _drain(environ: Mapping[str, str], drains: list[Any], labels: dict[str, str], cfg: Any,
           log: HookLog) -> int:
    from gpuslurm.policy.health import drain_reason
    from gpuslurm.slurm.scontrol import drain_node

    reason = drain_reason(drains, labels)
    name = node_name(environ)
    try:
        drain_node(name, reason, scontrol=cfg.paths.scontrol, timeout=cfg.hooks.command_timeout_s)
    except (CommandError, GpuslurmError) as exc:
        log.error(f"could not drain {name} ({exc}); failing so that Slurm drains it: {reason}")
        return EXIT_UNHEALTHY
    log.error(f"drained {name}: {reason}")
    return 0


def write_summary(summary: Mapping[str, Any], directory: str, job_id: str) -> str:
    """Write ``<directory>/<jobid>-summary.json`` atomically (0600, no symlinks followed)."""
    from gpuslurm.hooks.jobmap import check_job_id, write_private_file

    final = f"{check_job_id(job_id)}-summary.json"
    payload = (json.dumps(summary, sort_keys=True, indent=1) + "\n").encode()
    return write_private_file(directory, final, payload)
