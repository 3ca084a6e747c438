"""The node monitor: sample → attribute → detect → store, every interval, without drift.

Each cycle reads every GPU and GPU process once (NVML, or a replayed scenario), attributes the
processes to jobs (:mod:`gpuslurm.watch.attribute`), and writes the cycle to the store in one
transaction, so ``kill -9`` loses at most the cycle being written. Nothing a cycle reads can stop
the loop: a process that exits, an unreadable /proc entry, a lost GPU or a failing NVML call
become :class:`ScanProblem` rows. A cycle the store cannot take (a locked or full disk) is kept
and written with the next one (up to ``MAX_PENDING``), so a passing fault loses nothing.

Cycles start on a fixed grid (``t0 + k × interval``): a slow cycle delays the next one, but the
grid does not slide, and a cycle that overruns whole intervals skips their slots rather than
running back to back. SIGTERM and SIGINT let the cycle under way finish, then the loop returns.
"""

from __future__ import annotations

import math
import os
import signal
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from types import FrameType
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from gpuslurm.errors import GpuslurmError
from gpuslurm.samples import Allocation, Cycle, Reading, ScanProblem, Violation
from gpuslurm.watch.attribute import Attributor
from gpuslurm.watch.comments import PROBLEM_KIND, CommentUpdater

if TYPE_CHECKING:
    from gpuslurm.hw.model.node import Node
    from gpuslurm.hw.source import HardwareSource

MAX_PENDING = 360  # cycles kept while the store refuses writes (an hour at 10 s)
ROLLUP_EVERY_S = 60.0
REPUBLISH_S = 60.0  # an ongoing violation is re-shared this often, with its grown duration
SSHARE_PROBLEM = "sshare-error"


class Sampler(Protocol):
    def read(self, now: float) -> Reading: ...

    def close(self) -> None: ...


class Detector(Protocol):
    def feed(self, cycle: Cycle) -> Sequence[Violation]: ...


@runtime_checkable
class ShareAware(Protocol):
    """A detector that takes Slurm's shares (``policy.detect.Detector``)."""

    def set_shares(self, shares: Mapping[str, float] | None) -> None: ...


class QuotaFeed(Protocol):
    """Slurm's quotas per user when freshly read (``slurm.sshare.ShareCache``): ``(quotas or None,
    why a due read failed or None)``."""

    def poll(self, now: float) -> tuple[Mapping[str, float] | None, str | None]: ...


class CycleStore(Protocol):
    def write_cycle(self, cycle: Cycle, violations: Sequence[Violation] = ()) -> None: ...

    def rollup(self, now: float, raw_window_s: float) -> None: ...


