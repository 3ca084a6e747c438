"""Parsers of pick's values: sizes, compute capabilities, durations, percentages; the CC table."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpuslurm.hw.model.capability import model_cc
from gpuslurm.place.request import parse_cc, parse_percent, parse_size_mib


@pytest.mark.parametrize(("text", "mib"), [("6GiB", 6144), ("6G", 6144), ("6gb", 6144), ("512MiB", 512),
                                           ("512", 512), ("1.5T", 1.5 * 2**20), ("2048KiB", 2),
                                           (" 40 GiB ", 40960), ("1048576B", 1)])
def test_sizes(text: str, mib: float) -> None:
    assert parse_size_mib(text) == mib


@pytest.mark.parametrize("text", ["", "GiB", "-1G", "6 G B", "6Gx", "6PB", "1e3", "six"])
def test_bad_sizes(text: str) -> None:
    with pytest.raises(ValueError, match="not a size"):
        parse_size_mib(text)


@given(st.integers(0, 10**6), st.sampled_from(["", "M", "MiB", "G", "GiB", "GB", "T"]))
def test_size_round_trip(n: int, unit: str) -> None:
    factor = {"": 1, "M": 1, "MiB": 1, "G": 1024, "GiB": 1024, "GB": 1024, "T": 2**20}[unit]
    assert parse_size_mib(f"{n}{unit}") == n * factor


@given(st.text(max_size=12))
def test_size_parser_total(text: str) -> None:
    try:
        assert parse_size_mib(text) >= 0
    except ValueError as exc:
        assert "not a size" in str(exc)


@given(st.integers(0, 99), st.integers(0, 99))
def test_cc_round_trip(major: int, minor: int) -> None:
    assert parse_cc(f"{major}.{minor}") == (major, minor)


@pytest.mark.parametrize("text", ["8", "8.", ".0", "8.0.1", "v8.0", "100.0", ""])
def test_bad_cc(text: str) -> None:
    with pytest.raises(ValueError, match="not a compute capability"):
        parse_cc(text)


@given(st.text(max_size=8))
def test_percent_parser_total(text: str) -> None:
    try:
        value = parse_percent(text)
    except ValueError:
        return
    assert 0 <= value <= 100


@pytest.mark.parametrize(("name", "cc"), [
    ("NVIDIA H100 80GB HBM3", (9, 0)), ("NVIDIA A100-SXM4-80GB", (8, 0)), ("NVIDIA A10", (8, 6)),
    ("NVIDIA L40S", (8, 9)), ("NVIDIA L4", (8, 9)), ("NVIDIA RTX A5000", (8, 6)),
    ("Tesla V100-SXM2-32GB", (7, 0)), ("NVIDIA H200", (9, 0)), ("Mystery 9000", None)])
def test_model_table(name: str, cc: tuple[int, int] | None) -> None:
    assert model_cc(name) == cc
