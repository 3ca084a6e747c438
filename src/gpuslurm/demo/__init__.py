"""``gpuslurm demo``: a scripted day on a replayed DGX H100, through the real monitor."""
