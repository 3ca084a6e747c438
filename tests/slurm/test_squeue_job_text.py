"""A job's name and comment for its end-of-job message ([notify]): ``squeue --json`` read by field
name, for the job asked only, on each release's recorded answer (the job's user wrote both
fields, and another user's job in the same answer may pose as it)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpuslurm.slurm.squeue import job_name_comment

RECORDED = Path(__file__).parent / "scheduler"
NAME = 'x\nJobId=1 Name=other "q" \\ {{ 7*7 }}\x1b[31m'
COMMENT = "comment\nBcc: a@b"


@pytest.mark.parametrize("release", ["22.05", "24.11", "26.05"])
def test_the_name_and_comment_of_the_job_asked_come_unchanged(tmp_path: Path, release: str) -> None:
    doc = json.loads((RECORDED / release / "squeue-running.json").read_text())
    job = doc["jobs"][0]
    poser = {**job, "job_id": job["job_id"] + 1, "name": "JobId=1", "comment": "forged"}
    doc["jobs"] = [poser, {**job, "name": NAME, "comment": COMMENT}]  # 22.05 lists every job
    answer = tmp_path / "answer.json"
    answer.write_text(json.dumps(doc))
    fake = tmp_path / "squeue"
    fake.write_text(f'#!/bin/sh\necho "$@" > {tmp_path}/args\ncat {answer}\n')
    fake.chmod(0o755)
    assert job_name_comment(str(job["job_id"]), squeue=str(fake), timeout=5) == (NAME, COMMENT)
    assert (tmp_path / "args").read_text().split() == ["--json", f"--jobs={job['job_id']}", "--states=all"]
    assert job_name_comment("999999", squeue=str(fake), timeout=5) is None
