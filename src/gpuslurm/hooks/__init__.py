"""The scheduler-neutral job steps: job start (prolog), job end (epilog), task start.

Adapters (:mod:`gpuslurm.slurm.hooks`, :mod:`gpuslurm.pbs`) turn their scheduler's hook input
into a :class:`gpuslurm.state.job.HookJob` and call these steps with their scheduler's actions;
nothing here imports an adapter. Hooks run on every job, so modules here keep their imports light
and import heavier ones (NVML, click, jinja2) only inside the step that needs them.
"""
