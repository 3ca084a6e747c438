"""``gpuslurm install``: the click command over :mod:`gpuslurm.install`."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import NamedTuple

import click

from gpuslurm import install as lib
from gpuslurm import trust
from gpuslurm.config import Config, load_config
from gpuslurm.errors import InputError
from gpuslurm.install import CGROUP_SNIPPET_NAME, DEFAULT_PREFIX
from gpuslurm.pbs import classic_install as classic
from gpuslurm.pbs import install as pbs


def _warn(message: str) -> None:
    click.echo(f"gpuslurm: warning: {message}", err=True)


@click.command()
@click.option("--slurm-etc", type=click.Path(path_type=Path), metavar="DIR",
              help="Slurm's configuration directory (where slurm.conf is); the cgroup.conf snippet "
                   f"goes there as {CGROUP_SNIPPET_NAME}. Required unless --pbs.")
@click.option("--pbs", is_flag=True,
              help="Install into PBS instead: import gpuslurm's hooks with qmgr (on the PBS server "
                   "host, as a PBS manager); see docs/pbs.md.")
@click.option("--classic", is_flag=True,
              help="With --pbs: write the classic mom_priv/prologue and epilogue scripts on this "
                   "execution host instead of importing hooks (sites without hooks; docs/pbs.md).")
@click.option("--pbs-home", "pbs_home", metavar="DIR", default="",
              help="With --pbs --classic: PBS_HOME (default: PBS_MOM_HOME or PBS_HOME from pbs.conf).")
@click.option("--qmgr", "qmgr", metavar="PATH", default="",
              help="With --pbs: the qmgr to run (default: $PBS_EXEC/bin/qmgr from pbs.conf).")
@click.option("--prefix", type=click.Path(path_type=Path), default=DEFAULT_PREFIX, show_default=True,
              metavar="DIR", help="Where the hook executables and the install manifest go.")
@click.option("--python", "python", metavar="PATH", default="",
              help="Interpreter the hooks run (default: the one running this command).")
@click.option("--config", "config", metavar="PATH", default="",
              help="Config file the hooks read, written into them (Slurm passes them no "
                   "GPUSLURM_CONFIG); absolute, root's and not writable by others. "
                   "Default: none written, so the hooks read /etc/gpuslurm/gpuslurm.toml.")
@click.option("--replay", "capture", metavar="DIR", default="", hidden=True,
              help="Test clusters and demos: the hooks replay this capture bundle instead of NVML.")
@click.option("--mps", is_flag=True, help="Print GresTypes=gpu,mps (not on MIG nodes before Slurm 23.02.7).")
@click.option("--health-check", is_flag=True,
              help="Also install the HealthCheckProgram wrapper (`gpuslurm health --act`) and print "
                   "its slurm.conf lines (see docs/health.md).")
@click.option("--c-client", is_flag=True,
              help="Build the prolog's and epilog's client of `gpuslurm hook-server` in C with /usr/bin/cc "
                   "(no Python start when the server runs; see docs/hooks.md).")
@click.option("--dry-run", is_flag=True, help="Show what would change (with diffs); change nothing.")
@click.option("--force", is_flag=True, help="Overwrite files an admin edited since the last install.")
def install(slurm_etc: Path | None, pbs: bool, classic: bool, pbs_home: str, qmgr: str, prefix: Path,
            python: str, config: str, capture: str, mps: bool, health_check: bool, c_client: bool,
            dry_run: bool, force: bool) -> None:
    """Install the prolog, epilog and task-prolog hooks and print the slurm.conf lines they need
    (--pbs: import gpuslurm's PBS hooks with qmgr instead).

    Safe to run again: unchanged files are left alone, and a file edited since gpuslurm wrote it
    is refused unless --force.
    """
    if (classic or pbs_home) and not pbs:
        raise click.UsageError("--classic and --pbs-home go with --pbs")
    if pbs:
        if slurm_etc is not None:
            raise click.UsageError("--pbs installs into PBS: leave out --slurm-etc")
        if c_client:
            raise click.UsageError("--c-client is the client of Slurm's hook server; PBS runs its "
                                   "hooks inside pbs_mom")
        if health_check:
            raise click.UsageError("--health-check is slurmd's HealthCheckProgram; on PBS run "
                                   "`gpuslurm health --act` from cron or the monitor (docs/health.md)")
        if classic:
            install_pbs_classic(pbs_home, python, config, capture, dry_run, force)
        else:
            install_pbs(qmgr, python, config, capture, dry_run)
        return
    if slurm_etc is None:
        raise click.UsageError("Missing option '--slurm-etc' (or give --pbs)")
    plan = lib.plan_install(slurm_etc, prefix, python, force, config, capture, health_check, c_client)
    # job_submit.lua reads gpuslurm-throttle beside itself, or the configured throttle file
    for throttle_file in dict.fromkeys((plan.slurm_etc / "gpuslurm-throttle",
                                        Path(load_config().throttle.file))):
        trust.check_throttle_file(throttle_file)
    trust.check_interpreter(plan.python)
    here = str(Path(lib.__file__).resolve().parent)
    there = lib.probe_interpreter(plan.python)
    if there != here:
        _warn(f"the hooks will run the gpuslurm in {there}, not this one ({here})")

    for line in lib.describe(plan, dry_run):
        click.echo(line)
    if dry_run:
        for action in plan.actions:
            if action.verb in ("create", "update", "overwrite"):
                click.echo(lib.diff(action), nl=False)
    elif plan.changes:
        lib.apply_plan(plan)

    wanted = lib.slurm_conf_lines(plan.prefix, mps)
    if health_check:
        wanted += lib.health_check_lines(plan.prefix)
    click.echo("\n# slurm.conf lines for gpuslurm (every node and the controller; then "
               "`scontrol reconfigure`):")
    for line in wanted:
        click.echo(line)
    snippet = plan.slurm_etc / CGROUP_SNIPPET_NAME
    click.echo(f"# and copy the settings in {snippet} into {plan.slurm_etc / 'cgroup.conf'}")
    conf = plan.slurm_etc / "slurm.conf"
    if conf.is_file():
        notes = lib.conf_status(wanted, lib.parse_slurm_conf(conf.read_text(errors="replace")))
        click.echo(f"# {conf}: " + ("; ".join(notes) if notes else "already has all of these"))

    for path in (Path(plan.python), plan.hook_path("TaskProlog")):
        blocked = lib.unreachable_by_users(path)
        if blocked is not None:
            _warn(f"{blocked} is not reachable by other users, so the TaskProlog (which runs as "
                  f"the job's user) cannot start {path}")


class _Sources(NamedTuple):
    python: str  # the interpreter
    config: Config | None  # the config read, None without one
    package: str  # the gpuslurm package directory the interpreter imports


def _checked_sources(python: str, config: str, capture: str, runs: str = "scripts") -> _Sources:
    """The interpreter (default: this one), config and bundle checked as every install checks
    them (root's, not writable by others; the config must parse). ``runs`` names what will run
    the interpreter, for the warning when it imports another gpuslurm."""
    python = python or os.path.abspath(sys.executable)
    if not os.path.isabs(python) or "\n" in python:
        raise InputError("the interpreter must be an absolute path", python)
    trust.check_interpreter(python)
    here = str(Path(lib.__file__).resolve().parent)
    there = lib.probe_interpreter(python)
    if there != here:
        _warn(f"the {runs} will run the gpuslurm in {there}, not this one ({here})")
    cfg = None
    if config:
        trust.check_config_path(config)
        cfg = load_config(config)  # a config that does not hold would fail every job: refuse it now
    if capture:
        if not os.path.isabs(capture) or "\n" in capture or not os.path.isdir(capture):
            raise InputError("--replay must name an existing directory by its absolute path", capture)
        trust.check_trusted_dir(Path(capture), "a capture bundle")
    return _Sources(python, cfg, there)


def install_pbs_classic(pbs_home: str, python: str, config: str, capture: str, dry_run: bool,
                        force: bool) -> None:
    """Write the classic prologue and epilogue into ``$PBS_HOME/mom_priv`` (see
    :mod:`gpuslurm.pbs.classic_install`)."""
    python = _checked_sources(python, config, capture).python
    mom_priv = os.path.join(pbs_home or classic.pbs_home(), "mom_priv")
    trust.check_trusted_dir(Path(mom_priv), "PBS's mom_priv")
    steps = classic.plan_scripts(mom_priv, python, config, capture, force)
    for line in classic.describe(steps, mom_priv, dry_run):
        click.echo(line)
    if not dry_run:
        classic.apply_scripts(steps)
    click.echo(classic.WHAT_THEY_DO)


def install_pbs(qmgr: str, python: str, config: str, capture: str, dry_run: bool) -> None:
    """Import every hook of :data:`gpuslurm.pbs.install.HOOK_FILES` into PBS (see that module)."""
    run = pbs.qmgr_runner(qmgr or pbs.default_qmgr())
    python, cfg, there = _checked_sources(python, config, capture, runs="hooks")
    settings = (cfg or load_config()).throttle
    steps = pbs.plan_install(run, python, config, capture, package_dir=os.path.dirname(there),
                             throttle_file=settings.file, contact=settings.contact)
    for line in pbs.describe(steps, dry_run):
        click.echo(line)
    if steps and not dry_run:
        pbs.apply_steps(run, steps)
    click.echo(pbs.SCHEDULER_NOTE)
