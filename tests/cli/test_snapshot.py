"""The behaviour snapshot (issue 20's "behaviour is unchanged"): each case of tests/helpers/snapshot_record.py
run now and compared with tests/cli/snapshot/golden.json, recorded from main at fbadb85.

The cases:
- every command and subcommand with ``--json`` (and its table, where it prints one), ``gres-conf``,
  ``node-conf``, ``pbs-conf`` and ``pick`` in each format, on each built-in bundle and each real
  capture of ../shared/fixtures/real (the multi-command captures imported with ``capture
  import``, each ``nvidia-smi -q -x`` file as a bundle of that one file);
- ``pick`` inside a Slurm or PBS job (its GPUs from the environment), under a load scenario, and
  a copy of dgx-h100 with faults (Xid 79, a hot GPU, ECC errors) through health, status, pick and
  the monitor;
- commands that change state, then the command that reads it (steps joined with ``&&``);
- bad input: a missing bundle, a file where a directory belongs, an unknown built-in, bad values;
- every command's ``--help`` (test_every_command_is_in_the_snapshot keeps that list the CLI's);
- the Slurm prolog, epilog and task prolog, the PBS hook's begin and end and the classic
  prologue/epilogue in the fault cases (a healthy job; an Xid on a job's GPU, as a drain, as
  ``gpu_out`` with GPUs left and on the last GPU in service; an invalid job id; a missing map; a
  planted bug), with what they asked of Slurm (tests/hooks' stand-in scontrol records it), the
  job map, the out-of-service record and the summary's faults.

A command records its exit code, its stdout (parsed where it is JSON) and the first line of its
stderr; a hook its exit code and every line it logged. Commands run in-process (``main()`` as
the ``gpuslurm`` executable calls it: pick without click) in an environment of their own, the
Slurm hooks as ``gpuslurm <hook>`` and the PBS hook through gpuslurm.pbs.entry.main; a sample of
each also runs as its own process (the executable, the installed hooks' ``python -I -c`` entry
points) and must give the same record.

Normalised, because they differ between runs and checkouts and are no behaviour of gpuslurm:
- paths: this checkout (``<repo>``), the real captures (``<real>``), the temporary directory of
  the bundles made from them (``<bundles>``) and of each case (``<site>``);
- the run's own clock: a date-time in text, or epoch seconds in JSON, within two days of now
  becomes ``<time>`` (the monitor's sample time, a throttle's start and end, a GPU's time out of
  service); times from recorded data (the report's window) stay;
- the machine's name: the config names the node (``[monitor] node_name = "snapnode"``) and
  every bundle names its own, so nothing reads this host's name; the terminal width and time
  zone are fixed (COLUMNS=100, TZ=UTC).
Nothing else is normalised: a changed message, key, order or exit code fails its case.

Left out, as not deterministic: ``demo`` (its day ends at the wall clock, and how much of a
violation falls in the window moves with it; tests/demo checks it), the table of an active
throttle (its LEFT column counts down), and commands that need a live node or cluster (``watch``,
``install``, ``mig apply``, ``throttle auto``/``sync``, ``capture DIR``): only their --help is here.

On purpose, a change is recorded again: ``python -m tests.helpers.snapshot_record --write``.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import click
import pytest
from tests.helpers.snapshot_hooks import HOOK_CASES, hooks_as_processes
from tests.helpers.snapshot_record import (
    COMMANDS,
    GOLDEN,
    REAL,
    RERECORD,
    World,
    all_cases,
    diff,
    load_golden,
    record_case,
    world,
)

from gpuslurm.cli.main import cli

pytestmark = pytest.mark.skipif(not REAL.is_dir(), reason=f"{REAL} is absent: the snapshot needs it")


@pytest.fixture(scope="module")
def bundles() -> Iterator[World]:
    with world() as w:
        yield w


@pytest.fixture(scope="module")
def golden() -> dict[str, Any]:
    return load_golden()


def test_the_golden_file_has_every_case_and_no_other(golden: dict[str, Any]) -> None:
    missing = sorted(set(all_cases()) - set(golden))
    extra = sorted(set(golden) - set(all_cases()))
    assert not missing and not extra, (f"{GOLDEN.name}: cases not recorded {missing}, recorded but gone "
                                       f"{extra}; {RERECORD}")


def _commands(group: click.Group, ctx: click.Context, path: tuple[str, ...]) -> Iterator[tuple[str, ...]]:
    yield path
    for name in group.list_commands(ctx):
        command = group.get_command(ctx, name)
        assert command is not None
        if isinstance(command, click.Group):
            yield from _commands(command, ctx, (*path, name))
        else:
            yield (*path, name)


def test_every_command_is_in_the_snapshot() -> None:
    """A new command (or one gone) is a change of behaviour too: add its cases to record.py."""
    with click.Context(cli) as ctx:
        assert sorted(_commands(cli, ctx, ())) == sorted(COMMANDS)


@pytest.mark.parametrize("case", all_cases() if REAL.is_dir() else [])
def test_behaviour_is_as_recorded(case: str, bundles: World, golden: dict[str, Any]) -> None:
    if case in HOOK_CASES and os.geteuid() != 0:
        pytest.skip("the hooks' job maps and state directories are root's")
    got = record_case(case, bundles)
    want = golden.get(case)
    if got != want:
        pytest.fail(f"behaviour changed: {case}\n{diff(case, want, got)}\n{RERECORD}", pytrace=False)


# In a process of its own, as a user runs it: the in-process runs above see what it prints.
AS_A_PROCESS = ("discover --from dgx-h100 --json", "topo --from l40s-4x",
                "pick 2 --from a100-mig --mig 1g.10gb --format json", "pick 9 --from dgx-h100 --format json",
                "gres-conf --from a100-mig --slurm-version 22.05", "discover --from {SITE}/a-file --json",
                "health --from faulty/dgx-h100 --json", "no-such-command", "mig --help",
                "SLURM_JOB_ID=42 SLURM_JOB_GPUS=0-99999999999 pick 1 --from dgx-h100")


@pytest.mark.parametrize("case", AS_A_PROCESS)
def test_the_executable_does_what_the_in_process_run_recorded(case: str, bundles: World,
                                                                golden: dict[str, Any]) -> None:
    got = record_case(case, bundles, process=True)
    assert got == golden[case], diff(case, golden[case], got)


# The hooks as slurmd and pbs_mom start them, each a process of its own.
HOOKS_AS_PROCESSES = (
    "slurm prolog: healthy job", "slurm prolog: Xid 79 on a job's GPU (drain)",
    "slurm prolog: Xid 79, gpu_out, not the last GPU", "slurm prolog: invalid job id",
    "slurm prolog: corrupt out-of-service record", "slurm epilog: leftover processes and memory",
    "slurm task-prolog: healthy job", "pbs execjob_begin: healthy job",
    "pbs execjob_begin: Xid 79 on the vnode's GPU", "pbs execjob_begin: not JSON",
)


@pytest.mark.skipif(os.geteuid() != 0, reason="the hooks' job maps and state directories are root's")
@pytest.mark.parametrize("case", HOOKS_AS_PROCESSES)
def test_the_installed_hooks_do_what_the_in_process_run_recorded(case: str, bundles: World,
                                                                  golden: dict[str, Any]) -> None:
    with hooks_as_processes():
        got = record_case(case, bundles)
    assert got == golden[case], diff(case, golden[case], got)
