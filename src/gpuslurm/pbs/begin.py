"""execjob_begin: choose the job's physical GPUs (PBS counts ``ngpus``; it assigns none), then run
the neutral prolog steps on them.

Where the GPUs may come from. PBS gives a job ``ngpus`` on vnodes (``exec_vnode``). On a vnode
gpuslurm made (``HOST[n]``, one per NUMA node: exechost_startup or ``gpuslurm pbs-conf``) the job's
GPUs are chosen among that NUMA node's GPUs, so they sit beside the CPUs PBS gave it there; on any
other vnode (the natural vnode, a site's own layout) among all the host's GPUs. When PBS splits a
chunk across vnodes of one host (``(h[0]:ngpus=1+h[1]:ngpus=1)``), each vnode's count is chosen on
its own NUMA node: PBS accounts the GPUs per vnode, so taking two from one would leave the next
job on the other vnode one GPU short. A vnode's ``nmigs`` (MIG instances) come from the MIG
devices of its NUMA node's GPUs in MIG mode (:func:`choose_migs`), its ``ngpus`` from whole GPUs.

Which. The placement engine (:mod:`gpuslurm.place.engine`, as ``gpuslurm pick``) among the
candidates that are healthy, not in the out-of-service record (``gpuslurm gpu offline``:
:mod:`gpuslurm.pbs.gpu_out`) and not named by another job's map under the jobs directory: the
strongest weakest link first (NVLink pairs before PCIe), then fewest NUMA nodes, most NVLinks,
lowest index. The jobs directory is locked from reading the maps until this job's map is written,
so two jobs starting at once never take one GPU.

Failure policy (the hook turns every non-accepting answer into a rejected begin; PBS then puts
the job back in the queue and the scheduler places it again):

* a health fault with action ``drain`` on a GPU of the job's vnodes: that vnode goes offline with
  a comment naming the GPU, its device file and the fault; the job is refused here;
* a fault with action ``gpu_out``: only that GPU goes out of service (the record; its NUMA vnode
  publishes one GPU fewer) and the job gets others, or is refused when too few are left; the last
  GPU in service is treated as ``drain``;
* more GPUs asked on a vnode than its NUMA node has, or fewer free than asked (GPUs held by maps of
  jobs PBS no longer runs here): the job is refused with a message naming the vnode, the GPUs and
  the jobs holding them; nothing is written;
* anything else (a broken config, an unreadable node, a cgroup that cannot be made) raises, and
  the hook refuses the job: it fails closed, like the Slurm prolog.
"""

from __future__ import annotations

import os
import time

from gpuslurm.tuples import TYPE_CHECKING, NamedTuple

if TYPE_CHECKING:
    from gpuslurm.config import Config
    from gpuslurm.hooks.log import HookLog
    from gpuslurm.hw.model.node import Gpu, Node
    from gpuslurm.hw.source import HardwareSource
    from gpuslurm.pbs.answer import HookAnswer, PbsHookActions
    from gpuslurm.policy.health import Fault
    from gpuslurm.state.job import HookJob, JobDevice


class VnodeGpus(NamedTuple):
    """One vnode's share of the job: how many GPUs (and MIG instances), and the GPUs (and MIG
    devices) they may be chosen from."""

    vnode: str
    ngpus: int
    numa_node: int | None  # None: the vnode is not one of gpuslurm's NUMA vnodes
    candidates: tuple[Gpu, ...]
    nmigs: int = 0
    migs: tuple[JobDevice, ...] = ()  # MIG devices of GPUs in MIG mode, bus order


class JobRefusedError(Exception):
    """The job cannot start here for a reason its owner and the admin should read."""


def vnode_numa(vnode: str, hostname: str) -> int | None:
    """n for gpuslurm's NUMA vnode ``HOST[n]`` of this host; None for any other vnode."""
    if vnode.startswith(hostname + "[") and vnode.endswith("]"):
        n = vnode[len(hostname) + 1:-1]
        if n.isascii() and n.isdigit() and len(n) <= 4:
            return int(n)
    return None


