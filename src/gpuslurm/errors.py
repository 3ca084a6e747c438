"""One exception tree for gpuslurm, its exit codes, and the one policy every entry point (the CLI,
each Slurm and PBS hook) uses to turn an exception into an exit code and a one-line message."""

from __future__ import annotations

TYPE_CHECKING = False  # mypy takes any name TYPE_CHECKING as true; only typing's costs an import
if TYPE_CHECKING:
    import os
    from collections.abc import Callable
    from typing import NoReturn

# Exit codes, defined here and nowhere else (docs/exit-codes.md lists them). Plain ints, not an
# IntEnum: every hook imports this module, and enum (with functools) costs a PBS hook ~3.5 ms.
EXIT_OK = 0
EXIT_CHECK_FAILED = 1  # a check ran and found mismatches (gres-conf --check, gpu health)
EXIT_UNHEALTHY = 1  # a hook: a health fault took the node (or a GPU) out of service
EXIT_BAD_INPUT = 2  # the user's input (a file, an option, a hook's arguments) is wrong
EXIT_USAGE = EXIT_BAD_INPUT  # a usage error: what click returns, so every entry point agrees
EXIT_HARDWARE = 3  # the hardware or its driver could not be read
EXIT_PBS_REFUSED = 3  # PBS classic prologue: a GPU fault; never 1, on which pbs_mom deletes the job
EXIT_NOT_ISOLATED = 3  # task prolog: the task could not join its devices cgroup, the task is refused
EXIT_EXTERNAL = 4  # an external command failed or timed out
EXIT_UNSATISFIED = 5  # pick: nothing on the node satisfies the request now
EXIT_WAIT_TIMEOUT = 6  # pick --wait gave up after --timeout
EXIT_INTERNAL = 70  # EX_SOFTWARE (sysexits.h): a bug in gpuslurm; a hook's gate fails closed
EXIT_INTERRUPTED = 130  # Ctrl-C (128 + SIGINT), as shells report it
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
    import os
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


def describe(exc: Exception) -> tuple[int, str]:
    """The exit code and one-line message for ``exc`` reaching an entry point: a GpuslurmError's
    own code and text; anything else is a bug, EXIT_INTERNAL."""
    if isinstance(exc, GpuslurmError):
        return exc.exit_code, str(exc)
    return EXIT_INTERNAL, one_line(f"internal error: {type(exc).__name__}: {exc}")


def run_entry(step: Callable[[], int], say: Callable[[str], object], *, bug_hint: str = "",
              reraise_bugs: bool = False, let_through: tuple[type[Exception], ...] = ()) -> int:
    """The one entry-point error policy: ``step()``'s exit code, or the exception's (:func:`describe`)
    with its message given to ``say`` (the CLI's stderr, a hook's log). A bug's message gets
    ``bug_hint``; ``reraise_bugs`` (GPUSLURM_DEBUG) raises it instead, and ``let_through`` are raised
    as they are (BrokenPipeError for the CLI's closed-pipe exit). BaseException (KeyboardInterrupt,
    SystemExit) is the caller's."""
    try:
        return step()
    except let_through:
        raise
    except Exception as exc:
        bug = not isinstance(exc, GpuslurmError)
        if bug and reraise_bugs:
            raise
        code, message = describe(exc)
        say(message + bug_hint if bug else message)
        return code
