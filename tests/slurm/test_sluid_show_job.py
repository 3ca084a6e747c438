"""A SLUID's job id from ``scontrol -d show job s<SLUID>``: the real 26.05 captures
(tests/slurm/show_job), forged lines and hostile text."""

from __future__ import annotations

from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st
from tests.helpers.props_hostile import mutated

from gpuslurm.slurm.sluid import job_of_sluid, job_of_sluid_text

DATA = Path(__file__).resolve().parent / "show_job"
SLUID = (DATA / "26.05-sluid").read_text().strip()


def test_the_real_26_05_record_names_its_job() -> None:
    assert job_of_sluid_text((DATA / "26.05-by-sluid.txt").read_text(), SLUID) == "1"
    assert job_of_sluid_text((DATA / "26.05-by-id.txt").read_text(), SLUID) == "1"
    assert job_of_sluid_text((DATA / "26.05-by-sluid.txt").read_text(), "s6Z5M8CB6N7P00") is None


def test_a_job_name_forging_a_sluid_line_cannot_hide_its_job() -> None:
    """The attacker's account: job 2's name holds a newline and ``   SLUID=sAAAAAAAAAAAAA``, real
    26.05 output. Refusing any record with a SLUID line not asked for turned its own SLUID into no
    answer, and a process in an unknown SLUID's cgroup is never judged rogue: on a node without
    the job's map the name shielded its processes for good. Lines can be added, never removed: the
    one asked for is still there, and line 1's job id is slurmctld's."""
    text = (DATA / "26.05-forged-name.txt").read_text()
    assert text.count("   SLUID=") >= 2  # the name is shown again in SubmitLine=
    assert job_of_sluid_text(text, "sB3XM8CSC8T400") == "2"


def test_an_unknown_sluid_is_no_job(tmp_path: Path) -> None:
    """The real 26.05 answer for a SLUID slurmctld does not know: exit 1 and an error line."""
    scontrol = tmp_path / "scontrol"
    scontrol.write_text(f"#!/bin/sh\ncat {DATA / '26.05-unknown.txt'} >&2\nexit 1\n")
    scontrol.chmod(0o755)
    assert job_of_sluid("s00000000000AB", scontrol=str(scontrol), timeout=5) is None
    known = tmp_path / "known"
    known.write_text(f"#!/bin/sh\n[ \"$4\" = {SLUID} ] && cat {DATA / '26.05-by-sluid.txt'}\n")
    known.chmod(0o755)
    assert job_of_sluid(SLUID, scontrol=str(known), timeout=5) == "1"
    assert job_of_sluid("-oops", scontrol=str(known), timeout=5) is None  # never an option


@settings(max_examples=300)
@given(st.one_of(mutated((DATA / "26.05-by-sluid.txt").read_text(), edits=4), st.text(max_size=200)))
def test_hostile_text_gives_a_job_id_or_none(text: str) -> None:
    job = job_of_sluid_text(text, SLUID)
    assert job is None or (job.isascii() and job.isdigit() and text.startswith(f"JobId={job}"))
