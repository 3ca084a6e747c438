"""``gpuslurm prolog|epilog|task-prolog``: the Slurm hooks, as thin click commands.

Each reads everything from the environment Slurm gives it, and does its own error handling
(so that errors reach syslog and the exit code follows the hook's failure policy, see
:mod:`gpuslurm.hooks.prolog`); the commands only pass the exit code on.
"""

from __future__ import annotations

import os
import sys

import click

from gpuslurm.slurm.hooks import run_epilog, run_prolog, run_task_prolog


@click.command("prolog")
@click.pass_context
def prolog(ctx: click.Context) -> None:
    """Slurm Prolog (root): check the job's GPUs' health, drain on faults, write the job map."""
    ctx.exit(run_prolog(os.environ))


@click.command("epilog")
@click.pass_context
def epilog(ctx: click.Context) -> None:
    """Slurm Epilog (root): check the GPUs were released, remove the job map, write a summary."""
    ctx.exit(run_epilog(os.environ))


@click.command("task-prolog")
@click.pass_context
def task_prolog(ctx: click.Context) -> None:
    """Slurm TaskProlog (the job's user): print CUDA_VISIBLE_DEVICES and NUMA hints as export lines."""
    ctx.exit(run_task_prolog(os.environ, sys.stdout))


