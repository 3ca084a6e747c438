"""Whose AdminComment it is: gpuslurm writes only into an empty field or over its own payload
(property tests of the classifier the hooks and the monitor use)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from gpuslurm.slurm.scontrol import ADMIN_COMMENT_TAG, admin_comment_is_ours, own_admin_comment


@given(st.text(max_size=200))
def test_jobstats_payloads_are_never_gpuslurms(payload: str) -> None:
    assert not admin_comment_is_ours("JS1:" + payload)


@given(st.text(max_size=200))
def test_gpuslurms_payload_is_its_own_and_tagged_once(text: str) -> None:
    line = own_admin_comment(text)
    assert line.startswith(ADMIN_COMMENT_TAG) and admin_comment_is_ours(line)
    assert own_admin_comment(line) == line


@given(st.text(max_size=200).filter(lambda s: s.strip() and not s.strip().startswith("gpuslurm")))
def test_any_other_text_is_someone_elses(text: str) -> None:
    assert not admin_comment_is_ours(text)


def test_empty_and_old_lines_are_writable() -> None:
    assert admin_comment_is_ours("") and admin_comment_is_ours("  ")
    assert admin_comment_is_ours("gpuslurm: 2 GPU, no monitor data")  # before the tag (issue 21)
    assert not admin_comment_is_ours("gpuslurmX: not ours") and not admin_comment_is_ours("x gpuslurm: y")
