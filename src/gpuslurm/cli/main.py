"""The ``gpuslurm`` command line: thin click commands over the library.

Every GpuslurmError becomes one line on stderr and the exit code its class carries, in
:func:`main` alone, by :func:`gpuslurm.errors.run_entry`: the policy every hook's entry uses too.
Every ``gpuslurm X`` loads this module, so the commands defined here import their libraries
inside the function; the other commands live in their own modules (``LAZY_COMMANDS``), each
loaded only when its command is asked for, and those import at module level.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import click

from gpuslurm import __version__
from gpuslurm.errors import (
    EXIT_BAD_INPUT,
    EXIT_INTERRUPTED,
    EXIT_OK,
    CheckMismatchError,
    HardwareError,
    InputError,
    one_line,
    run_entry,
)

if TYPE_CHECKING:
    from click.shell_completion import CompletionItem

    from gpuslurm.gres.records import GresOptions
    from gpuslurm.hw.model.node import Node

F = TypeVar("F", bound=Callable[..., Any])

FROM_HELP = ("Replay a capture bundle instead of reading NVML: a directory, or a built-in name "
             "(dgx-h100, l40s-4x, a100-mig). Default: $GPUSLURM_CAPTURE, else the live node.")


def from_option(f: F) -> F:
    return click.option("--from", "source", metavar="DIR|NAME", envvar=None, help=FROM_HELP)(f)


SLURM_VERSION_HELP = ("Write MIG Types as this Slurm release names them (X.Y or X.Y.Z; 23.02.6 and "
                      "later take NVIDIA's profile names). Default: what /usr/sbin/slurmd -V says, "
                      "else 22.05's names.")


def slurm_version_option(f: F) -> F:
    return click.option("--slurm-version", metavar="X.Y[.Z]", help=SLURM_VERSION_HELP)(f)


def json_option(f: F) -> F:
    return click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")(f)


def _load(source: str | None) -> Node:
    from gpuslurm.hw.source import hardware_source

    return hardware_source(source).node()


# Commands that live in their own modules, imported only when used: a prolog run on every job
# should not pay for the installer, nor `gres-conf` for the hooks.
LAZY_COMMANDS = {
    "install": "gpuslurm.cli.install_cmd:install",
    "hogs": "gpuslurm.cli.hogs_cmd:hogs",
    "jobstats": "gpuslurm.cli.jobstats_cmd:jobstats",
    "prolog": "gpuslurm.cli.hook_cmds:prolog",
    "epilog": "gpuslurm.cli.hook_cmds:epilog",
    "task-prolog": "gpuslurm.cli.hook_cmds:task_prolog",
    "hook-server": "gpuslurm.cli.hook_cmds:hook_server",
    "mig": "gpuslurm.cli.mig_cmd:mig",
    "throttle": "gpuslurm.cli.throttle_cmd:throttle",
    "monitor": "gpuslurm.cli.monitor_cmd:monitor",
    "fairshare-report": "gpuslurm.cli.report_cmd:fairshare_report",
    "status": "gpuslurm.cli.status_cmd:status",
    "watch": "gpuslurm.cli.status_cmd:watch",
    "demo": "gpuslurm.cli.demo_cmd:demo",
    "placement": "gpuslurm.cli.placement_cmd:placement",
    "gpu": "gpuslurm.cli.gpu_cmd:gpu",
    "health": "gpuslurm.cli.gpu_cmd:health",
    "man-pages": "gpuslurm.cli.manpages:man_pages",
}

# Each lazy command's one-line help, as its docstring's first paragraph says it: ``gpuslurm --help``
# lists the commands without importing all their modules (which import at module level).
# tests/cli/test_cli.py checks the list against the commands' own help.
LAZY_SHORT_HELP = {
    "install": "Install the prolog, epilog and task-prolog hooks and print the slurm.conf lines they "
               "need (--pbs: import gpuslurm's PBS hooks with qmgr instead).",
    "hogs": "List the current violations: rogue processes, idle allocations, users over their share.",
    "jobstats": "How one job used its GPUs: utilisation, memory, power, energy, idle time, a verdict "
                "and notes.",
    "prolog": "Slurm Prolog (root): check the job's GPUs' health, drain on faults, write the job map.",
    "epilog": "Slurm Epilog (root): check the GPUs were released, remove the job map, write a summary.",
    "task-prolog": "Slurm TaskProlog (the job's user): print CUDA_VISIBLE_DEVICES and NUMA hints as "
                   "export lines.",
    "hook-server": "Run the node's prolog and epilog for slurmd's hooks from one resident process "
                   "(root).",
    "mig": "Show, check and apply a MIG layout (which GPUs get which MIG profiles) on this node.",
    "throttle": "Throttle users' GPU submissions through Slurm's job_submit/lua (see docs/throttle.md).",
    "monitor": "Sample every GPU and GPU process, attribute them to Slurm or PBS jobs, detect hogs, "
               "store it all.",
    "fairshare-report": "Allocated, used and idle GPU-hours per user/account/job/process, shares "
                        "against quotas, violations with evidence, and what to do about them.",
    "status": "Show each GPU with its jobs, users, processes, health and current violations (once).",
    "watch": "Redraw the status view every interval until Ctrl-C (like top, but job-aware).",
    "demo": "Replay a scripted day of jobs (a rogue process and an idle allocation among them) on the "
            "built-in DGX H100 through the monitor, then print the fair-share report and draw its chart.",
    "placement": "For each running GPU job here: are its CPUs on its GPUs' NUMA nodes, and its weakest "
                 "link.",
    "gpu": "Take one GPU out of service and back, and list the GPUs out (see docs/health.md).",
    "health": "Each GPU's health now, every fact and the verdict; exit 1 if any GPU in service is "
              "unhealthy.",
    "man-pages": "Write a man page per command into DIR/man1 (default /usr/local/share/man, where man "
                 "looks), made from each command's --help; then `man gpuslurm-pick`.",
}


class LazyGroup(click.Group):
    """A click group that imports the module of a lazy command only when it is asked for."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*super().list_commands(ctx), *LAZY_COMMANDS})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name in LAZY_COMMANDS and cmd_name not in self.commands:
            import importlib

            module, _, attr = LAZY_COMMANDS[cmd_name].partition(":")
            command = getattr(importlib.import_module(module), attr)
            assert isinstance(command, click.Command)
            self.add_command(command, cmd_name)
        return super().get_command(ctx, cmd_name)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """click's command list, each lazy command's line from LAZY_SHORT_HELP until it is loaded."""
        names = self.list_commands(ctx)
        limit = formatter.width - 6 - max(map(len, names))
        rows = []
        for name in names:
            if name in LAZY_SHORT_HELP and name not in self.commands:
                command: click.Command | None = click.Command(name, help=LAZY_SHORT_HELP[name])
            else:
                command = self.get_command(ctx, name)
            if command is not None and not command.hidden:
                rows.append((name, command.get_short_help_str(limit)))
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)


