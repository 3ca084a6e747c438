"""max_run_res.ngpus = [u:NAME=N]: formatting and parsing (pure)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpuslurm.errors import InputError
from gpuslurm.pbs.limits import format_user_limits, parse_user_limits


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
