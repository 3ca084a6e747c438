"""``python -m gpuslurm.hooks prolog|epilog|task-prolog``: the hooks without the click CLI."""

from gpuslurm.hooks.entry import run

run()