@click.group(cls=LazyGroup,
             context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, prog_name="gpuslurm")
def cli() -> None:
    """Place, isolate, watch and fairly share GPUs on Slurm clusters."""


@cli.command()
@from_option
@json_option
def discover(source: str | None, as_json: bool) -> None:
    """List every GPU and MIG device: index, minor, UUID, bus id, memory, NUMA node, Slurm cores."""
    from gpuslurm.cli.views import write_discover

    write_discover(_load(source), sys.stdout, as_json)


@cli.command()
@from_option
@json_option
def topo(source: str | None, as_json: bool) -> None:
    """Show the GPU link matrix with CPU affinity as OS CPUs and as Slurm core ranges."""
    from gpuslurm.cli.views import write_topo

    write_topo(_load(source), sys.stdout, as_json)


class _PickCommand(click.Command):
    """``pick`` parses its own arguments (cli/pick_cmd.py); shell completion offers its options."""

    def shell_complete(self, ctx: click.Context, incomplete: str) -> list[CompletionItem]:
        from click.shell_completion import CompletionItem

        from gpuslurm.cli.pick_cmd import OPTION_NAMES

        if not incomplete.startswith("-"):
            return []
        return [CompletionItem(name) for name in OPTION_NAMES if name.startswith(incomplete)]


@cli.command(cls=_PickCommand, add_help_option=False, context_settings={"ignore_unknown_options": True})
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def pick(args: tuple[str, ...]) -> int:
    """Choose N GPUs (or MIG devices) topology first, then load; print env/JSON or run a command.

    See 'gpuslurm pick --help' and docs/pick.md (its own parser: the gpuslurm executable
    starts pick without click).
    """
    from gpuslurm.cli.pick_cmd import main as pick_main

    raise click.exceptions.Exit(pick_main(list(args)))


def _positive(ctx: click.Context, param: click.Parameter, value: int | None) -> int | None:
    if value is not None and value <= 0:
        raise click.BadParameter("must be a positive whole number")
    return value


@cli.command("gres-conf")
@from_option
@click.option("--node-name", metavar="NAME", help="Prefix every line with NodeName=NAME.")
@click.option("--mps", type=int, metavar="N", callback=_positive, help="Add Name=mps Count=N per GPU.")
@click.option("--shard", type=int, metavar="N", callback=_positive, help="Add Name=shard Count=N per GPU.")
@click.option("--no-links", is_flag=True, help="Leave out Links=.")
@click.option("--template", type=click.Path(path_type=Path), metavar="FILE",
              help="Render with this jinja2 template instead of gres-templates/gres.conf.j2.")
