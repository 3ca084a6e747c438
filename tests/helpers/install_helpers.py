"""What the tests of gpuslurm install share: a Slurm etc and a prefix (the fixture ``dirs``), the
command run in-process, and its output when it succeeded."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from gpuslurm.cli.install_cmd import install


@pytest.fixture
def dirs(tmp_path: Path) -> tuple[Path, Path]:
    etc = tmp_path / "etc"
    etc.mkdir()
    return etc, tmp_path / "libexec" / "gpuslurm"


def run(etc: Path, prefix: Path, *extra: str) -> Result:
    args = ["--slurm-etc", str(etc), "--prefix", str(prefix), *extra]
    return CliRunner().invoke(install, args, standalone_mode=False)


def ok(result: Result) -> str:
    assert result.exception is None, (result.output, result.exception)
    return result.output
