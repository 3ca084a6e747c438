"""max_run_res.ngpus = [u:NAME=N]: formatting and parsing (pure)."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpuslurm.errors import InputError
from gpuslurm.pbs.limits import (
    format_entries,
    format_user_limits,
    parse_limit_entries,
    parse_user_limits,
    read_gpu_limit_text,
    with_user_limit,
)


def test_format_and_parse() -> None:
    text = format_user_limits({"bob": 0, "alice": 2, "PBS_GENERIC": 4})
    assert text == "[u:PBS_GENERIC=4],[u:alice=2],[u:bob=0]"
    assert parse_user_limits(text) == {"PBS_GENERIC": 4, "alice": 2, "bob": 0}
    assert parse_user_limits("[u:alice=2], [g:physics=8] ,[u:bob=1]") == {"alice": 2, "bob": 1}
    assert parse_user_limits("") == {}


@pytest.mark.parametrize("limits", [{"a b": 1}, {"x]": 1}, {"alice": -1}, {"alice": True}, {"": 1}])
def test_bad_limits_are_refused(limits: dict[str, int]) -> None:
    with pytest.raises(InputError):
        format_user_limits(limits)


@pytest.mark.parametrize("text", ["u:alice=2", "[u:alice=2", "[u:alice]", "[alice=2]", "[u:alice=x]",
                                  "[u:alice=2]x"])
def test_bad_text_is_one_error(text: str) -> None:
    with pytest.raises(InputError):
        parse_user_limits(text)


@given(st.dictionaries(st.from_regex(r"[a-z_][a-z0-9_.-]{0,12}", fullmatch=True), st.integers(0, 1000),
                       max_size=8))
def test_round_trip(limits: dict[str, int]) -> None:
    assert parse_user_limits(format_user_limits(limits)) == limits


@given(st.text(max_size=60))
def test_parse_never_raises_anything_else(text: str) -> None:
    try:
        parse_user_limits(text)
    except InputError as exc:
        assert len(str(exc).splitlines()) == 1


def test_every_entry_of_a_limit_list_is_read_though_qstat_repeats_the_key(tmp_path: Path) -> None:
    # qstat -B -f -F json prints a list attribute's entries as repeated keys (OpenPBS 23.06)
    fake = tmp_path / "qstat"
    fake.write_text('#!/bin/sh\ncat <<"EOF"\n{"Server": {"pbshost": {"max_run_res": {\n'
                    '"ngpus": "[g:staff=5]", "ngpus": "[u:alice=1]"}}}}\nEOF\n')
    fake.chmod(0o755)
    assert read_gpu_limit_text(str(fake), timeout=10) == "[g:staff=5],[u:alice=1]"
    assert with_user_limit(parse_limit_entries("[g:staff=5],[u:alice=1]"), "alice", None) == \
        [("g", "staff", 5)]


@pytest.mark.parametrize("user", ['a"b', "a];[u:root=0", "a b", "x\ny", "", "a,b", "a=b"])
def test_a_hostile_user_name_never_becomes_an_entry(user: str) -> None:
    with pytest.raises(InputError):
        with_user_limit([], user, 1)


@pytest.mark.parametrize("text", ['[u:a"b=1]', "[u:a\x07b=1]"])
def test_a_server_value_that_could_not_be_quoted_again_is_refused(text: str) -> None:
    with pytest.raises(InputError):
        parse_limit_entries(text)


NAMES = st.from_regex(r"[A-Za-z0-9_.][A-Za-z0-9_.@$-]{0,20}", fullmatch=True)


@given(st.lists(st.tuples(st.sampled_from("ugpo"), NAMES, st.integers(0, 10**6)), max_size=8))
def test_entries_round_trip(entries: list[tuple[str, str, int]]) -> None:
    assert parse_limit_entries(format_entries(entries)) == entries
