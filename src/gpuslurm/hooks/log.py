"""What every job hook shares, whatever the scheduler: its log and its error policy (the exit codes
and the policy are :mod:`gpuslurm.errors`, which the CLI uses too)."""

from __future__ import annotations

import sys

from gpuslurm.errors import one_line, run_entry
from gpuslurm.tuples import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import TextIO


class JobFaultError(Exception):
    """A failure the job's user caused or controls (its comment or constraints, its environment,
    its own limits): the hook fails that job and exits 0, so the node stays up."""


class HookLog:
    """One-line messages to stderr (the scheduler's daemon keeps them in its log) and to syslog."""

    def __init__(self, hook: str, stream: TextIO | None = None, use_syslog: bool = True) -> None:
        self.hook = hook
        self.stream = stream if stream is not None else sys.stderr
        self.use_syslog = use_syslog
        self.job_id: str | None = None
        self.lines: list[str] = []

    def info(self, message: str) -> None:
        self._emit(6, message)  # LOG_INFO

    def warning(self, message: str) -> None:
        self._emit(4, message)  # LOG_WARNING

    def error(self, message: str) -> None:
        self._emit(3, message)  # LOG_ERR

    def _emit(self, level: int, message: str) -> None:
        job = f" job {self.job_id}" if self.job_id else ""
        line = one_line(f"gpuslurm {self.hook}{job}: {message}")
        self.lines.append(line)
        try:
            print(line, file=self.stream, flush=True)
        except (OSError, ValueError):
            pass  # a closed stderr must not turn a healthy job into a failed hook
        if self.use_syslog:
            try:
                import syslog

                syslog.openlog("gpuslurm", syslog.LOG_PID, syslog.LOG_DAEMON)
                syslog.syslog(level, line)
            except OSError:
                pass


def guarded(log: HookLog, step: Callable[[], int]) -> int:
    """Run a hook's ``step`` under :func:`gpuslurm.errors.run_entry`, the message to ``log``: an
    error becomes its exit code, a bug EXIT_INTERNAL (fail closed: the job must not start on an
    unchecked GPU)."""
    return run_entry(step, log.error)
