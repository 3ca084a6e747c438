"""Slurm's cgroup/v2 names on hostile text: SLUIDs and SLUID job paths (pure)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from tests.helpers.props_hostile import mutated

from gpuslurm.jobid import SLUID_DIGITS, valid_sluid
from gpuslurm.slurm.cgroup_paths import parse_cgroup, parse_cgroup_path

PARSER = settings(max_examples=300)
REAL = "/system.slice/node1_slurmstepd.scope/s6Z5M8CB6N7P00/step_0/user/task_0"

sluids = st.builds(lambda top, rest: "s" + top + rest, st.sampled_from(SLUID_DIGITS[:16]),
                   st.text(SLUID_DIGITS, min_size=12, max_size=12)).filter(lambda s: s != "s" + "0" * 13)


def _slurm_value(text: str) -> int:
    """What Slurm's print_sluid would have encoded: 13 base-32 digits, the first of 4 bits."""
    value = 0
    for c in text[1:]:
        value = value * 32 + SLUID_DIGITS.index(c)
    return value


@PARSER
@given(sluids)
def test_every_sluid_slurm_prints_is_valid_and_fits_64_bits(sluid: str) -> None:
    assert valid_sluid(sluid) and 0 < _slurm_value(sluid) < 1 << 64


@PARSER
@given(st.one_of(st.text(max_size=20), mutated("s6Z5M8CB6N7P00", edits=2)))
def test_a_valid_sluid_is_slurms_form_exactly(text: str) -> None:
    if valid_sluid(text):
        assert len(text) == 14 and text[0] == "s" and text[1] in SLUID_DIGITS[:16]
        assert set(text[1:]) <= set(SLUID_DIGITS) and 0 < _slurm_value(text) < 1 << 64


@PARSER
@given(st.one_of(mutated(REAL, edits=3), st.text(max_size=80)))
def test_a_cgroup_path_names_a_valid_job_id_or_sluid_never_both(path: str) -> None:
    from gpuslurm.jobid import valid_job_id

    job = parse_cgroup_path(path)
    if job is None:
        return
    assert (job.job_id is None) != (job.sluid is None)
    assert valid_job_id(job.job_id) if job.job_id is not None else valid_sluid(str(job.sluid))
    assert "user.slice" not in path.split("/")


@PARSER
@given(st.sampled_from(["system.slice", "gpu.slice", "x"]), st.sampled_from(["", "node1_", "n-2_"]),
       sluids, st.sampled_from(["", "/step_0", "/step_batch/user/task_0", "/step_extern/slurm"]))
def test_every_sluid_job_path_slurm_makes_names_that_sluid(slice_: str, prefix: str, sluid: str,
                                                         below: str) -> None:
    job = parse_cgroup(f"0::/{slice_}/{prefix}slurmstepd.scope/{sluid}{below}\n")
    assert job is not None and job.sluid == sluid and job.job_id is None
    assert job.node == (prefix[:-1] or None)
    under_user = parse_cgroup(f"0::/user.slice/user-1.slice/{prefix}slurmstepd.scope/{sluid}{below}\n")
    assert under_user is None
