"""Slurm prolog, epilog and task-prolog steps.

Hooks run on every job, so modules here keep their imports light and import heavier ones
(NVML, click, jinja2) only inside the step that needs them.
"""
