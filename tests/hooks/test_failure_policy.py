"""The hooks' failure policy (docs/hooks.md), each rule exercised as a whole process where it matters.

- a health fault drains with a reason naming the GPU and the fault (test_prolog.py);
- a bug or failure in a non-essential step never drains the node and never fails the job;
- every external call has a timeout, so a hook always ends;
- nothing is written as root through a path a user controls.
"""

from __future__ import annotations

import io
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from tests.helpers.hook_helpers import HookSite, make_site

from gpuslurm.hooks.log import HookLog
from gpuslurm.slurm.hooks import run_epilog, run_prolog, run_task_prolog

RUN = "from gpuslurm.cli.main import main; raise SystemExit(main())"


@pytest.fixture
def site(tmp_path: Path) -> HookSite:
    return make_site(tmp_path)


def quiet(hook: str) -> HookLog:
    return HookLog(hook, stream=io.StringIO(), use_syslog=False)


def test_a_hung_scontrol_cannot_hang_the_prolog(site: HookSite) -> None:
    # scontrol that never answers (a slurmctld that is down): the drain must give up on time
    # and the prolog still fail closed, so that Slurm drains the node itself.
    hung = site.root / "scontrol"
    hung.write_text("#!/bin/sh\nexec /bin/sleep 300\n")
    site.write_config("")
    site.config.write_text(site.config.read_text().replace("command_timeout_s = 5",
                                                           "command_timeout_s = 1"))
    site.set_health({site.uuids[0]: {"lost": True}})
    env = {**site.environ(gpus="0"), "PYTHONPATH": str(Path(__file__).resolve().parents[2] / "src")}
    started = time.monotonic()
    proc = subprocess.run([sys.executable, "-c", RUN, "prolog"], env=env, capture_output=True,
                          text=True, timeout=60, check=False)
    elapsed = time.monotonic() - started
    assert proc.returncode == 1, proc.stderr
    assert "timed out after 1 s" in proc.stderr
    assert elapsed < 20, f"the prolog took {elapsed:.1f} s with a 1 s command timeout"


def test_a_planted_symlink_is_never_written_through(site: HookSite, tmp_path: Path) -> None:
    # The state directory's jobs/ replaced by a symlink to somewhere a user chose: the summary
    # (non-essential) is refused and logged, nothing lands at the target, the node is not drained.
    target = tmp_path / "elsewhere"
    target.mkdir()
    (site.root / "state").mkdir()
    os.symlink(target, site.root / "state" / "jobs")
    assert run_prolog(site.environ(), quiet("prolog")) == 0
    log = quiet("epilog")
    assert run_epilog(site.environ(), log) == 0
    assert list(target.iterdir()) == []
    assert any("cannot write the job summary" in line for line in log.lines), log.lines
    assert site.scontrol_calls() == []


def test_the_task_prolog_never_fails_the_task(site: HookSite) -> None:
    # Even with a bundle that does not parse, the task runs (without our hints).
    (site.bundle / "nvidia-smi-q.xml").write_text("<nvidia_smi_log><gpu>")
    out = io.StringIO()
    log = quiet("task-prolog")
    assert run_task_prolog(site.environ(), out, log) == 0
    assert out.getvalue() == ""
    assert any("no GPU hints" in line for line in log.lines)


def test_a_bug_in_the_summary_does_not_drain(site: HookSite, monkeypatch: pytest.MonkeyPatch) -> None:
    import gpuslurm.hooks.epilog as epilog

    def broken(*_args: object, **_kwargs: object) -> str:
        raise ZeroDivisionError("a bug in the summary")

    monkeypatch.setattr(epilog, "write_summary", broken)
    assert run_prolog(site.environ(), quiet("prolog")) == 0
    log = quiet("epilog")
    assert run_epilog(site.environ(), log) == 0
    assert site.scontrol_calls() == []
    assert any("ZeroDivisionError" in line for line in log.lines)
    assert not (site.jobs_dir / "1234.json").exists()
