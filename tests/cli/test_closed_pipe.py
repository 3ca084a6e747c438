"""`gpuslurm ... | head -1`: a reader that went away ends gpuslurm quietly, with 141 like `yes`.

Each command runs as a real process whose stdout is a pipe with its read end already closed
(what `head` leaves behind once it has its line), with buffered output (the default) and with
PYTHONUNBUFFERED set, since Python meets the closed pipe in different places in the two cases.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from gpuslurm.errors import EXIT_CLOSED_PIPE

GPUSLURM = [sys.executable, "-m", "gpuslurm"]

COMMANDS = [
    ["pick", "--help"],
    ["pick", "2", "--from", "dgx-h100"],
    ["pick", "1", "--from", "dgx-h100", "--format", "explain"],
    ["--help"],
    ["discover", "--from", "dgx-h100"],
    ["topo", "--from", "dgx-h100", "--json"],
    ["gres-conf", "--from", "dgx-h100"],
]


def run_into_closed_pipe(argv: list[str], unbuffered: bool) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
    if unbuffered:
        env["PYTHONUNBUFFERED"] = "1"
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        return subprocess.run(argv, stdout=write_end, stderr=subprocess.PIPE, text=True, env=env,
                              timeout=120, check=False)
    finally:
        os.close(write_end)


@pytest.mark.parametrize("unbuffered", [False, True], ids=["buffered", "unbuffered"])
@pytest.mark.parametrize("args", COMMANDS, ids=" ".join)
def test_closed_pipe_is_quiet(args: list[str], unbuffered: bool) -> None:
    done = run_into_closed_pipe([*GPUSLURM, *args], unbuffered)
    assert done.stderr == ""
    assert done.returncode == EXIT_CLOSED_PIPE


def test_closed_pipe_through_the_click_module_entry() -> None:
    """`python -m gpuslurm.cli.main` (what some tests and scripts run) ends the same way."""
    done = run_into_closed_pipe([sys.executable, "-m", "gpuslurm.cli.main", "discover", "--from",
                                 "dgx-h100"], unbuffered=False)
    assert (done.returncode, done.stderr) == (EXIT_CLOSED_PIPE, "")


def test_an_error_still_reaches_stderr_when_stdout_is_closed() -> None:
    """Only stdout's reader went away: a bad option is still one line and exit 2."""
    done = run_into_closed_pipe([*GPUSLURM, "discover", "--from", "no-such-bundle"], unbuffered=False)
    assert done.returncode == 2
    assert len(done.stderr.splitlines()) == 1


def test_pick_command_gets_sigpipe_back() -> None:
    """`pick -- CMD` execs CMD: Python's ignored SIGPIPE must not be inherited (ignored signals
    survive exec), or `yes | head -1` inside CMD fails with 'Broken pipe' instead of ending."""
    done = subprocess.run([*GPUSLURM, "pick", "1", "--from", "dgx-h100", "--", "/bin/sh", "-c",
                           "yes | head -1; grep '^SigIgn' /proc/self/status"],
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
    ignored = int(done.stdout.split("SigIgn:")[1].split()[0], 16)
    assert not ignored & (1 << (13 - 1)), "SIGPIPE is still ignored in CMD"
