"""``python -m gpuslurm.slurm prolog|epilog|task-prolog``: Slurm's hooks without the click CLI."""

from gpuslurm.slurm.entry import run

run()
