"""``gpuslurm man-pages``: a man page per command, made from the commands' own help (roff, man(7)).

A page is made from what ``--help`` prints, so the two cannot drift: click's help text, usage and
option help for every click command, and for ``pick`` (which parses its own arguments, without
click) its own usage text, the very string ``gpuslurm pick --help`` prints. Written here rather than
with click-man: that is a packaging-time tool that is no dependency of gpuslurm, and it would
document ``pick`` by its click stub, not by pick's real help.
"""

from __future__ import annotations

import os
import re

import click

from gpuslurm import __version__
from gpuslurm.cli.main import cli
from gpuslurm.cli.pick_cmd import USAGE
from gpuslurm.safedir import replace_file

DEFAULT_MAN_DIR = "/usr/local/share/man"  # on man's default search path (manpath(5)); a venv's is not


def _roff(text: str) -> str:
    """``text`` safe as roff: backslashes escaped, no line starting a request (. or ')."""
    text = text.replace("\\", "\\e").replace("-", "\\-")
    return "\n".join("\\&" + line if line.startswith((".", "'")) else line for line in text.splitlines())


def _paragraphs(text: str) -> str:
    return "\n.PP\n".join(_roff(" ".join(p.split())) for p in re.split(r"\n\s*\n", text.strip()) if p.strip())


def _head(name: str, summary: str) -> list[str]:
    return [f'.TH "{name.upper()}" "1" "" "gpuslurm {__version__}" "gpuslurm manual"',
            ".SH NAME", f"{_roff(name)} \\- {_roff(summary)}"]


def _context(command: click.Command, name: str, parent: click.Context | None) -> click.Context:
    # with the command's own context settings, as click's make_context gives them: the root's
    # help option names (-h, --help) reach every page through the parent, as they reach --help
    # (click keeps the help option it first makes on the command: a page made without them
    # would also take -h from --help later in the same process)
    return click.Context(command, info_name=name, parent=parent, **command.context_settings)


def page(path: tuple[str, ...], command: click.Command, parent: click.Context) -> str:
    """The man page of ``gpuslurm <path>``: name, synopsis, description, options, subcommands."""
    if path == ("pick",):
        return pick_page()
    ctx = _context(command, path[-1] if path else "gpuslurm", parent)
    name = "-".join(("gpuslurm", *path))
    lines = _head(name, command.get_short_help_str(limit=200))
    lines += [".SH SYNOPSIS", f".B {_roff(ctx.command_path)}",
              _roff(" ".join(command.collect_usage_pieces(ctx)))]
    if command.help:
        lines += [".SH DESCRIPTION", _paragraphs(command.help)]
    records = [r for r in (p.get_help_record(ctx) for p in command.get_params(ctx)) if r]
    if records:
        lines.append(".SH OPTIONS")
        for flags, text in records:
            lines += [".TP", f"\\fB{_roff(flags)}\\fR", _roff(text)]
    if isinstance(command, click.Group):
        lines.append(".SH COMMANDS")
        for sub in command.list_commands(ctx):
            subcommand = command.get_command(ctx, sub)
            if subcommand is not None and not subcommand.hidden:
                lines += [".TP", f"\\fB{_roff(sub)}\\fR",
                          _roff(subcommand.get_short_help_str(limit=200)) + f" See {name}\\-{_roff(sub)}(1)."]
    lines += [".SH SEE ALSO", "gpuslurm(1); the README and docs/ of gpuslurm."]
    return "\n".join(lines) + "\n"


def pick_page() -> str:
    """pick's page: its own ``--help`` text, verbatim (no fill), under NAME."""
    summary = USAGE.split("\n\n")[1].split(":")[0]  # its description's first clause
    lines = _head("gpuslurm-pick", " ".join(summary.split()))
    lines += [".SH SYNOPSIS", ".nf", _roff(USAGE), ".fi",
              ".SH SEE ALSO", "gpuslurm(1); docs/pick.md of gpuslurm."]
    return "\n".join(lines) + "\n"


def all_pages(cli: click.Group) -> dict[str, str]:
    """Every page by file name (``gpuslurm.1``, ``gpuslurm-gpu-list.1``, ...), hidden commands left out."""
    pages: dict[str, str] = {}
    root = _context(cli, "gpuslurm", None)

    def visit(path: tuple[str, ...], command: click.Command, parent: click.Context | None) -> None:
        ctx = root if parent is None else _context(command, path[-1], parent)
        pages["-".join(("gpuslurm", *path)) + ".1"] = page(path, command, parent or root) if path else \
            _root_page(cli, root)
        if isinstance(command, click.Group):
            for sub in command.list_commands(ctx):
                subcommand = command.get_command(ctx, sub)
                if subcommand is not None and not subcommand.hidden:
                    visit((*path, sub), subcommand, ctx)

    visit((), cli, None)
    return pages


def _root_page(cli: click.Group, root: click.Context) -> str:
    text = page((), cli, root)
    return text.replace(".SH SEE ALSO\ngpuslurm(1); ", ".SH SEE ALSO\n")


def write_pages(pages: dict[str, str], man_dir: str) -> list[str]:
    """Write ``pages`` into ``<man_dir>/man1`` (0644, each replaced atomically); their paths."""
    section = os.path.join(man_dir, "man1")
    os.makedirs(section, mode=0o755, exist_ok=True)
    written = []
    for name, text in sorted(pages.items()):
        path = os.path.join(section, name)
        replace_file(path, text.encode(), 0o644)
        written.append(path)
    return written


@click.command("man-pages")
@click.argument("man_dir", metavar="DIR", default=DEFAULT_MAN_DIR)
def man_pages(man_dir: str) -> None:
    """Write a man page per command into DIR/man1 (default /usr/local/share/man, where man looks),
    made from each command's --help; then `man gpuslurm-pick`."""
    for path in write_pages(all_pages(cli), man_dir):
        click.echo(path)
