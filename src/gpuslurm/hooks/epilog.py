"""The job-end step every scheduler runs as root after a job: release, check, clean up, summarise.

``job_end`` takes a neutral :class:`gpuslurm.state.job.HookJob` and the scheduler's actions; the
adapters call it (Slurm's Epilog: :mod:`gpuslurm.slurm.hooks`; PBS's execjob_end).

Steps, in this order: (1) the job's GPUs, from its map, else the GPUs the scheduler names; (2) stop the
job's MPS daemon; (3) kill what the job left on its GPUs (SIGTERM, ``kill_grace_s``, SIGKILL)
and check that the GPUs were released (no processes, memory freed); (4) remove the job's cgroup
device limits; (5) remove the map; (6) bookkeeping: the per-job summary
``<state_dir>/jobs/<jobid>-summary.json`` (with utilisation and memory from the monitor's store
when there is one) and, if configured, the job's AdminComment (Slurm 22.05 refuses that for a
finished job; the node monitor keeps it current while the job runs: :mod:`gpuslurm.watch.comments`;
where slurmdbd runs, the epilog writes its final figures into the job's accounting record instead).

Which processes on the job's physical GPUs are its leftovers, and how they are killed without
ever signalling a reused PID: :mod:`gpuslurm.hooks.leftovers`. When another job still holds the
GPU (MIG, sharing), the memory check is skipped. With ``kill_leftover = false`` nothing is killed
and the check reports what the GPUs list.

Failure policy. A fault with action ``drain`` drains the node with a reason naming the GPU; the
epilog then exits 0 so that Slurm keeps that reason (it exits 1 only when the drain itself failed,
so that Slurm drains the node instead). Facts that cannot be read are logged and the check is
skipped: the next job's prolog gates the GPU anyway. A process that survives SIGKILL is a
``leftover_processes`` fault naming the GPU. The map removal, the summary and the AdminComment
are bookkeeping: a failure there is logged and never drains the node.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping, Sequence

from gpuslurm.errors import EXIT_UNHEALTHY, GpuslurmError
from gpuslurm.hooks.log import HookLog
from gpuslurm.tuples import TYPE_CHECKING, NamedTuple  # not typing's: the epilog's start-up

if TYPE_CHECKING:
    from typing import Any

    from gpuslurm.config import Config
    from gpuslurm.hw.source import HardwareSource
    from gpuslurm.isolate.kill import Target
    from gpuslurm.policy.health import Fault
    from gpuslurm.state.job import HookJob
    from gpuslurm.state.scheduler import Scheduler
    from gpuslurm.state.store import GpuStats

SUMMARY_VERSION = 1


def job_end(job: HookJob, scheduler: Scheduler, cfg: Config, log: HookLog, source: HardwareSource,
            now: float | None = None) -> int:
    """Run the job-end step for ``job`` on ``source``'s node; 0 unless a drain was needed and
    failed (module docstring). Raises GpuslurmError only before it starts (no safe way to proceed)."""
    from gpuslurm.state.jobmap import read_map, remove_map

    now = time.time() if now is None else now
    job_id, uid = job.job_id, job.uid
    log.job_id = job_id
    jobs_dir = cfg.paths.jobs_dir
    try:
        jmap = read_map(job_id, jobs_dir)
    except GpuslurmError as exc:
        log.error(f"cannot read the job map: {exc}")
        jmap = None

    # 1. the job's GPUs
    gpus: list[dict[str, Any]] = []
    start: float | None = None
    if jmap is not None:
        start = jmap.start
        gpus = [{"uuid": d.uuid, "minor": d.minor, "gres_index": d.gres_index,
                 "parent_uuid": d.parent_uuid} for d in jmap.devices]
    elif job.gpus is not None:
        gpus = _gpus_from_claim(job, source, cfg, log)

    # 2. stop the job's MPS daemon (before the kill, so that it shuts down cleanly)
    mps_faults = _stop_mps(job, gpus, cfg, log)

    # 3. kill the job's leftovers, check the GPUs were released; drain on a fault
    # the job's SLUID: Slurm's (25.11+ Epilog), else the one the prolog recorded
    sluid = job.sluid or (jmap.sluid if jmap is not None else None)
    release = _release(job_id, uid, gpus, cfg, source, log, scheduler, sluid)
    rc = 0
    drains = [f for f in [*release.faults, *mps_faults] if f.action == "drain"]
    if drains:
        rc = _drain(job, scheduler, drains, release.labels, log)

    # 4. remove the job's cgroup device limits
    try:  # gpuslurm's own device cgroup (isolate.devices); bookkeeping: logged, never drains
        from gpuslurm.isolate.devices import release_job

        def v2_dir() -> tuple[str, ...]:
            return scheduler.existing_job_cgroup_v2(job._replace(sluid=sluid), cfg)

        if (released := release_job(cfg, job_id, v2_dir)) is not None:
            log.info(released)
    except Exception as exc:
        log.error(f"cannot remove the job's devices cgroup: {exc}")

    # 5. remove the map
    try:
        if remove_map(job_id, jobs_dir):
            log.info(f"removed the job map from {jobs_dir}")
    except (GpuslurmError, OSError) as exc:
        log.error(f"cannot remove the job map: {exc}")
    try:
        from gpuslurm.state.taskinfo import remove_task_info

        remove_task_info(cfg.paths.run_dir, job_id)
    except (GpuslurmError, OSError) as exc:
        log.error(f"cannot remove the job's task file: {exc}")

    # 6. bookkeeping: summary file and AdminComment; a failure here must never drain the node
    try:
        _bookkeeping(job, scheduler, start, now, gpus, release, cfg, log)
    except Exception as exc:
        log.error(f"internal error writing the job summary: {type(exc).__name__}: {exc}")
    return rc


def _bookkeeping(job: HookJob, scheduler: Scheduler, start: float | None, now: float,
                 gpus: list[dict[str, Any]], release: Release, cfg: Config, log: HookLog) -> None:
    """The summary file and the AdminComment (failures logged, never fatal)."""
    if not (cfg.epilog.summary or cfg.epilog.admin_comment):
        return
    mapped = start is not None  # the prolog mapped the job; without a map it may have refused it
    job_id = job.job_id
    if start is None:  # no map: the scheduler may still say when the job started
        start = job.start
    stats, energy = _monitor_stats([g["uuid"] for g in gpus], start, now, cfg, log)
    for g in gpus:
        if g["uuid"] in energy:
            g["energy_j"] = _round(energy[g["uuid"]])
        if (s := stats.get(g["uuid"])) is not None:
            g.update(samples=s.samples, util_mean_pct=_round(s.util_mean_pct),
                     util_max_pct=_round(s.util_max_pct), mem_peak_mib=_round(s.mem_peak_mib),
                     util_min_pct=_round(s.util_min_pct), mem_min_mib=_round(s.mem_min_mib),
                     mem_mean_mib=_round(s.mem_mean_mib), temp_mean_c=_round(s.temp_mean_c),
                     temp_max_c=_round(s.temp_max_c), power_mean_w=_round(s.power_mean_w),
                     power_max_w=_round(s.power_max_w))
    if cfg.epilog.summary:
        refused = [] if mapped else _prolog_faults(job_id, cfg, log)
        summary = {"version": SUMMARY_VERSION, "job_id": job_id, "user": job.user, "uid": job.uid,
                   "node": job.node_name, "scheduler": job.scheduler, "start": start, "end": now,
                   "gpus": gpus,
                   "monitor": "ok" if stats else "no monitor data",
                   "leftovers": list(release.leftovers),
                   "faults": [*refused, *(f._asdict() for f in release.faults)],
                   "gpus_out_of_service": _out_during([g["uuid"] for g in gpus], start, cfg, log)}
        if refused:
            summary["refused_by"] = "prolog"
        try:
            path = write_summary(summary, _summary_dir(cfg), job_id)
            log.info(f"wrote {path}")
        except (GpuslurmError, OSError) as exc:
            log.error(f"cannot write the job summary: {exc}")
    if cfg.epilog.admin_comment:
        text = admin_comment(len(gpus), list(stats.values()), len(release.leftovers))
        try:
            log.info(scheduler.set_final_comment(job_id, text))
        except GpuslurmError as exc:
            log.error(f"cannot set the job's final comment: {exc}")


def _out_during(uuids: list[str], start: float | None, cfg: Config,
                log: HookLog) -> list[dict[str, Any]]:
    """The job's GPUs taken out of service since it started (a fault seen while it ran)."""
    from gpuslurm.state.out_of_service import OutOfServiceStore

    try:
        out = OutOfServiceStore(cfg.paths.state_dir).read()
    except GpuslurmError as exc:
        log.warning(f"cannot read the out-of-service record: {exc}")
        return []
    return [r.to_dict() for u, r in sorted(out.items())
            if u in uuids and (start is None or r.since >= start)]