class Monitor:
    """One node's monitor; :meth:`cycle` runs one cycle, :func:`run` repeats it."""

    def __init__(self, sampler: Sampler, attributor: Attributor, store: CycleStore, node: str, *,
                 raw_window_s: float = 86400.0, detector: Detector | None = None,
                 publish: Callable[[Sequence[Violation]], None] | None = None,
                 observe: Callable[[Cycle, Sequence[Violation]], None] | None = None,
                 comments: CommentUpdater | None = None,
                 act: Callable[[Cycle, Sequence[Violation]], Sequence[ScanProblem]] | None = None,
                 quotas: QuotaFeed | None = None,
                 health: Callable[[float], Sequence[ScanProblem]] | None = None,
                 jobfiles: Callable[[Cycle], None] | None = None,
                 warn: Callable[[str], None] = lambda message: None,
                 clock: Callable[[], float] = time.time) -> None:
        self.sampler = sampler
        self.attributor = attributor
        self.store = store
        self.node = node
        self.raw_window_s = raw_window_s
        self.detector = detector
        self.publish = publish
        self.observe = observe  # e.g. the Prometheus exporter's state: sees every cycle, stored or not
        self.comments = comments  # keeps the jobs' AdminComment current (watch.comments)
        self.act = act  # the configured actions (watch.act.Actor.act)
        self.quotas = quotas  # Slurm's shares for the detector ([detect.share] quota_source = "slurm")
        self.health = health  # live faults through the health policy (watch.health.HealthWatch.check)
        self.jobfiles = jobfiles  # each job's figures for its owner (watch.jobfiles.JobFiles)
        self._carried: tuple[ScanProblem, ...] = ()  # problems met after the last cycle was stored
        self.warn = warn
        self.clock = clock
        self.pending: list[tuple[Cycle, tuple[Violation, ...]]] = []
        self._rolled_at: float | None = None
        self._published: dict[tuple[Any, ...], float] = {}

    def cycle(self) -> Cycle:
        """Sample, attribute, detect and store one cycle; returns it (stored or pending)."""
        now = self.clock()
        try:
            reading = self.sampler.read(now)
        except GpuslurmError as exc:  # NVML itself failed: an empty cycle that says why
            reading = Reading((), (), (("nvml-error", "nvml", str(exc)),))
        gpus = reading.devices
        procs, allocations, found = self.attributor.attribute(now, reading.processes)
        problems = tuple(ScanProblem(now, k, s, d) for k, s, d in reading.problems) + found + self._carried
        problems += self._quotas(now)
        self._carried = ()
        cycle = Cycle(now, self.node, gpus, procs, allocations, problems)
        violations: tuple[Violation, ...] = ()
        if self.detector is not None:
            try:
                violations = tuple(self.detector.feed(cycle))
            except Exception as exc:  # a bug in one rule must not stop sampling and storing
                self.warn(f"detectors failed this cycle: {type(exc).__name__}: {exc}")
        self._store(cycle, violations)
        self._publish(now, violations)
        if self.observe is not None:
            try:
                self.observe(cycle, violations)
            except Exception as exc:  # the exporter is a view: it never stops the monitor
                self.warn(f"exporter failed this cycle: {type(exc).__name__}: {exc}")
        self._rollup(now)
        self._jobfiles(cycle)
        self._comment(now, allocations)
        self._act(cycle, violations)
        self._health(now)
        return cycle

    def _health(self, now: float) -> None:
        """Evaluate the health policy on live faults and act; problems are stored with the next cycle."""
        if self.health is None:
            return
        try:
            found = tuple(self.health(now))
        except Exception as exc:  # a bug in the health check must not stop sampling and storing
            found = (ScanProblem(now, "health", "monitor", f"internal error: {type(exc).__name__}: {exc}"),)
            self.warn(f"health check failed: {found[0].detail}")
        self._carried += found

    def _quotas(self, now: float) -> tuple[ScanProblem, ...]:
        """Give the detector Slurm's shares when a due read brought new ones; a failed read keeps
        the last ones and becomes a problem of this cycle."""
        if self.quotas is None or not isinstance(self.detector, ShareAware):
            return ()
        fresh, why = self.quotas.poll(now)
        if fresh is not None:
            self.detector.set_shares(fresh)
        if why is None:
            return ()
        self.warn(f"cannot read Slurm's shares (the last quotas stay): {why}")
        return (ScanProblem(now, SSHARE_PROBLEM, "sshare", why),)

    def _comment(self, now: float, allocations: tuple[Allocation, ...]) -> None:
        """Update the due jobs' AdminComment, after the store so the figures include this cycle.

        What fails is said on stderr now and stored with the next cycle's problems.
        """
        if self.comments is None:
            return
        try:
            found = self.comments.update(now, allocations)
        except Exception as exc:  # bookkeeping: a bug here must not stop the sampling
            why = f"internal error: {type(exc).__name__}: {exc}"
            self.warn(f"cannot update AdminComments: {why}")
            self._carried = (ScanProblem(now, PROBLEM_KIND, "monitor", why),)
            return
        for p in found:
            self.warn(f"cannot update the AdminComment of job {p.subject}: {p.detail}")
        self._carried = found

    def _act(self, cycle: Cycle, violations: tuple[Violation, ...]) -> None:
        """Log, alert, kill, scancel as configured; failures are stored with the next cycle."""
        if self.act is None:
            return
        try:
            found = tuple(self.act(cycle, violations))
        except Exception as exc:  # the actor reports its own failures; this is a bug in it
            found = (ScanProblem(cycle.ts, "action", "monitor",
                                 f"internal error: {type(exc).__name__}: {exc}"),)
            self.warn(f"actions failed: {found[0].detail}")
        self._carried += found

    def _publish(self, now: float, violations: tuple[Violation, ...]) -> None:
        """Share new violations at once, and ongoing ones again every REPUBLISH_S (their duration)."""
        if self.publish is None:
            return
        due: list[Violation] = []
        seen: dict[tuple[Any, ...], float] = {}
        for v in violations:
            key = (v.kind, v.job_id, v.pid, v.gpu_uuid, v.user, v.start)
            last = self._published.get(key)
            if last is None or now - last >= REPUBLISH_S:
                due.append(v)
                last = now
            seen[key] = last
        self._published = seen  # an ended violation is forgotten
        if not due:
            return
        try:
            self.publish(due)
        except (GpuslurmError, OSError) as exc:
            self.warn(f"cannot publish violations: {exc}")
            for v in due:  # try again next cycle
                self._published.pop((v.kind, v.job_id, v.pid, v.gpu_uuid, v.user, v.start), None)

    def _store(self, cycle: Cycle, violations: tuple[Violation, ...]) -> None:
        self.pending.append((cycle, violations))
        if len(self.pending) > MAX_PENDING:
            dropped = self.pending.pop(0)[0]
            self.warn(f"the store has refused {MAX_PENDING} cycles; dropping the one of {dropped.ts:.0f}")
        while self.pending:
            c, v = self.pending[0]
            try:
                self.store.write_cycle(c, v)
            except GpuslurmError as exc:
                self.warn(f"cannot store the cycle ({len(self.pending)} waiting): {exc}")
                return
            self.pending.pop(0)

    def _jobfiles(self, cycle: Cycle) -> None:
        if self.jobfiles is None or self.pending:  # a cycle not stored yet: its figures would lag
            return
        try:
            self.jobfiles(cycle)
        except Exception as exc:  # the users' view of their jobs never stops the monitor
            self.warn(f"cannot write the jobs' figures: {type(exc).__name__}: {exc}")

    def _rollup(self, now: float) -> None:
        if self._rolled_at is not None and now - self._rolled_at < ROLLUP_EVERY_S:
            return
        self._rolled_at = now
        try:
            self.store.rollup(now, self.raw_window_s)
        except GpuslurmError as exc:
            self.warn(f"cannot roll up old samples: {exc}")


