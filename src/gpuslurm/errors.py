"""One exception tree for gpuslurm; ``cli`` turns each class into an exit code."""

from __future__ import annotations

import os  # loaded by every interpreter at start; pathlib is not, and the hooks avoid it

TYPE_CHECKING = False  # mypy takes any name TYPE_CHECKING as true; only typing's costs an import
if TYPE_CHECKING:
    from typing import NoReturn

# Exit codes, assigned in one place (cli.main maps exceptions onto these).
EXIT_OK = 0
EXIT_CHECK_FAILED = 1  # a check ran and found mismatches (gres-conf --check)
EXIT_BAD_INPUT = 2  # the user's input (a file, an option) is wrong
EXIT_HARDWARE = 3  # the hardware or its driver could not be read
EXIT_EXTERNAL = 4  # an external command failed or timed out
# The reader of our output went away (`gpuslurm discover | head -1`): no message, and the status
# a shell reports for a writer SIGPIPE killed (128 + 13), as for `yes | head -1`.
EXIT_CLOSED_PIPE = 141


# Every character str.splitlines() breaks a line at: a message holding one would reach a log (or a
# reader counting lines) as two messages, the second of which the input's author chose.
_LINE_BREAKS = {ord(c): " " for c in "\n\r\v\f\x1c\x1d\x1e\x85\u2028\u2029"}


def one_line(message: str) -> str:
    """``message`` with every line separator (``\\n``, CR, U+2028, ...) turned into a space."""
    return message.translate(_LINE_BREAKS)


def exit_now(code: int, run_atexit: bool = True) -> NoReturn:
    """Exit a hook process with ``code`` at once: the atexit functions run (unless not
    ``run_atexit``; what interpreter shutdown would run first), stdout and stderr flushed, and no
    interpreter shutdown after (``os._exit``)."""
    import sys

    if run_atexit:
        import atexit

        atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # closed by the caller: nothing more can be said
            pass
    os._exit(code)


class GpuslurmError(Exception):
    """Base of every error gpuslurm raises on purpose."""

    exit_code = EXIT_HARDWARE

    def __str__(self) -> str:
        # one line whatever a message quotes: an input's text can hold U+2028 and the like
        return one_line(self.args[0]) if self.args else self.__class__.__name__


class InputError(GpuslurmError):
    """Bad input from the user: a file that does not parse, an option out of range.

    ``source`` names the file (or option) at fault so that the one-line message can point at it.
    """

    exit_code = EXIT_BAD_INPUT

    def __init__(self, message: str, source: str | os.PathLike[str] | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.source = str(source) if source is not None else None

    def __str__(self) -> str:
        return one_line(f"{self.source}: {self.message}" if self.source else self.message)


class CaptureError(InputError):
    """A capture bundle (or one of its files) is missing a fact or does not parse."""


class HardwareError(GpuslurmError):
    """The live hardware could not be read (NVML absent or failing, sysfs unreadable)."""

    exit_code = EXIT_HARDWARE


class NotSupported(HardwareError):  # noqa: N818 - mirrors NVML's own name for the condition
    """The driver says the query is not supported on this device: not a failure."""


class CommandError(GpuslurmError):
    """An external command failed, timed out or is missing."""

    exit_code = EXIT_EXTERNAL

    def __init__(self, message: str, argv: tuple[str, ...] = (), returncode: int | None = None,
                 stderr: str = "") -> None:
        super().__init__(message)
        self.argv = argv
        self.returncode = returncode
        self.stderr = stderr


class CheckMismatchError(GpuslurmError):
    """A check found differences; the report was already printed."""

    exit_code = EXIT_CHECK_FAILED