def vnode_shares(node: Node, hostname: str, shares: tuple[tuple[str, int] | tuple[str, int, int], ...]
                 ) -> list[VnodeGpus]:
    """Each vnode's counts (``(vnode, ngpus[, nmigs])``) with its candidates: whole GPUs
    (``ngpus``) and the MIG devices of GPUs in MIG mode (``nmigs``), of the vnode's NUMA node."""
    from gpuslurm.gres.pbs_vnodes import gpu_numa, is_whole
    from gpuslurm.state.job import node_devices

    cpu_numa = {cpu.os_id: cpu.numa_node for cpu in node.cpus}
    whole = [g for g in node.gpus if is_whole(g)]
    migs = [d for d in node_devices(node) if d.mig is not None]
    out = []
    for share in shares:
        vnode, ngpus, nmigs = share[0], share[1], (share[2] if len(share) > 2 else 0)
        numa = vnode_numa(vnode, hostname)
        cands = tuple(g for g in whole if numa is None or gpu_numa(g, cpu_numa) == numa)
        mine = tuple(d for d in migs if numa is None or gpu_numa(d.gpu, cpu_numa) == numa)
        out.append(VnodeGpus(vnode, ngpus, numa, cands, nmigs, mine))
    return out


def check_counts(wants: list[VnodeGpus]) -> None:
    """JobRefusedError when a vnode is asked for more GPUs (or MIG instances) than it holds at all."""
    for w in wants:
        if w.nmigs > len(w.migs):
            where = f"NUMA node {w.numa_node}" if w.numa_node is not None else "this host"
            raise JobRefusedError(
                f"the job asks for {w.nmigs} MIG instance(s) on vnode {w.vnode}, but {where} has "
                f"{len(w.migs)}: its resources_available.nmigs is wrong (gpuslurm's exechost_startup "
                f"or `gpuslurm pbs-conf` set it from the node; was MIG changed since?)")
        if w.ngpus > len(w.candidates):
            where = f"NUMA node {w.numa_node}" if w.numa_node is not None else "this host"
            have = ", ".join(f"index {g.index} ({g.device_file})" for g in w.candidates) or "none"
            raise JobRefusedError(
                f"the job asks for {w.ngpus} GPU(s) on vnode {w.vnode}, but {where} has "
                f"{len(w.candidates)} ({have}): its resources_available.ngpus is wrong "
                f"(gpuslurm's exechost_startup or `gpuslurm pbs-conf` set it from the node)")


def health_offline(wants: list[VnodeGpus], cfg: Config, source: HardwareSource, log: HookLog,
                   answer: HookAnswer, node: Node, hostname: str) -> list[Fault]:
    """The health gate of execjob_begin, before the choice: check every candidate in service and act
    as :func:`gpuslurm.policy.fault_response.respond` decides, as the Slurm prolog does: a GPU to
    take out is recorded out of service (``choose`` then passes it by; its NUMA vnode publishes
    ``ngpus`` without it), a GPU to drain for takes its vnode offline.

    Returns the faults of the vnodes taken offline (empty: every candidate left in service may be
    given). A GPU out of service already is never given, so its fault takes no vnode offline."""
    from gpuslurm.policy.health import drain_reason, gate_enabled, gate_faults, gpu_label

    if not gate_enabled(cfg.health):
        return []
    from gpuslurm.hw.health import read_health
    from gpuslurm.policy.fault_response import LAST_IN_SERVICE, respond
    from gpuslurm.state.out_of_service import OutOfServiceStore, take_out_decided

    store = OutOfServiceStore(cfg.paths.state_dir)
    out = store.read()  # a corrupt record raises: no GPU is given blindly
    gone = {u.lower() for u in out}
    gpus = list({g.uuid: g for w in wants for g in _physical(w) if g.uuid.lower() not in gone}.values())
    health = read_health(gpus, source)
    faults = [f for g in gpus for f in gate_faults(health[g.uuid], cfg.health)]
    labels = {g.uuid: gpu_label(g.index, g.minor, g.uuid) for g in node.gpus}
    for w in wants:
        mine = {g.uuid for g in _physical(w)}
        for f in faults:
            if f.uuid in mine:
                log.warning(f"GPU {labels[f.uuid]} on vnode {w.vnode}: {f.check}: {f.message} "
                            f"(action {f.action})")
    if not faults:
        return []
    response = take_out_decided(store, lambda now_out: respond(faults, node.gpus, now_out), "prolog",
                                now=time.time(), out=out)
    for d in response.take_outs:
        log.error(f"GPU {labels[d.uuid]} taken out of service: {d.reason}")
    taken = {d.uuid for d in response.take_outs}
    if taken:  # the monitor or `health --act` adds the comment (pbs.gpu_out)
        from gpuslurm.pbs.gpu_out import startup_counts

        counts = startup_counts(node, hostname, store.read())
        for w in wants:
            if w.numa_node is not None and taken & {g.uuid for g in _physical(w)}:
                answer.vnodes[w.vnode] = {"ngpus": counts[w.vnode]}
    drains = []
    for w in wants:
        mine = {g.uuid for g in _physical(w)}
        bad = [f for d in response.drains if d.uuid in mine for f in d.acted]
        for d in response.drains:
            if d.uuid in mine and d.why == LAST_IN_SERVICE:
                log.error(f"GPU {labels[d.uuid]} is the last GPU in service: taking vnode {w.vnode} "
                          "offline instead")
        if bad:
            answer.take_offline(w.vnode, drain_reason(bad, labels))
            drains += bad
    return drains


