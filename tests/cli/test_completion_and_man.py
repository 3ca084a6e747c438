"""Shell completion through the installed ``gpuslurm`` executable (its fast entry point), in a real
bash, zsh and fish where present; man pages made from each command's --help, read by the real man."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from gpuslurm.cli.main import cli
from gpuslurm.cli.manpages import all_pages
from gpuslurm.cli.pick_cmd import USAGE

GPUSLURM = Path(sys.executable).parent / "gpuslurm"  # the console script: gpuslurm.cli.fast:main


def _env(**extra: str) -> dict[str, str]:
    return {"PATH": f"{GPUSLURM.parent}:/usr/bin:/bin", "HOME": os.environ.get("HOME", "/root"), **extra}


@pytest.mark.parametrize("shell", ["bash", "zsh", "fish"])
def test_the_completion_script_comes_out_of_the_executable(shell: str) -> None:
    done = subprocess.run([str(GPUSLURM)], env=_env(_GPUSLURM_COMPLETE=f"{shell}_source"),
                          capture_output=True, text=True, timeout=60)
    assert (done.returncode, done.stderr) == (0, ""), done.stderr
    assert "_gpuslurm_completion" in done.stdout


@pytest.mark.parametrize(("words", "want"), [
    ("gpuslurm dis", ["discover"]),
    ("gpuslurm gpu l", ["list"]),
    ("gpuslurm health --j", ["--json"]),
    ("gpuslurm pick 2 --for", ["--format"]),  # pick's own parser, not click's
])
def test_bash_completes_commands_options_and_picks(words: str, want: list[str]) -> None:
    if shutil.which("bash") is None:
        pytest.skip("no bash")
    script = ('eval "$(_GPUSLURM_COMPLETE=bash_source gpuslurm)"\n'
              f'COMP_WORDS=({words}); COMP_CWORD={len(words.split()) - 1}\n'
              '_gpuslurm_completion gpuslurm\nprintf "%s\\n" "${COMPREPLY[@]}"\n')
    done = subprocess.run(["bash", "--norc", "--noprofile", "-c", script], env=_env(),
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == want


def test_fish_completes_a_subcommand() -> None:
    if shutil.which("fish") is None:
        pytest.skip("no fish on this host")
    script = 'gpuslurm | source; complete -C "gpuslurm gpu l"'
    done = subprocess.run(["fish", "--no-config", "-c", script], env=_env(_GPUSLURM_COMPLETE="fish_source"),
                          capture_output=True, text=True, timeout=60)
    assert "list" in done.stdout, done.stderr


def _man(page: Path) -> str:
    done = subprocess.run(["man", "-l", "-P", "cat", str(page)], capture_output=True, text=True, timeout=60,
                          env={**_env(), "MANWIDTH": "200", "LC_ALL": "C.UTF-8"})
    assert done.returncode == 0, done.stderr
    return done.stdout


def _words(text: str) -> list[str]:
    return text.replace("\u2010", "-").replace("\u2212", "-").split()


@pytest.fixture(scope="module")
def pages(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if shutil.which("man") is None:
        pytest.skip("no man on this host")
    out = tmp_path_factory.mktemp("man")
    done = subprocess.run([str(GPUSLURM), "man-pages", str(out)], env=_env(), capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    return out / "man1"


def test_a_page_for_every_command_and_subcommand(pages: Path) -> None:
    names = {p.name for p in pages.iterdir()}
    assert names == set(all_pages(cli))
    assert {"gpuslurm.1", "gpuslurm-pick.1", "gpuslurm-gpu-list.1", "gpuslurm-throttle-add.1",
            "gpuslurm-mig-show.1", "gpuslurm-man-pages.1"} <= names
    assert all(p.stat().st_mode & 0o777 == 0o644 for p in pages.iterdir())


def test_picks_page_is_its_own_help(pages: Path) -> None:
    """pick's --help comes from its own parser (the fast path, no click): its page is that text."""
    helped = subprocess.run([str(GPUSLURM), "pick", "--help"], env=_env(), capture_output=True, text=True,
                            timeout=60)
    assert helped.stdout.strip() == USAGE
    shown = _words(_man(pages / "gpuslurm-pick.1"))
    wanted = _words(helped.stdout)
    start = shown.index("usage:")
    assert shown[start:start + len(wanted)] == wanted


@pytest.mark.parametrize("command", [["health"], ["gpu", "list"], ["throttle", "add"], ["fairshare-report"]])
def test_a_click_commands_page_says_what_its_help_says(pages: Path, command: list[str]) -> None:
    helped = subprocess.run([str(GPUSLURM), *command, "--help"], env=_env(COLUMNS="200"), capture_output=True,
                            text=True, timeout=60)
    shown = " ".join(_words(_man(pages / f"gpuslurm-{'-'.join(command)}.1")))
    # each option's whole flags column (``-h, --help``, ``--from DIR|NAME``), as --help prints it
    options = [re.split(r"\s{2,}", line.strip())[0] for line in helped.stdout.splitlines()
               if line.startswith("  -")]
    assert options and all(option in shown for option in options), [o for o in options if o not in shown]
    description = helped.stdout.split("\n\n")[1]
    assert " ".join(description.split()) in shown
