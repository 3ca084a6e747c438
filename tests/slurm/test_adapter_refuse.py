"""SlurmScheduler.refuse_job: requeue-hold with a Comment, else scancel; never a node command."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuslurm.errors import CommandError
from gpuslurm.slurm.adapter import SlurmScheduler


def _tool(tmp_path: Path, name: str, log: Path, fail_on: str = "") -> str:
    path = tmp_path / name
    fail = f'case "$*" in *{fail_on}*) exit 1;; esac\n' if fail_on else ""
    path.write_text(f'#!/bin/sh\necho "{name} $*" >> {log}\n{fail}exit 0\n')
    path.chmod(0o755)
    return str(path)


def test_refuse_holds_the_job_with_its_reason(tmp_path: Path) -> None:
    log = tmp_path / "calls"
    s = SlurmScheduler(squeue="/nonexistent", scontrol=_tool(tmp_path, "scontrol", log), timeout=5,
                       scancel=_tool(tmp_path, "scancel", log))
    assert s.refuse_job("42", "bad\nMPS  request") == "requeued and held"
    assert log.read_text().splitlines() == ["scontrol update JobId=42 Comment=bad MPS request",
                                            "scontrol requeuehold 42"]


def test_a_job_slurm_cannot_requeue_is_cancelled(tmp_path: Path) -> None:
    log = tmp_path / "calls"
    s = SlurmScheduler(squeue="/nonexistent", timeout=5, scancel=_tool(tmp_path, "scancel", log),
                       scontrol=_tool(tmp_path, "scontrol", log, fail_on="requeuehold"))
    assert s.refuse_job("42", "why") == "cancelled"
    assert log.read_text().splitlines()[-1] == "scancel 42"
    assert not any("NodeName" in line for line in log.read_text().splitlines())


def test_neither_working_is_an_error_and_a_bad_job_id_is_refused(tmp_path: Path) -> None:
    log = tmp_path / "calls"
    s = SlurmScheduler(squeue="/nonexistent", timeout=5,
                       scancel=_tool(tmp_path, "scancel", log, fail_on="4"),
                       scontrol=_tool(tmp_path, "scontrol", log, fail_on="requeuehold"))
    with pytest.raises(CommandError):
        s.refuse_job("42", "why")
    with pytest.raises(Exception, match="job id"):
        s.refuse_job("../42", "why")