def _monitor_stats(uuids: list[str], start: float | None, now: float, cfg: Config,
                   log: HookLog) -> tuple[dict[str, GpuStats], dict[str, float]]:
    """Per-device figures from the monitor's store, and each device's energy (J) as jobstats
    counts it (docs/jobstats.md); empty when there is no store or no data."""
    path = os.path.join(cfg.paths.state_dir, "monitor.db")
    if not uuids or start is None or not os.path.isfile(path):
        return {}, {}
    from gpuslurm.report.jobstats import Settings, gpu_figures  # only now, as the store
    from gpuslurm.state.store import Store  # only now: it imports sqlite3

    try:
        with Store.open(path, readonly=True, timeout_s=min(2.0, cfg.hooks.command_timeout_s)) as store:
            stats = dict(store.gpu_stats(uuids, start, now))
            series = store.device_series(uuids, start, now)
    except GpuslurmError as exc:
        log.warning(f"cannot read the monitor store: {exc}")
        return {}, {}
    if dropped := sum(s.power_dropped for s in stats.values()):  # a damaged or forged sample
        log.warning(f"left {dropped} power reading(s) no GPU draws out of the job's power figures")
    settings = Settings(max_gap_s=max(3 * cfg.monitor.interval_s, 5.0))
    figures = {u: gpu_figures(s, settings).energy_j for u, s in series.items()}
    return stats, {u: e for u, e in figures.items() if e is not None}


