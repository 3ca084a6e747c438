"""MIG layout selectors: ranges bounded by the GPUs a node can have, malformed ones refused."""

from __future__ import annotations

import pytest

from gpuslurm.errors import InputError
from gpuslurm.isolate.mig import parse_selector


def test_selectors() -> None:
    assert parse_selector("0-2,5", "l.toml", "gpus") == ("index", (0, 1, 2, 5))
    assert parse_selector("all", "l.toml", "gpus") == ("all", None)


@pytest.mark.parametrize("bad", ["0-99999999999", "4-", "0-1e308", "3-1", "0,,1", "9" * 5000, "²"])
def test_bad_selectors_are_one_input_error(bad: str) -> None:
    with pytest.raises(InputError) as info:
        parse_selector(bad, "l.toml", "gpus")
    assert str(info.value).startswith("l.toml: ") and "\n" not in str(info.value)
