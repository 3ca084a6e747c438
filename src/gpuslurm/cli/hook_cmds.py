"""``gpuslurm prolog|epilog|task-prolog``: the Slurm hooks, as thin click commands; and
``gpuslurm hook-server``, which runs the prolog and the epilog for the installed executables.

Each reads everything from the environment Slurm gives it, and does its own error handling
(so that errors reach syslog and the exit code follows the hook's failure policy, see
:mod:`gpuslurm.hooks.prolog`); the commands only pass the exit code on.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import click

from gpuslurm.slurm.hooks import run_epilog, run_prolog, run_task_prolog
from gpuslurm.slurm.hookserver import MAX_CHILDREN, serve


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




@click.command("hook-server")
@click.option("--socket", "socket_path", type=click.Path(dir_okay=False, path_type=Path),
              help="where to listen (default: hooks.sock in the config's [paths] run_dir; "
                   "`gpuslurm install` writes the same path into the prolog and the epilog)")
@click.option("--max-children", type=click.IntRange(1, 1024), default=MAX_CHILDREN, show_default=True,
              help="hooks run at once; beyond that a hook runs in its own process, as without the server")
def hook_server(socket_path: Path | None, max_children: int) -> None:
    """Run the node's prolog and epilog for slurmd's hooks from one resident process (root)."""
    from gpuslurm.config import load_config
    from gpuslurm.slurm.hookclient import SOCKET_NAME

    path = socket_path or Path(load_config().paths.run_dir) / SOCKET_NAME
    sys.exit(serve(path, lambda line: click.echo(line, err=True), max_children))
