"""One wiring of the monitor's parts, shared by ``gpuslurm monitor``, the live view and the demo."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from gpuslurm.errors import one_line
from gpuslurm.policy.detect import Detector, resume
from gpuslurm.samples import Allocation
from gpuslurm.state.store import Store, StoreError
from gpuslurm.watch.attribute import Attributor
from gpuslurm.watch.monitor import CycleStore, Monitor, Sampler

if TYPE_CHECKING:
    from gpuslurm.hw.model.node import Node
    from gpuslurm.state.scheduler import Scheduler


def build_monitor(sampler: Sampler, store: CycleStore, node_name: str, *, jobs_dir: str,
                  node: Node | None = None, scheduler: Scheduler | None = None,
                  squeue_interval_s: float = 60.0, proc_root: str | None = None,
                  attributor_type: type[Attributor] = Attributor,
                  clock: Callable[[], float] = time.time, **parts: Any) -> Monitor:
    """A :class:`Monitor` over ``sampler``, attributing processes through the job maps in
    ``jobs_dir`` and the ``scheduler``'s cgroup layout and, when the ``node`` is given too, its job
    list as the fallback (unless its command is missing: ``warn``, one of ``parts``, says so).

    ``parts`` are the Monitor's optional parts (detector, publish, observe, comments, act,
    quotas, warn, raw_window_s). A detector given with a :class:`Store` first replays the store's
    recent cycles (its ``history_s``, at most ``HISTORY_CYCLES``) and adopts the starts of the
    findings stored then, so a finding that goes on across a restart stays one finding.
    """
    detector = parts.get("detector")
    if isinstance(detector, Detector) and isinstance(store, Store):
        resume_detector(detector, store, clock())
    squeue: Callable[[], tuple[Allocation, ...]] | None = None
    sessions: Callable[[], Mapping[int, str]] | None = None
    why_unlisted = scheduler.why_no_job_list() if scheduler is not None and node is not None else None
    if why_unlisted is not None and (warn := parts.get("warn")) is not None:
        warn(why_unlisted)  # the maps alone, then: said once
    if scheduler is not None and node is not None and why_unlisted is None:
        sched, known = scheduler, node

        def squeue() -> tuple[Allocation, ...]:
            return sched.node_allocations(node_name, known)

        if sched.sessions() is not None:  # PBS: session ids of its jobs' shells
            def sessions() -> Mapping[int, str]:
                return sched.sessions() or {}

    extra: dict[str, Any] = {} if sessions is None else {"sessions": sessions}
    if scheduler is not None:
        extra["job_of_cgroup"] = scheduler.job_of_cgroup  # its cgroup layout
        extra["sluid_job"] = scheduler.job_of_sluid  # Slurm 26.05: a SLUID cgroup's job without a map
    if proc_root is None:
        attributor = attributor_type(jobs_dir=jobs_dir, squeue=squeue, squeue_interval_s=squeue_interval_s,
                                     **extra)
    else:
        attributor = attributor_type(jobs_dir=jobs_dir, proc_root=proc_root, squeue=squeue,
                                     squeue_interval_s=squeue_interval_s, **extra)
    return Monitor(sampler, attributor, store, node_name, clock=clock, **parts)


HISTORY_CYCLES = 20_000  # at most this many stored cycles are replayed at start (bounded start-up)


def resume_detector(detector: Detector, store: Store, now: float) -> None:
    """Replay ``store``'s recent cycles into ``detector`` and adopt its current findings' starts."""
    try:
        cycles = store.recent_cycles(detector.history_s, HISTORY_CYCLES)
        if not cycles:
            return
        last = cycles[-1].ts
        stored = store.violations(last, now + 1.0)  # the findings current at the newest stored cycle
    except StoreError as exc:
        # a damaged row in the history costs the detectors their memory, not the monitor its start
        sys.stderr.write(f"gpuslurm monitor: starting without the stored history: {one_line(str(exc))}\n")
        return
    resume(detector, cycles, stored)