@click.option("--output", "-o", type=click.Path(path_type=Path), metavar="FILE",
              help="Write to FILE (atomically) instead of standard output.")
@click.option("--check", type=click.Path(path_type=Path), metavar="EXISTING",
              help="Compare EXISTING gres.conf with the hardware; print mismatches, exit 1 if any.")
@slurm_version_option
@click.option("--dev-root", default="", metavar="DIR", hidden=True,
              help="Prefix device paths (test clusters and containers).")
def gres_conf(source: str | None, node_name: str | None, mps: int | None, shard: int | None,
              no_links: bool, template: Path | None, output: Path | None, check: Path | None,
              slurm_version: str | None, dev_root: str) -> None:
    """Generate gres.conf for this node (or compare an existing one with --check)."""
    from gpuslurm.gres.records import GresOptions, plan_gres
    from gpuslurm.slurm.mig_types import target_naming

    naming = target_naming(slurm_version)
    node = _load(source)
    opts = GresOptions(node_name=node_name, mps=mps, shard=shard, links=not no_links, dev_root=dev_root,
                       mig=naming)
    if check is not None:
        _check(node, opts, check)
        return
    from gpuslurm.gres.render import render_plan

    text = render_plan(node, plan_gres(node, opts), opts, template)
    _emit(text, output)


def _check(node: Node, opts: GresOptions, existing: Path) -> None:
    from gpuslurm.gres.check import check_gres_conf, renamed_later
    from gpuslurm.gres.conf_parse import parse_gres_conf
    from gpuslurm.gres.records import plan_gres
    from gpuslurm.slurm.mig_types import later_naming

    try:
        from gpuslurm.safedir import read_regular_text

        text = read_regular_text(str(existing))
    except OSError as exc:
        raise InputError(f"cannot read: {exc.strerror}", existing) from None
    except UnicodeDecodeError as exc:
        raise InputError(f"not UTF-8 text (byte {exc.start})", existing) from None
    plan = plan_gres(node, opts)
    entries = parse_gres_conf(text, str(existing), opts.node_name or None)
    problems = check_gres_conf(plan, entries)
    later = later_naming(opts.mig)
    renamed = [] if later is None else renamed_later(entries, plan_gres(node, opts._replace(mig=later)),
                                                     later.release or "")
    for p in [*problems, *renamed]:
        where = f"{existing}:{p.line}" if p.line else str(existing)
        click.echo(f"{where}: {p.kind}: {p.message}")
    if problems:
        raise CheckMismatchError(f"{len(problems)} mismatch(es) between {existing} and the hardware")
    click.echo(f"{existing}: matches the hardware ({len(plan.gpu_records)} GPU devices)")


@cli.command("node-conf")
@from_option
@click.option("--node-name", metavar="NAME", help="NodeName to use (default: the captured hostname).")
@click.option("--template", type=click.Path(path_type=Path), metavar="FILE",
              help="Render with this jinja2 template instead of gres-templates/node.conf.j2.")
@click.option("--feature", "features", multiple=True, metavar="NAME",
              help="Features of your own for Features= (repeatable, or comma-separated), kept first.")
@slurm_version_option
def node_conf(source: str | None, node_name: str | None, template: Path | None,
              features: tuple[str, ...], slurm_version: str | None) -> None:
    """Print the slurm.conf NodeName= line (Sockets, CoresPerSocket, ThreadsPerCore, RealMemory, Gres,
    Features from the hardware: model, gpumem_<N>g, cc_X.Y, nvlink, mig; see docs/features.md)."""
    from gpuslurm.config import load_config
    from gpuslurm.gres.records import GresOptions
    from gpuslurm.gres.render import render_node_conf
    from gpuslurm.hw.source import hardware_source
    from gpuslurm.slurm.mig_types import target_naming

    features = tuple(f for item in features for f in item.split(","))
    cfg = load_config()
    if "feature" in cfg.mps.triggers and cfg.mps.feature:  # the MPS trigger needs it on the node
        features = (*features, cfg.mps.feature)
    hardware = hardware_source(source)
    node = hardware.node()
    try:
        cc = hardware.capabilities()
    except HardwareError:  # the node was read; a driver without the query leaves the table
        cc = {}
    opts = GresOptions(mig=target_naming(slurm_version))
    click.echo(render_node_conf(node, node_name, opts, template_file=template, features=features, cc=cc),
               nl=False)


@cli.command("pbs-conf")
@from_option
@click.option("--node-name", metavar="NAME", help="PBS host name (default: the captured hostname).")
def pbs_conf(source: str | None, node_name: str | None) -> None:
    """Print a PBS vnode definition file (pbs_mom -s insert): one vnode per NUMA node."""
    from gpuslurm.gres.pbs_vnodes import MEMORY_LEFT_OUT, memory_known, render_pbs_vnodes

    node = _load(source)
    click.echo(render_pbs_vnodes(node, node_name), nl=False)
    if not memory_known(node):  # the file has no comment syntax: the note goes to stderr
        click.echo(f"gpuslurm pbs-conf: {MEMORY_LEFT_OUT}", err=True)


