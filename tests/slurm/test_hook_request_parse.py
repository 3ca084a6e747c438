"""The hook server's request and answer formats (:mod:`gpuslurm.slurm.hookclient`), as parsers:
whatever bytes arrive, a request is taken whole and exactly or refused with RequestError."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuslurm.slurm import hookclient as hc

names = st.binary(min_size=1, max_size=20).filter(lambda b: b"\0" not in b and b"=" not in b)
values = st.binary(max_size=60).filter(lambda b: b"\0" not in b)
# A request's tail made of the pieces its grammar has, so that near-misses come up often
tails = st.lists(st.sampled_from([b"0", b"2", b"7", b"8", b"\0", b"A", b"=", b"1", b"\xff"]),
                 max_size=24).map(b"".join)


@given(st.sampled_from(hc.SERVED), st.integers(0, 0o777), st.dictionaries(names, values, max_size=30))
def test_a_request_round_trips(hook: str, umask: int, environ: dict[bytes, bytes]) -> None:
    assert hc.parse_request(hc.encode_request(hook, umask, environ)) == (hook, umask, environ)


@given(st.binary(max_size=400) | st.builds(lambda hook, tail: hc.MAGIC + b"\0" + hook + b"\0" + tail,
                                           st.sampled_from([b"prolog", b"epilog", b"task-prolog", b"x"]),
                                           tails))
@settings(max_examples=1500)
def test_any_bytes_are_a_request_or_refused(data: bytes) -> None:
    """What parses is exactly what encode_request writes (so a request has one reading)."""
    try:
        hook, umask, environ = hc.parse_request(data)
    except hc.RequestError:
        return
    assert hook in hc.SERVED and 0 <= umask <= 0o777
    assert hc.encode_request(hook, umask, environ) == data


@given(st.sampled_from(hc.SERVED), st.dictionaries(names, values, max_size=5), st.binary(max_size=40))
def test_a_request_with_anything_appended_is_still_exact_or_refused(hook: str, environ: dict[bytes, bytes],
                                                                     tail: bytes) -> None:
    data = hc.encode_request(hook, 0o22, environ) + tail
    try:
        got = hc.parse_request(data)
    except hc.RequestError:
        return
    assert hc.encode_request(*got) == data


@pytest.mark.parametrize("data", [
    b"", b"gpuslurm-hook/1", b"gpuslurm-hook/1\0prolog", b"gpuslurm-hook/2\0prolog\x0022",
    b"gpuslurm-hook/1\0task-prolog\x0022", b"gpuslurm-hook/1\0prolog\x0099",
    b"gpuslurm-hook/1\0prolog\x001777", b"gpuslurm-hook/1\0prolog\x00-1", b"gpuslurm-hook/1\0prolog\x00 22",
    b"gpuslurm-hook/1\0prolog\x00022", b"gpuslurm-hook/1\0prolog\x0000",
    b"gpuslurm-hook/1\0prolog\x0022\0NOEQUALS", b"gpuslurm-hook/1\0prolog\x0022\0=value",
    b"gpuslurm-hook/1\0prolog\x0022\0A=1\0A=2",
    b"gpuslurm-hook/1\0prolog\x0022\0" + b"A=" + b"x" * hc.MAX_REQUEST,
])
def test_what_is_not_a_request_is_refused(data: bytes) -> None:
    with pytest.raises(hc.RequestError):
        hc.parse_request(data)


@pytest.mark.parametrize("environ", [{b"A": b"x\0y"}, {b"": b"1"}, {b"A=B": b"1"}, {b"A\0": b"1"}])
def test_an_environment_that_cannot_be_sent_is_refused(environ: dict[bytes, bytes]) -> None:
    with pytest.raises(hc.RequestError):
        hc.encode_request("prolog", 0o22, environ)


@given(st.binary(max_size=20))
def test_an_answer_is_an_exit_code_or_nothing(data: bytes) -> None:
    code = hc.parse_reply(data)
    assert code is None or ((0 <= code <= 255 and data == b"rc %d" % code) or data.startswith(b"rc 0"))


@pytest.mark.parametrize(("data", "code"), [(b"rc 0", 0), (b"rc 1", 1), (b"rc 70", 70), (b"rc 255", 255),
                                            (b"rc 256", None), (b"rc", None), (b"rc -1", None),
                                            (b"rc 1 ", None), (b"busy", None), (b"rc \xd9\xa3", None)])
def test_answers(data: bytes, code: int | None) -> None:
    assert hc.parse_reply(data) == code