def next_slot(t0: float, interval: float, now: float) -> float:
    """The first grid time ``t0 + k × interval`` strictly after ``now`` (k ≥ 1)."""
    k = max(1, math.floor((now - t0) / interval) + 1)
    return t0 + k * interval


def run(monitor: Monitor, interval: float, *, once: bool = False,
        stop: threading.Event | None = None, on_cycle: Callable[[Cycle], None] | None = None,
        monotonic: Callable[[], float] = time.monotonic) -> int:
    """Run cycles every ``interval`` seconds until ``stop`` is set (or once); the cycle count."""
    stop = stop or threading.Event()
    t0 = monotonic()
    count = 0
    while True:
        cycle = monitor.cycle()
        count += 1
        if on_cycle is not None:
            on_cycle(cycle)
        if once or stop.is_set():
            return count
        now = monotonic()
        if stop.wait(next_slot(t0, interval, now) - now):
            return count


def stop_on_signals(stop: threading.Event) -> Callable[[], None]:
    """Make SIGTERM and SIGINT set ``stop``; returns a function that restores the old handlers.

    The handler itself does nothing: a Python handler runs in the main thread between two
    bytecodes, and one that called ``stop.set()`` while the main thread held the Event's lock (in
    ``wait()`` before it sleeps, or after it wakes) waited for itself, and the monitor hung for good
    on a SIGTERM. The signal's number reaches a pipe from the interpreter's C-level handler
    (``signal.set_wakeup_fd``) at once, and a thread of its own sets ``stop``: the main thread's
    wait ends even when the signal came just before it began to sleep.
    """
    def handler(signum: int, frame: FrameType | None) -> None:
        pass  # the wakeup fd carries the signal; see the relay below

    wanted = {int(signal.SIGTERM), int(signal.SIGINT)}
    # the handlers first: off the main thread this raises ValueError before anything is made
    old: dict[int, Any] = {sig: signal.signal(sig, handler) for sig in (signal.SIGTERM, signal.SIGINT)}
    read_fd, write_fd = os.pipe()

    def relay() -> None:
        while data := os.read(read_fd, 512):  # empty: the write end was closed by restore()
            if wanted.intersection(data):
                stop.set()

    try:
        os.set_blocking(write_fd, False)
        old_wakeup = signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)
    except BaseException:
        for sig, previous in old.items():
            signal.signal(sig, previous)
        os.close(read_fd)
        os.close(write_fd)
        raise
    relayer = threading.Thread(target=relay, name="gpuslurm-signals", daemon=True)
    relayer.start()

    def restore() -> None:
        for sig, previous in old.items():
            signal.signal(sig, previous)
        signal.set_wakeup_fd(old_wakeup)
        os.close(write_fd)
        relayer.join(5)
        if not relayer.is_alive():  # else its read still holds the number: never reuse it under it
            os.close(read_fd)

    return restore


def open_sampler(source: HardwareSource) -> tuple[Sampler, Node]:
    """The sampler for ``source`` (a bundle: replay; else live NVML), and the Node.

    Replay starts from the state the bundle's capture recorded and takes its activity from the
    scenario (see :mod:`gpuslurm.hw.formats.scenario`); a scenario
    naming an unknown GPU is a CaptureError here, before the first cycle.
    """
    node = source.node()
    if source.bundle is not None:  # each source's readers (the XML parser, or NVML) only for it
        from pathlib import Path

        from gpuslurm.hw.replay.bundle import read_captured_state
        from gpuslurm.hw.replay.scenario import ScenarioSampler, scenario_path

        bundle = Path(source.bundle)
        return ScenarioSampler(node, scenario_path(bundle), read_captured_state(bundle, node)), node
    from gpuslurm.hw.live.nvml_sampler import NvmlSampler

    return NvmlSampler(), node


def cycle_dict(cycle: Cycle) -> dict[str, Any]:
    """``cycle`` as plain JSON-ready data."""
    return {"ts": cycle.ts, "node": cycle.node,
            "gpus": [g._asdict() for g in cycle.gpus],
            "procs": [p._asdict() for p in cycle.procs],
            "allocations": [a._asdict() for a in cycle.allocations],
            "problems": [p._asdict() for p in cycle.problems]}