def admin_comment(n_gpus: int, stats: Sequence[GpuStats], killed: int = 0) -> str:
    """The short summary for AdminComment: ``gpuslurm: 4 GPU, util mean 37% max 99%, peak mem …``.

    The mean is over all samples of all the job's GPUs; the peak memory is the largest on any one.
    """
    parts = [f"gpuslurm: {n_gpus} GPU"]
    known = [(s.util_mean_pct, s.util_max_pct, s.util_samples) for s in stats
             if s.util_mean_pct is not None and s.util_max_pct is not None and s.util_samples]
    if known:
        mean = sum(m * n for m, _, n in known) / sum(n for _, _, n in known)
        top = max(t for _, t, _ in known)
        parts.append(f"util mean {mean:.0f}% max {top:.0f}%")
    if peaks := [s.mem_peak_mib for s in stats if s.mem_peak_mib is not None]:
        parts.append(f"peak mem {max(peaks) / 1024:.1f} GiB")
    if not stats:
        parts.append("no monitor data")
    if killed:
        parts.append(f"{killed} leftover process(es) killed")
    return ", ".join(parts)


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 2)


def _gpus_from_claim(job: HookJob, source: HardwareSource, cfg: Config, log: HookLog) -> list[dict[str, Any]]:
    """No map (the job-start step did not run, or failed): the GPUs the scheduler names, if the
    node can be read."""
    from gpuslurm.hooks.cache import hook_node
    from gpuslurm.state.job import resolve_devices

    assert job.gpus is not None
    try:
        devices = resolve_devices(job.gpus, hook_node(source, cfg.paths.run_dir, log.warning))
    except GpuslurmError as exc:
        log.error(f"no job map, and the job's GPUs cannot be resolved: {exc}")
        return []
    return [{"uuid": d.uuid, "minor": d.minor, "gres_index": d.gres_index,
             "parent_uuid": d.gpu.uuid if d.mig is not None else None} for d in devices]


class Release(NamedTuple):
    """What step 3 found: faults to act on, GPU labels for the drain reason, leftovers handled."""

    faults: tuple[Fault, ...]
    labels: dict[str, str]
    leftovers: tuple[dict[str, Any], ...]  # gpu, pid, user, outcome: for the summary


NO_RELEASE = Release((), {}, ())


