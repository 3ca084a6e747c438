"""Where ``gpuslurm status`` and ``watch`` get a node's present: the monitor's own code path.

Each snapshot runs one monitor cycle (the sampler the monitor uses, NVML or a replayed bundle,
the same attribution through ``/proc`` and the job maps, the same detectors) with nothing stored,
then adds what the node monitor knows: its store's violations current now, which carry the
history (an idle allocation needs half an hour of samples) a single look does not have. The
detectors of a :class:`LiveView` keep their memory between snapshots, so ``watch`` finds idle
jobs by itself after a while even with no monitor running.

GPU health comes from the health gate's checks (NVML or the bundle's ``health.json``), less
the leftover-process check, which is meant for a GPU between jobs.
"""

from __future__ import annotations

import os
import socket
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from gpuslurm.config import Config
from gpuslurm.errors import GpuslurmError, InputError
from gpuslurm.hw.health import read_health
from gpuslurm.hw.model.health import SLOWDOWNS
from gpuslurm.policy.detect import Detector
from gpuslurm.policy.health import gate_faults
from gpuslurm.samples import Cycle, ScanProblem, Violation
from gpuslurm.state.store import Store, default_path
from gpuslurm.watch.build import build_monitor
from gpuslurm.watch.monitor import open_sampler
from gpuslurm.watch.view import Snapshot, build_snapshot

if TYPE_CHECKING:
    from gpuslurm.hw.source import HardwareSource
    from gpuslurm.state.scheduler import Scheduler


class _NoStore:
    """The monitor's store interface, keeping nothing: a view must not write the node's store."""

    def write_cycle(self, cycle: Cycle, violations: Sequence[Violation] = ()) -> None:
        pass

    def rollup(self, now: float, raw_window_s: float) -> None:
        pass


class LiveView:
    """Snapshots of one node read from ``source``; ``db`` the monitor's store."""

    def __init__(self, cfg: Config, source: HardwareSource, db: str | None = None,
                 clock: Callable[[], float] = time.time, scheduler: Scheduler | None = None) -> None:
        self.cfg = cfg
        self.source = source
        self.db = db or cfg.monitor.db or default_path(cfg.paths.state_dir)
        self.clock = clock
        self.warnings: deque[str] = deque(maxlen=20)  # the monitor's complaints, latest only
        self.sampler, self.node = open_sampler(source)
        # a replay is of the captured node (named as gres-conf names it), not of this machine
        self.node_name = self.node.hostname if self.node.source != "nvml" else \
            cfg.monitor.node_name or socket.gethostname().split(".")[0]
        # the scheduler describes the real node, not a replayed one; and only then is it worth its cost
        self.detector = Detector(cfg.detect)
        self.monitor = build_monitor(
            self.sampler, _NoStore(), self.node_name, jobs_dir=cfg.paths.jobs_dir, node=self.node,
            scheduler=scheduler if self.node.source == "nvml" else None,
            squeue_interval_s=cfg.monitor.squeue_interval_s, detector=self.detector,
            warn=self.warnings.append, clock=clock)
        self.attributor = self.monitor.attributor

    def snapshot(self) -> Snapshot:
        """One cycle, the stored findings, health: a snapshot of the node now."""
        cycle = self.monitor.cycle()
        live = self.detector.violations
        stored, findings, problem = self._stored(cycle.ts)
        if problem is not None:
            cycle = cycle._replace(problems=(*cycle.problems, problem))
        # GPUs NVML lost before this process opened it: no handle, no UUID, no row, but never unsaid
        lost = tuple(ScanProblem(cycle.ts, "gpu-lost", f"index:{i}", "NVML answers GPU_IS_LOST: no "
                                 "UUID, no readings (`gpuslurm health` reports it)")
                     for i in self.node.lost)
        if lost:
            cycle = cycle._replace(problems=(*lost, *cycle.problems))  # first: never cut off
        violations = _merge(stored, live)
        return build_snapshot(self.node, cycle, violations, faults=self._faults(), source=self._what(),
                              findings=findings)

    def close(self) -> None:
        self.sampler.close()

    def _what(self) -> str:
        what = self.node.source or self.source.describe().removeprefix("replay of ")
        return "NVML" if self.node.source == "nvml" else f"replay of {what.removeprefix('replay:')}"

    def _stored(self, now: float) -> tuple[list[Violation], str, ScanProblem | None]:
        """The violations the monitor's store holds as current, where the view's came from, and
        why the store could not be read (if it could not)."""
        mine = "this view's detectors"
        if not os.path.exists(self.db):
            return [], mine, None
        # a finding's end moves with every cycle that still sees it: recent means current
        recent = now - 3 * self.cfg.monitor.interval_s - 5
        try:
            with Store.open(self.db, readonly=True, timeout_s=1.0) as store:
                found = [v for v in store.violations(recent, now) if v.node == self.node_name]
        except GpuslurmError as exc:
            detail = exc.message if isinstance(exc, InputError) else str(exc)
            return [], f"{mine} (monitor store unreadable)", ScanProblem(now, "store-unreadable", self.db,
                                                                         detail)
        return found, f"monitor store + {mine}", None

    def _faults(self) -> dict[str, list[str]]:
        try:
            health = read_health(self.node.gpus, self.source, captured=True)
        except GpuslurmError as exc:
            return {g.uuid: [f"health unknown: {exc}"] for g in self.node.gpus}
        out: dict[str, list[str]] = {}
        for uuid, h in health.items():
            found = [f.message for f in gate_faults(h._replace(processes=None), self.cfg.health)]
            # not a gate fault (the GPU works), but what makes it slow is worth seeing
            if slowed := [e for e in h.clock_events or () if e in SLOWDOWNS]:
                found.append(f"clocks slowed: {', '.join(slowed)}")
            if h.lost or h.error is not None:
                out[uuid] = ["lost", *found]
            elif found:
                out[uuid] = found
        return out


def _merge(stored: Sequence[Violation], live: Sequence[Violation]) -> list[Violation]:
    """Stored and live findings, one per (kind, job, PID, device): the stored one has the history."""
    out: dict[tuple[Any, ...], Violation] = {}
    for v in (*live, *stored):
        out[(v.kind, v.job_id, v.pid, v.gpu_uuid)] = v
    return list(out.values())
