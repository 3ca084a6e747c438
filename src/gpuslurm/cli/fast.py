"""The ``gpuslurm`` executable: ``pick`` starts without click, every other command goes to click.

``gpuslurm pick`` runs in front of job steps and in scripts; click's import alone costs about as
much as the interpreter's start, so pick parses its own arguments (:mod:`gpuslurm.cli.pick_cmd`)
and this dispatcher imports :mod:`gpuslurm.cli.main` only for the other commands.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable

from gpuslurm.errors import EXIT_CLOSED_PIPE


def quiet_on_closed_pipe(run: Callable[[], int]) -> int:
    """``run()``'s exit code, or EXIT_CLOSED_PIPE without a word when stdout's reader is gone.

    Python ignores SIGPIPE, so a write to a closed pipe raises BrokenPipeError: in a command
    (unbuffered output), in our flush below (buffered output, the usual case), or else in the
    interpreter's own flush at exit, which prints "Exception ignored" and exits 120. After the
    error, stdout is pointed at /dev/null so that last flush finds nothing to complain about.
    """
    try:
        code = run()
        sys.stdout.flush()
        return code
    except BrokenPipeError:
        try:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
            os.close(devnull)
        except (OSError, ValueError):
            pass  # no stdout file to redirect: nothing left to flush into a closed pipe either
        return EXIT_CLOSED_PIPE


def _dispatch() -> int:
    if sys.argv[1:2] == ["pick"]:
        from gpuslurm.cli.pick_cmd import main as pick

        return pick(sys.argv[2:])
    from gpuslurm.cli.main import main as full

    return full()


def main() -> int:
    """Console-script entry point (``[project.scripts]``)."""
    return quiet_on_closed_pipe(_dispatch)


if __name__ == "__main__":
    sys.exit(main())