def _release(job_id: str, uid: int, gpus: Sequence[Mapping[str, Any]], cfg: Config, source: HardwareSource,
             log: HookLog, scheduler: Scheduler, sluid: str | None = None) -> Release:
    """Kill the job's leftovers on its physical GPUs, then check the GPUs were released."""
    from gpuslurm.policy.health import Fault, gpu_label, release_enabled, released_faults

    kill = cfg.epilog.kill_leftover
    if not gpus or not (kill or release_enabled(cfg.health)):
        return NO_RELEASE
    from gpuslurm.hooks.cache import hook_node
    from gpuslurm.hw.health import read_health

    physical = {g["parent_uuid"] or g["uuid"] for g in gpus}
    try:
        node = hook_node(source, cfg.paths.run_dir, log.warning)
        mine = [g for g in node.gpus if g.uuid in physical]
        listed_at = time.clock_gettime(time.CLOCK_BOOTTIME)  # the clock /proc start times count in
        health = read_health(mine, source)
    except GpuslurmError as exc:
        log.error(f"cannot read GPU health, skipping the release check: {exc}")
        return NO_RELEASE
    if missing := sorted(physical - {g.uuid for g in mine}):
        log.warning(f"GPU(s) {', '.join(missing)} of the job are not on this node any more")
    labels = {g.uuid: gpu_label(g.index, g.minor, g.uuid) for g in mine}
    holders = _other_holders(job_id, cfg.paths.jobs_dir, log)
    listed = [(g.uuid, p) for g in mine for p in (health[g.uuid].processes or ())]
    drop: dict[str, set[int]] = {u: set() for u in labels}  # not this job's, or gone: not leftovers
    leftovers: list[dict[str, Any]] = []
    survivors: dict[str, list[Target]] = {}
    if listed and kill:
        from gpuslurm.hooks.leftovers import plan_kills
        from gpuslurm.isolate.kill import SURVIVED, kill_processes

        targets, skipped = plan_kills(listed, job_id, uid, holders,
                                      cfg.health.leftover_processes.ignore_users, listed_at,
                                      job_of_cgroup=scheduler.job_of_cgroup, job_sluid=sluid)
        for (uuid, pid), (kind, why) in skipped.items():
            log.info(f"GPU {labels[uuid]}: pid {pid} is not killed: {why}")
            if kind != "kept":
                drop[uuid].add(pid)
        if targets:
            outcome = kill_processes(targets, cfg.epilog.kill_grace_s)
            for t in targets:
                what = outcome[t.pid]
                leftovers.append({"gpu": t.gpu, "pid": t.pid, "user": t.user, "outcome": what})
                log.warning(f"GPU {labels[t.gpu]}: leftover pid {t.pid} ({t.user}): {what}")
                if what == SURVIVED:
                    survivors.setdefault(t.gpu, []).append(t)
                drop[t.gpu].add(t.pid)  # a survivor is reported below, as such
            try:
                health = read_health(mine, source)
            except GpuslurmError as exc:
                log.error(f"cannot read GPU health again after the kill: {exc}")
    faults: list[Fault] = []
    action = cfg.health.leftover_processes.action
    for gpu in mine:
        facts = health[gpu.uuid]
        if facts.processes is not None:
            facts = facts._replace(processes=tuple(p for p in facts.processes
                                                   if p.pid not in drop[gpu.uuid]))
        if holders is None or holders.get(gpu.uuid):  # shared: the memory in use is not all this job's
            facts = facts._replace(memory_used_mib=None)
        found = released_faults(facts, cfg.health) if release_enabled(cfg.health) else []
        if (stuck := survivors.get(gpu.uuid)) and action != "off":
            pids = ", ".join(f"pid {t.pid}" + (f" ({t.user})" if t.user else "") for t in stuck)
            found.insert(0, Fault(gpu.uuid, "leftover_processes", action,
                                  f"{len(stuck)} leftover process(es) survived SIGKILL: {pids}"))
        for fault in found:
            log.warning(f"GPU {gpu.index} {gpu.uuid}: {fault.check}: {fault.message} "
                        f"(action {fault.action})")
            faults.append(fault)
    return Release(tuple(faults), labels, tuple(leftovers))


def _other_holders(job_id: str, jobs_dir: str, log: HookLog) -> dict[str, list[tuple[str, int]]] | None:
    """Physical GPU → (job id, uid) of the other jobs mapped to it; None when a map is unreadable."""
    from gpuslurm.state.jobmap import list_job_ids, read_map

    out: dict[str, list[tuple[str, int]]] = {}
    try:
        for other in list_job_ids(jobs_dir):
            if other == job_id:
                continue
            jmap = read_map(other, jobs_dir)
            if jmap is None:  # the job ended meanwhile
                continue
            for d in jmap.devices:
                out.setdefault(d.parent_uuid or d.uuid, []).append((jmap.job_id, jmap.uid))
    except (GpuslurmError, OSError) as exc:
        log.warning(f"cannot read the other jobs' maps, treating the GPUs as shared: {exc}")
        return None
    return out


