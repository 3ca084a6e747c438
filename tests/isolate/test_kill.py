"""isolate/kill.py: a process is signalled only while it is the one found, and its owner's."""

from __future__ import annotations

import os
import signal
import subprocess

import pytest

from gpuslurm.hw.live.procfs import ProcessProblem, read_identity
from gpuslurm.isolate.kill import Target, kill_processes, send_signal

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="runs a process as another user: needs root")

NOBODY = 65534


def ticks(pid: int) -> int:
    ident = read_identity(pid)
    assert not isinstance(ident, ProcessProblem)
    return ident.start_ticks


def test_a_root_process_is_not_signalled_for_a_target_of_another_owner() -> None:
    root_proc = subprocess.Popen(["/bin/sleep", "30"])
    try:
        target = Target("", root_proc.pid, None, ticks(root_proc.pid), NOBODY)
        assert send_signal([target], signal.SIGKILL) == []
        assert kill_processes([target], grace_s=0.1, kill_wait_s=0.1) == {
            root_proc.pid: "gone before it was signalled"}
        assert root_proc.poll() is None
    finally:
        root_proc.kill()
        root_proc.wait()


def test_the_owners_process_is_signalled_and_a_reused_pid_is_not() -> None:
    mine = subprocess.Popen(["/bin/sleep", "30"], user=NOBODY, group=NOBODY, extra_groups=[])
    try:
        start = ticks(mine.pid)
        assert send_signal([Target("", mine.pid, None, start + 1, NOBODY)], signal.SIGKILL) == []
        assert mine.poll() is None
        assert send_signal([Target("", mine.pid, None, start, NOBODY)], signal.SIGKILL) == [mine.pid]
        assert mine.wait(timeout=5) == -signal.SIGKILL
    finally:
        if mine.poll() is None:
            mine.kill()
            mine.wait()
