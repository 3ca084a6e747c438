"""Which actions the monitor takes for the violations current now, given what it already did (pure).

No clock and no I/O: ``now`` is the cycle's timestamp. The state is a few counters per violation
key, held while the violation lasts and forgotten in the cycle it ends, so it stays bounded by the
violations present. A monitor that restarts starts from nothing: a violation it still sees is new
again (logged and alerted once more, warnings counted from zero), which errs on the side of not
cancelling a job early.

Destructive steps (``kill``, ``scancel``) carry ``dry_run``; the executor only says what it would
do then. Exempt users and root are decided here by name; the executor checks the process's real
uid again before any signal.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any, NamedTuple

from gpuslurm.config import ActConfig
from gpuslurm.samples import Violation

EPS = 1e-6


class Step(NamedTuple):
    """One thing to do about one violation (or, for ``warn`` and ``scancel``, one idle job)."""

    action: str  # "log", "alert", "kill", "warn", "scancel"
    violation: Violation
    event: str = ""  # log: "new", "ongoing" or "ended"; warn: "2/3"
    dry_run: bool = False
    notify_user: bool = False  # also mail the violation's user


def violation_key(v: Violation) -> tuple[Any, ...]:
    """What names one violation across cycles (the monitor's publishing key too)."""
    return (v.kind, v.job_id, v.pid, v.gpu_uuid, v.user, v.start)


class _Seen:
    __slots__ = ("alerted", "killed", "logged", "violation")

    def __init__(self, v: Violation) -> None:
        self.violation = v
        self.logged: float | None = None
        self.alerted: float | None = None
        self.killed = False


class _IdleJob:
    __slots__ = ("cancelled", "warned", "warnings")

    def __init__(self) -> None:
        self.warnings = 0
        self.warned: float | None = None
        self.cancelled = False


class Planner:
    """Turns each cycle's violations into steps; see the module docstring."""

    def __init__(self, cfg: ActConfig) -> None:
        self.cfg = cfg
        self._seen: dict[tuple[Any, ...], _Seen] = {}
        self._idle_jobs: dict[str, _IdleJob] = {}

    def plan(self, now: float, violations: Iterable[Violation],
             held: Mapping[str, Sequence[str]] | None = None) -> list[Step]:
        """The steps for this cycle. ``held``: job id → the devices it holds on this node.

        An idle job is cancelled only when every device it holds here is idle (``held`` None: the
        devices its idle violations name are taken as all of them).
        """
        steps: list[Step] = []
        seen: dict[tuple[Any, ...], _Seen] = {}
        current = list(dict.fromkeys(violations))
        for v in current:
            key = violation_key(v)
            entry = self._seen.get(key) or _Seen(v)
            entry.violation = v
            seen[key] = entry
            steps += self._per_violation(now, v, entry)
        for key, entry in self._seen.items():
            if key not in seen and self._rule(entry.violation.kind)[0]:
                steps.append(Step("log", entry.violation, "ended"))
        self._seen = seen
        steps += self._idle(now, current, held)
        return steps

    def _rule(self, kind: str) -> tuple[bool, bool, bool]:
        """(log, alert, alert_user) for a violation kind."""
        c = self.cfg
        if kind == "rogue":
            return c.rogue.log, c.rogue.alert, c.rogue.alert_user
        if kind == "idle":  # with scancel on, the job's warnings are its alerts
            return c.idle.log, c.idle.alert and not c.idle.scancel, c.idle.alert_user
        return c.share.log, c.share.alert, c.share.alert_user

    def _per_violation(self, now: float, v: Violation, entry: _Seen) -> list[Step]:
        cfg = self.cfg
        log, alert, alert_user = self._rule(v.kind)
        steps: list[Step] = []
        if log:
            if entry.logged is None:
                steps.append(Step("log", v, "new"))
                entry.logged = now
            elif now - entry.logged >= cfg.log_interval_s - EPS:
                steps.append(Step("log", v, "ongoing"))
                entry.logged = now
        if alert and (entry.alerted is None or now - entry.alerted >= cfg.alert_interval_s - EPS):
            # counted when decided, not when delivered: a failing channel is not retried each cycle
            steps.append(Step("alert", v, "new" if entry.alerted is None else "ongoing",
                              notify_user=alert_user and v.user is not None))
            entry.alerted = now
        if v.kind == "rogue" and cfg.rogue.kill and not entry.killed and self.may_kill(v):
            steps.append(Step("kill", v, dry_run=cfg.dry_run))
            entry.killed = True  # one attempt per process: a survivor is reported, not hammered
        return steps

    def may_kill(self, v: Violation) -> bool:
        """Whether the rules allow signalling the violation's process at all."""
        if v.pid is None or v.pid <= 1 or v.user is None:
            return False  # an unknown owner cannot be checked against the exemptions
        if v.user in self.cfg.exempt_users:
            return False
        return v.user != "root" or self.cfg.rogue.kill_root

    def _idle(self, now: float, current: Sequence[Violation],
              held: Mapping[str, Sequence[str]] | None) -> list[Step]:
        cfg = self.cfg.idle
        if not cfg.scancel:
            self._idle_jobs = {}
            return []
        idle_devs: dict[str, set[str]] = {}
        first: dict[str, Violation] = {}
        for v in current:
            if v.kind == "idle" and v.job_id is not None:
                idle_devs.setdefault(v.job_id, set()).add(v.gpu_uuid or "")
                first.setdefault(v.job_id, v)
        jobs: dict[str, _IdleJob] = {}
        steps: list[Step] = []
        for job_id, devs in idle_devs.items():
            v = first[job_id]
            if held is not None and not set(held.get(job_id, ())) <= devs:
                continue  # some GPU of the job is busy: not an idle job (and its count restarts)
            if v.user is None or v.user in self.cfg.exempt_users:
                continue
            state = jobs[job_id] = self._idle_jobs.get(job_id) or _IdleJob()
            if state.cancelled:
                continue
            due = state.warned is None or now - state.warned >= cfg.warning_interval_s - EPS
            if not due:
                continue
            if state.warnings < cfg.warnings:
                state.warnings += 1
                state.warned = now
                steps.append(Step("warn", v, f"{state.warnings}/{cfg.warnings}", self.cfg.dry_run,
                                  notify_user=cfg.alert_user and not self.cfg.dry_run))
            else:
                state.cancelled = True
                state.warned = now
                steps.append(Step("scancel", v, f"after {state.warnings} warning(s)", self.cfg.dry_run,
                                  notify_user=cfg.alert_user and not self.cfg.dry_run))
        self._idle_jobs = jobs  # a job no longer idle is forgotten: its warnings start again
        return steps

    def failed(self, step: Step) -> None:
        """A ``scancel`` that failed is tried again a ``warning_interval_s`` later, if still idle."""
        if step.action == "scancel" and step.violation.job_id in self._idle_jobs:
            self._idle_jobs[step.violation.job_id].cancelled = False

    def __len__(self) -> int:
        return len(self._seen) + len(self._idle_jobs)