def _stop_mps(job: HookJob, gpus: Sequence[Mapping[str, Any]], cfg: Config, log: HookLog) -> list[Fault]:
    """Stop the job's MPS daemon if the prolog started one. One that survives SIGKILL is stuck in
    the driver: a ``leftover_processes`` fault, so the node drains before the next job."""
    from gpuslurm.isolate.mps import stop_mps, stuck_report
    from gpuslurm.isolate.mps_request import job_gid

    job_id, uid = job.job_id, job.uid
    try:
        try:
            gid: int | None = job_gid(job.gid, uid)
        except GpuslurmError:
            gid = None  # needed only when the daemon's own record is unreadable
        done = stop_mps(job_id, run_dir=cfg.paths.run_dir, mps_control=cfg.paths.mps_control,
                        timeout=cfg.hooks.command_timeout_s, grace=cfg.epilog.kill_grace_s,
                        uid=uid, gid=gid)
    except Exception as exc:  # an unsafe run_dir, a bug: logged; the next prolog starts afresh
        log.error(f"cannot stop the job's MPS daemon: {exc}")
        return []
    if done is None:
        return []
    for line in done.errors + ((f"MPS quit failed: {done.quit_error}",) if done.quit_error else ()):
        log.warning(line)
    if done.killed:
        log.warning(f"MPS daemon did not quit: signalled pid(s) {', '.join(map(str, done.killed))}")
    stuck = stuck_report(done, gpus)
    if stuck is None:
        log.info("stopped the job's MPS daemon")
        return []
    from gpuslurm.policy.health import Fault

    log.error(stuck[1])
    action = cfg.health.leftover_processes.action
    return [Fault(stuck[0], "leftover_processes", action, stuck[1])] if action != "off" else []


def _drain(job: HookJob, scheduler: Scheduler, drains: list[Fault], labels: dict[str, str],
           log: HookLog) -> int:
    from gpuslurm.policy.health import drain_reason

    reason = drain_reason(drains, labels)
    name = job.node_name
    try:
        scheduler.drain_node(name, reason)
    except GpuslurmError as exc:
        log.error(f"could not drain {name} ({exc}); failing so that {job.scheduler} drains it: {reason}")
        return EXIT_UNHEALTHY
    log.error(f"drained {name}: {reason}")
    return 0


def record_refusal(job: HookJob, now: float, gpus: list[dict[str, Any]], faults: Sequence[Fault],
                   cfg: Config, log: HookLog) -> None:
    """The summary of a job the prolog refused for health faults: its GPUs and the faults.

    The epilog that follows keeps these faults in the summary it writes (bookkeeping: a failure is
    logged, never fatal).
    """
    if not cfg.epilog.summary:
        return
    summary = {"version": SUMMARY_VERSION, "job_id": job.job_id, "user": job.user, "uid": job.uid,
               "node": job.node_name, "scheduler": job.scheduler, "start": None, "end": now, "gpus": gpus,
               "refused_by": "prolog", "monitor": "no monitor data", "leftovers": [],
               "faults": [f._asdict() for f in faults]}
    try:
        path = write_summary(summary, _summary_dir(cfg), job.job_id)
        log.info(f"wrote {path}")
    except Exception as exc:
        log.error(f"cannot write the job summary: {exc}")


def _prolog_faults(job_id: str, cfg: Config, log: HookLog) -> list[dict[str, Any]]:
    """The faults the prolog refused this job for (from its summary), or none."""
    from gpuslurm.jobid import check_job_id
    from gpuslurm.safedir import read_private_file

    try:
        raw = read_private_file(_summary_dir(cfg), f"{check_job_id(job_id)}-summary.json", 1 << 20)
        prior = json.loads(raw) if raw is not None else None
    except (GpuslurmError, OSError, ValueError) as exc:
        log.warning(f"cannot read the prolog's summary: {exc}")
        return []
    if not isinstance(prior, dict) or prior.get("refused_by") != "prolog":
        return []
    faults = prior.get("faults")
    return [f for f in faults if isinstance(f, dict)] if isinstance(faults, list) else []


def _summary_dir(cfg: Config) -> str:
    return os.path.join(cfg.paths.state_dir, "jobs")


def write_summary(summary: Mapping[str, Any], directory: str, job_id: str) -> str:
    """Write ``<directory>/<jobid>-summary.json`` atomically (0600, no symlinks followed)."""
    from gpuslurm.safedir import write_private_file
    from gpuslurm.state.jobmap import check_job_id

    final = f"{check_job_id(job_id)}-summary.json"
    payload = (json.dumps(summary, sort_keys=True, indent=1) + "\n").encode()
    return write_private_file(directory, final, payload)