def _physical(w: VnodeGpus) -> tuple[Gpu, ...]:
    """The physical GPUs a vnode's share may come from: its whole GPUs, its MIG devices' parents
    (a MIG device shares its GPU's health) when it asks for MIG instances."""
    parents: tuple[Gpu, ...] = tuple(d.gpu for d in w.migs) if w.nmigs else ()
    return tuple({g.uuid: g for g in (*w.candidates, *parents)}.values())


def held_gpus(jobs_dir: str, job_id: str) -> dict[str, str]:
    """Physical GPU UUID, and MIG device UUID (lower case) → the other job whose map holds it."""
    from gpuslurm.state.jobmap import list_maps

    held = {}
    for jmap in list_maps(jobs_dir):
        if jmap.job_id == job_id:  # this job's own map, from a begin PBS ran before a requeue
            continue
        for d in jmap.devices:
            held[(d.parent_uuid or d.uuid).lower()] = jmap.job_id
            held[d.uuid.lower()] = jmap.job_id
    return held


def choose_migs(wants: list[VnodeGpus], held: dict[str, str],
                out: dict[str, str] | None = None) -> list[tuple[str, tuple[JobDevice, ...]]]:
    """The MIG devices of each vnode's ``nmigs``: the free ones (no other job's map names them, their
    GPU not ``out`` of service) of the GPU with the fewest free first (so whole GPUs' worth of
    instances stay free together), then bus order; JobRefusedError when too few are free."""
    gone = out or {}
    result = []
    taken: set[str] = set()
    for w in wants:
        if not w.nmigs:
            continue
        free = [d for d in w.migs if d.uuid.lower() not in held and d.uuid.lower() not in taken
                and d.gpu.uuid.lower() not in gone]
        if len(free) < w.nmigs:
            busy = sorted({held[d.uuid.lower()] for d in w.migs if d.uuid.lower() in held})
            raise JobRefusedError(
                f"vnode {w.vnode} has {len(free)} free MIG instance(s) of {len(w.migs)}, the job asks "
                f"for {w.nmigs}; the others are held by the map(s) of job(s) {', '.join(busy) or 'none'}")
        per_gpu: dict[str, int] = {}
        for d in free:
            per_gpu[d.gpu.uuid] = per_gpu.get(d.gpu.uuid, 0) + 1
        free.sort(key=lambda d: (per_gpu[d.gpu.uuid] < w.nmigs, per_gpu[d.gpu.uuid], d.gres_index or 0))
        picked = tuple(free[:w.nmigs])
        taken.update(d.uuid.lower() for d in picked)
        result.append((w.vnode, picked))
    return result


def out_of_service(cfg: Config) -> dict[str, str]:
    """Lower-case UUID → why, for every GPU ``gpuslurm gpu offline`` (or a fault) took out of
    service; a corrupt record raises (InputError): no GPU is given blindly."""
    from gpuslurm.state.out_of_service import OutOfServiceStore

    return {u.lower(): f"out of service: {r.reason}" for u, r in
            OutOfServiceStore(cfg.paths.state_dir).read().items()}


def choose(node: Node, wants: list[VnodeGpus], held: dict[str, str],
           out: dict[str, str] | None = None) -> list[tuple[str, tuple[Gpu, ...]]]:
    """The GPUs of each vnode's share, best-connected first, never one ``out`` names (lower-case
    UUID → why it is out of service); JobRefusedError when too few are free."""
    from gpuslurm.place.engine import place
    from gpuslurm.place.request import Request

    out = out or {}
    taken: set[str] = set()
    chosen = []
    for w in wants:
        if not w.ngpus:  # MIG instances only (choose_migs)
            continue
        free = [g for g in w.candidates if g.uuid.lower() not in held and g.uuid.lower() not in taken
                and g.uuid.lower() not in out]
        if len(free) < w.ngpus:
            busy = sorted({held[g.uuid.lower()] for g in w.candidates if g.uuid.lower() in held})
            gone = [f"index {g.index} ({out[g.uuid.lower()]})" for g in w.candidates if g.uuid.lower() in out]
            raise JobRefusedError(
                f"vnode {w.vnode} has {len(free)} free GPU(s) of {len(w.candidates)}, the job asks for "
                f"{w.ngpus}; the others are held by the map(s) of job(s) {', '.join(busy) or 'none'} "
                + (f"or out of service: {'; '.join(gone)} " if gone else "")
                + "(a map of a job PBS no longer runs here is stale: remove it from the jobs directory)")
        placement = place(node, Request(w.ngpus), allowed=[g.uuid for g in free])
        if placement.chosen is None:  # cannot happen for whole, healthy GPUs; said plainly if it does
            raise JobRefusedError(f"no set of {w.ngpus} GPU(s) on vnode {w.vnode} satisfies the placement")
        gpus = tuple(d.gpu for d in placement.chosen.devices)
        taken.update(g.uuid.lower() for g in gpus)
        chosen.append((w.vnode, gpus))
    return chosen


