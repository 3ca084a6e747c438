"""Slurm's hooks' entry point: ``python -I -S -c 'import sys; sys.path += [...]; from
gpuslurm.slurm.entry import run; run()' prolog`` (the list: gpuslurm's and its dependencies'
directories, written by ``gpuslurm install``).

The installed executables (``prolog/``, ``epilog/``) start here rather than at ``gpuslurm prolog``:
the click command line costs as much as everything else the prolog does on a replayed node, and
``python -m`` adds ``runpy``. The hooks read everything from the environment and take no options,
so there is nothing for click to parse. ``gpuslurm prolog`` (and ``python -m gpuslurm.slurm``)
run the same functions and return the same exit codes.

:func:`run` also leaves without the interpreter's teardown, which frees every module one by one
and costs a prolog about a tenth of its time; it runs the ``atexit`` handlers (NVML's shutdown)
and flushes the standard streams first, so nothing a hook does is lost.
"""

from __future__ import annotations

import os
import sys

from gpuslurm.errors import EXIT_USAGE, exit_now
from gpuslurm.tuples import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Sequence
    from typing import NoReturn

# hook name -> its --help line
HOOKS = {"prolog": "gpuslurm prolog: Slurm Prolog, as root before each job: health gate, device "
                   "isolation, MPS, job map",
         "epilog": "gpuslurm epilog: Slurm Epilog, as root after each job: leftovers, release check, "
                   "cleanup, summary",
         "task-prolog": "gpuslurm task-prolog: Slurm TaskProlog, as the job's user: CUDA and NUMA "
                        "hints as export lines"}


def main(argv: Sequence[str] | None = None) -> int:
    """Run the hook ``argv[0]`` names (default ``sys.argv[1:]``); its exit code for Slurm."""
    args = list(sys.argv[1:] if argv is None else argv)
    hook = args[0] if args else ""
    if hook in HOOKS and args[1:] in (["-h"], ["--help"]):
        print(_summary(hook))
        return 0
    if hook not in HOOKS or len(args) != 1:
        print(f"usage: python -m gpuslurm.slurm {{{','.join(HOOKS)}}} (the hooks take no options)",
              file=sys.stderr)
        return EXIT_USAGE
    if hook == "prolog":
        from gpuslurm.slurm.hooks import run_prolog

        return run_prolog(os.environ)
    if hook == "epilog":
        from gpuslurm.slurm.hooks import run_epilog

        return run_epilog(os.environ)
    from gpuslurm.slurm.hooks import run_task_prolog

    return run_task_prolog(os.environ, sys.stdout)


def run() -> NoReturn:
    """:func:`main` on ``sys.argv``, then exit with its code (see the module docstring)."""
    exit_now(main())


def _summary(hook: str) -> str:
    return HOOKS[hook]
