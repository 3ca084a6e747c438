"""Adapters to Slurm's own programs and files."""