def run_begin(job: HookJob, shares: tuple[tuple[str, int] | tuple[str, int, int], ...], cfg: Config,
              source: HardwareSource, log: HookLog, answer: HookAnswer, actions: PbsHookActions,
              isolate: bool) -> int:
    """Choose the job's GPUs on this host and run the neutral prolog's steps around the choice; the
    exit code (the caller rejects the job on anything but 0 or an answer already refusing it).

    The steps: :func:`gpuslurm.hooks.prolog.prepare`; the health gate on every candidate
    (:func:`health_offline`); the choice among those in service, free and healthy (:func:`choose`,
    :func:`choose_migs`); :func:`gpuslurm.hooks.prolog.start_on_devices` on the chosen."""
    from gpuslurm.hooks.prolog import deny_all_devices, job_start, prepare, start_on_devices

    if not shares:  # no GPUs here: the prolog still denies it every GPU
        return job_start(job, actions, cfg, log, source, isolate=isolate)
    prepare(job, actions, cfg, log, isolate)
    from gpuslurm.hooks.cache import placement_node
    from gpuslurm.state.job import GpuClaim, resolve_devices
    from gpuslurm.state.jobmap import lock_maps

    node = placement_node(source, cfg.paths.run_dir, log.warning)  # links: the placement ranks sets by them
    wants = vnode_shares(node, job.node_name, shares)
    try:
        check_counts(wants)
        drains = health_offline(wants, cfg, source, log, answer, node, job.node_name)
        if drains:
            _record_refusal(job, wants, drains, cfg, log)
            raise JobRefusedError(f"a GPU of vnode(s) {', '.join(answer.offline)} is unhealthy, taken "
                                  f"offline: {'; '.join(answer.offline.values())}")
        lock = lock_maps(cfg.paths.jobs_dir)
        try:
            held = held_gpus(cfg.paths.jobs_dir, job.job_id)
            out = out_of_service(cfg)
            chosen = choose(node, wants, held, out)
            migs = choose_migs(wants, held, out)
            uuids = tuple(g.uuid for _, gpus in chosen for g in gpus) + tuple(
                d.uuid for _, devices in migs for d in devices)
            for vnode, gpus in chosen:
                log.info(f"vnode {vnode}: GPU(s) " + ", ".join(f"index {g.index} ({g.device_file}, "
                                                              f"{g.uuid})" for g in gpus))
            for vnode, devices in migs:
                log.info(f"vnode {vnode}: MIG instance(s) " + ", ".join(
                    f"{d.uuid} (GPU index {d.gpu.index}, {d.gpu.device_file})" for d in devices))
            claim = GpuClaim(uuids=uuids, source="execjob_begin's choice")
            job = job._replace(gpus=claim)
            if not (devices := resolve_devices(claim, node)):  # nothing chosen: every GPU denied
                return deny_all_devices(job, actions, cfg, log, lambda: node, isolate)
            return start_on_devices(job, actions, cfg, log, node, devices, isolate)
        finally:
            os.close(lock)
    except JobRefusedError as exc:
        answer.reject(f"gpuslurm: {exc}")
        log.error(f"refused: {exc}")
        return 0


def _record_refusal(job: HookJob, wants: list[VnodeGpus], drains: list[Fault], cfg: Config,
                    log: HookLog) -> None:
    from gpuslurm.hooks.epilog import record_refusal

    bad = {f.uuid for f in drains}
    gpus = [{"uuid": g.uuid, "minor": g.minor, "gres_index": None, "parent_uuid": None}
            for w in wants for g in _physical(w) if g.uuid in bad]
    record_refusal(job, time.time(), gpus, drains, cfg, log)