@cli.command(context_settings={"ignore_unknown_options": False})
@click.argument("args", nargs=-1, required=True, metavar="DIR | import FILE DIR")
@click.option("--force", is_flag=True, help="Write into a non-empty directory.")
def capture(args: tuple[str, ...], force: bool) -> None:
    """Write this node's hardware to a bundle DIR, or turn a multi-command text capture into one.

    \b
    gpuslurm capture DIR               run nvidia-smi, lscpu and NVML on this node
    gpuslurm capture import FILE DIR   split an nvidia_gpu_exporter-style capture file
    """
    if args[0] == "import":
        if len(args) != 3:
            raise click.UsageError("usage: gpuslurm capture import FILE DIR")
        from gpuslurm.hw.replay.importer import import_multi_capture

        written = import_multi_capture(Path(args[1]), Path(args[2]))
        click.echo(f"{args[2]}: wrote {', '.join(written)}")
        return
    if len(args) != 1:
        raise click.UsageError("usage: gpuslurm capture DIR")
    from gpuslurm.hw.live.capture import write_capture

    written = write_capture(Path(args[0]), force=force)
    click.echo(f"{args[0]}: wrote {', '.join(written)}")


def _emit(text: str, output: Path | None) -> None:
    if output is None:
        click.echo(text, nl=False)
        return
    from gpuslurm.safedir import replace_file

    try:
        replace_file(str(output), text.encode("utf-8"), 0o644)  # slurmd and slurmctld read it
    except OSError as exc:
        raise InputError(f"cannot write: {exc.strerror}", output) from None
    click.echo(f"wrote {output}", err=True)


def _say(message: str) -> None:
    """Print one error message on stderr as exactly one line, whatever the input put inside it."""
    click.echo(one_line(message), err=True)


# Shell completion: `eval "$(_GPUSLURM_COMPLETE=bash_source gpuslurm)"` (zsh_source, fish_source).
COMPLETE_VAR = "_GPUSLURM_COMPLETE"


def run_cli(argv: list[str] | None = None) -> int | None:
    """Parse and run one command; click's exceptions reach :func:`main` as raised.

    Not ``cli.main()``: that turns a write to a closed pipe into ``sys.exit(1)`` even outside
    standalone mode, which would report `gpuslurm discover | head -1` as a failed check (exit 1).
    """
    if COMPLETE_VAR in os.environ:  # the shell asks for completions (click's main() would see to it)
        from click.shell_completion import shell_complete

        return shell_complete(cli, {}, "gpuslurm", COMPLETE_VAR, os.environ[COMPLETE_VAR])
    args = sys.argv[1:] if argv is None else argv
    with cli.make_context("gpuslurm", list(args)) as ctx:
        code = cli.invoke(ctx)
    return code if isinstance(code, int) else None


def main(argv: list[str] | None = None) -> int:
    """Entry point: run the CLI and turn errors into one line and an exit code.

    BrokenPipeError is left to the caller (:func:`gpuslurm.cli.fast.quiet_on_closed_pipe`),
    which also keeps the interpreter's last flush from failing.
    """
    return run_entry(lambda: _run_click(argv), lambda message: _say(f"gpuslurm: {message}"),
                     bug_hint=" (set GPUSLURM_DEBUG=1 for a traceback)",
                     reraise_bugs=bool(os.environ.get("GPUSLURM_DEBUG")), let_through=(BrokenPipeError,))


def _run_click(argv: list[str] | None) -> int:
    """:func:`run_cli`'s exit code, click's own exceptions turned into theirs; the rest (the
    library's errors, bugs) are :func:`gpuslurm.errors.run_entry`'s, as for every hook."""
    try:
        code = run_cli(argv)
    except click.exceptions.Exit as exc:
        return int(exc.exit_code)
    except (click.Abort, KeyboardInterrupt, EOFError):
        _say("gpuslurm: aborted")
        return EXIT_INTERRUPTED
    except click.UsageError as exc:
        path = exc.ctx.command_path if exc.ctx else "gpuslurm"
        _say(f"{path}: {exc.format_message()} (see '{path} --help')")
        return EXIT_BAD_INPUT
    except click.ClickException as exc:
        _say(f"gpuslurm: {exc.format_message()}")
        return EXIT_BAD_INPUT
    return EXIT_OK if code is None else code


if __name__ == "__main__":
    from gpuslurm.cli.fast import quiet_on_closed_pipe

    sys.exit(quiet_on_closed_pipe(main))
