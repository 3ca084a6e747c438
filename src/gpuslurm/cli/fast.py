"""The ``gpuslurm`` executable: ``pick`` starts without click, every other command goes to click.

``gpuslurm pick`` runs in front of job steps and in scripts; click's import alone costs about as
much as the interpreter's start, so pick parses its own arguments (:mod:`gpuslurm.cli.pick_cmd`)
and this dispatcher imports :mod:`gpuslurm.cli.main` only for the other commands.
"""

from __future__ import annotations

import sys


def main() -> int:
    """Console-script entry point (``[project.scripts]``)."""
    if sys.argv[1:2] == ["pick"]:
        from gpuslurm.cli.pick_cmd import main as pick

        return pick(sys.argv[2:])
    from gpuslurm.cli.main import main as full

    return full()


if __name__ == "__main__":
    sys.exit(main())
