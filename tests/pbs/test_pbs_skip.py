"""Where no OpenPBS source is beside the checkout the PBS tests skip; CI makes that a failure."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from tests.helpers import pbs_fixture


@pytest.mark.skipif(os.geteuid() != 0, reason="without root the reason is root, not the source")
def test_no_source_and_no_install_is_the_reason(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pbs_fixture, "VENDOR", tmp_path / "vendor")
    monkeypatch.setattr(pbs_fixture, "PREFIX", tmp_path / "pbs")
    reason = pbs_fixture.pbs_unavailable()
    assert reason is not None and "no OpenPBS source beside the checkout" in reason


def test_ci_or_require_pbs_turns_the_skip_into_a_failure(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CI", raising=False)
    monkeypatch.delenv("GPUSLURM_REQUIRE_PBS", raising=False)
    assert not pbs_fixture._required()
    monkeypatch.setenv("GPUSLURM_REQUIRE_PBS", "1")
    assert pbs_fixture._required()
    monkeypatch.delenv("GPUSLURM_REQUIRE_PBS")
    monkeypatch.setenv("CI", "true")
    assert pbs_fixture._required()
