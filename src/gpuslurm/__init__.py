"""gpuslurm: GPUs on Slurm clusters, well placed, isolated, watched and fairly shared."""

__version__ = "0.1.0"
