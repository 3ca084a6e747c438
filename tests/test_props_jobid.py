"""The one job-id validator: Slurm and PBS ids pass; nothing a path or an option could be built from."""

from __future__ import annotations

import os

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpuslurm.errors import InputError
from gpuslurm.jobid import check_job_id, job_sort_key, valid_job_id

GOOD = ["1", "123", "4294967294", "123_4", "123.host", "123.pbs-server.example.org", "123[4].host",
        "123[].host", "123[4]", "7[]"]
BAD = ["", "/", "..", "../1", "1/2", "1/../2", "1\x00", "1 ", " 1", "1\n", "-1", "+1", ".1", "1.",
       "1..host", "1.host/x", "1.-host", "1.host-", "1_", "_1", "1_2_3", "1[", "1[2", "1[a].h", "1[2]x.h",
       "1_2.host", "١٢٣", "12345678901", "1.h\u2028", "1.ho st", "1." + "a" * 64]


@pytest.mark.parametrize("job_id", GOOD)
def test_slurm_and_pbs_ids_are_accepted(job_id: str) -> None:
    assert valid_job_id(job_id) and check_job_id(job_id) == job_id


@pytest.mark.parametrize("job_id", BAD)
def test_anything_else_is_refused(job_id: str) -> None:
    assert not valid_job_id(job_id)
    with pytest.raises(InputError):
        check_job_id(job_id)


def test_sort_key_orders_by_number_then_index() -> None:
    ids = ["10", "9_2", "9", "9_10", "8[].h", "8[3].h"]
    assert sorted(ids, key=job_sort_key) == ["8[].h", "8[3].h", "9", "9_2", "9_10", "10"]


@given(st.text(max_size=40))
def test_an_accepted_id_is_one_plain_file_name(text: str) -> None:
    if not valid_job_id(text):
        return
    assert os.path.basename(text) == text and text not in (".", "..") and ".." not in text
    assert not text.startswith(("-", ".")) and text.isascii() and text.isprintable()
    assert not any(c.isspace() for c in text) and "\x00" not in text
    job_sort_key(text)  # every accepted id sorts


@given(st.from_regex(r"\A[0-9]{1,10}(_[0-9]{1,10}|(\[[0-9]{0,10}\])?\.[a-z0-9]{1,10}(\.[a-z0-9]{1,10}){0,8})?\Z"))
def test_every_generated_well_formed_id_is_accepted(text: str) -> None:
    # at most 9 labels of 10: within the length a job id may have (longer ones are refused)
    assert valid_job_id(text)
