"""``[scheduler] kind``: which adapter monitor/status/watch build, and auto's choice."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuslurm.cli.schedulers import scheduler_for, scheduler_kind
from gpuslurm.config import Config, parse_config
from gpuslurm.errors import InputError


def _tool(tmp_path: Path, name: str) -> str:
    path = tmp_path / name
    path.write_text("#!/bin/sh\nexit 0\n")
    path.chmod(0o755)
    return str(path)


def _cfg(tmp_path: Path, kind: str, *, qstat: bool, squeue: bool) -> Config:
    q = _tool(tmp_path, "qstat") if qstat else str(tmp_path / "no-qstat")
    s = _tool(tmp_path, "squeue") if squeue else str(tmp_path / "no-squeue")
    return parse_config(f'[paths]\nqstat = "{q}"\nsqueue = "{s}"\n[scheduler]\nkind = "{kind}"\n')


@pytest.mark.parametrize(("kind", "qstat", "squeue", "chosen"), [
    ("auto", True, False, "pbs"),
    ("auto", False, True, "slurm"),
    ("auto", True, True, "slurm"),  # PBS's client on a Slurm node: still Slurm
    ("auto", False, False, "slurm"),
    ("pbs", False, True, "pbs"),
    ("slurm", True, False, "slurm"),
])
def test_kind(tmp_path: Path, kind: str, qstat: bool, squeue: bool, chosen: str) -> None:
    cfg = _cfg(tmp_path, kind, qstat=qstat, squeue=squeue)
    assert scheduler_kind(cfg) == chosen
    sched = scheduler_for(cfg, 10)
    assert sched.name == chosen
    why = sched.why_no_job_list()
    if (chosen == "pbs" and qstat) or (chosen == "slurm" and squeue):
        assert why is None
    else:  # its listing command is missing: the job maps alone, and one line naming it
        missing = str(tmp_path / ("no-qstat" if chosen == "pbs" else "no-squeue"))
        assert why is not None and why.startswith(f"{missing} is missing") and "\n" not in why


def test_an_unknown_kind_is_bad_input() -> None:
    with pytest.raises(InputError) as caught:
        parse_config('[scheduler]\nkind = "lsf"\n')
    assert "kind in [scheduler] must be one of auto, slurm, pbs" in str(caught.value)
