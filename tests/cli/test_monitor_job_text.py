"""``gpuslurm monitor``'s wiring for [notify]: a job's name (and, on Slurm, comment) from the
configured scheduler's own command, each through a stand-in at the configured path."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpuslurm.cli.monitor_cmd import monitor_parts
from gpuslurm.config import Config, PathsConfig, SchedulerConfig
from gpuslurm.report.notify_render import JobText

SLURM = Path(__file__).resolve().parents[1] / "slurm" / "scheduler" / "22.05" / "squeue-running.json"
PBS = Path(__file__).resolve().parents[1] / "pbs" / "data" / "qstat-f-json.json"


def stand_in(tmp_path: Path, name: str, answer: str) -> str:
    (tmp_path / f"{name}.json").write_text(answer)
    script = tmp_path / name
    script.write_text(f"#!/bin/sh\ncat {tmp_path}/{name}.json\n")
    script.chmod(0o755)
    return str(script)


@pytest.mark.parametrize("kind", ["slurm", "pbs"])
def test_the_job_text_comes_from_the_configured_scheduler(tmp_path: Path, kind: str) -> None:
    doc = json.loads(SLURM.read_text())
    doc["jobs"][0].update(name="big\nrun", comment='say "hi"')
    pbs = json.loads(PBS.read_text())
    first = next(iter(pbs["Jobs"]))
    pbs["Jobs"][first]["Job_Name"] = "pbs {{ job }}"
    cfg = Config(paths=PathsConfig(squeue=stand_in(tmp_path, "squeue", json.dumps(doc)),
                                   qstat=stand_in(tmp_path, "qstat", json.dumps(pbs))),
                 scheduler=SchedulerConfig(kind=kind))
    parts = monitor_parts(cfg)
    assert parts.job_text is not None
    text = parts.job_text(5.0)
    if kind == "slurm":
        assert text(str(doc["jobs"][0]["job_id"])) == JobText("big\nrun", 'say "hi"')
        assert text("424242") == JobText()
    else:
        assert text(first) == JobText("pbs {{ job }}")
    assert text("../etc") == JobText()  # not a job id: nothing is asked
