"""``[scheduler] kind``: which adapter monitor/status/watch build, and auto's choice."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuslurm.cli.schedulers import build_scheduler, scheduler_kind
from gpuslurm.config import parse_config
from gpuslurm.errors import InputError


def _tool(tmp_path: Path, name: str) -> str:
    path = tmp_path / name
    path.write_text("#!/bin/sh\nexit 0\n")
    path.chmod(0o755)
    return str(path)


def _cfg(tmp_path: Path, kind: str, *, qstat: bool, squeue: bool) -> object:
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
    warnings: list[str] = []
    sched = build_scheduler(cfg, warnings.append)
    if (chosen == "pbs" and qstat) or (chosen == "slurm" and squeue):
        assert sched is not None and sched.name == chosen and warnings == []
    else:  # its listing command is missing: the job maps alone, and a warning naming it
        assert sched is None and len(warnings) == 1 and "is missing" in warnings[0]


def test_an_unknown_kind_is_bad_input() -> None:
    with pytest.raises(InputError) as caught:
        parse_config('[scheduler]\nkind = "lsf"\n')
    assert "kind in [scheduler] must be one of auto, slurm, pbs" in str(caught.value)
