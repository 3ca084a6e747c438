"""Every real capture in ../shared/fixtures/real loads end to end through the CLI."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from gpuslurm.cli.main import cli, main

SHARED = Path(__file__).resolve().parents[2].parent / "shared" / "fixtures" / "real"
XMLS = sorted(p.name for p in (SHARED / "nvidia-smi-q-x").glob("*.xml")) if SHARED.is_dir() else []
MULTI = sorted(p.name for p in (SHARED / "multi").glob("*.txt")) if SHARED.is_dir() else []


@pytest.mark.parametrize("name", XMLS)
def test_xml_capture_discovers(tmp_path: Path, real_fixtures: Path, name: str) -> None:
    bundle = tmp_path / "bundle"
    bundle.mkdir()
    shutil.copy(real_fixtures / "nvidia-smi-q-x" / name, bundle / "nvidia-smi-q.xml")
    result = CliRunner().invoke(cli, ["discover", "--from", str(bundle), "--json"])
    assert result.exit_code == 0, result.output
    devices = json.loads(result.output)["devices"]
    uuids = [d["uuid"] for d in devices if d["kind"] == "gpu"]
    assert uuids and len(set(uuids)) == len(uuids)  # identity holds even for masked captures


@pytest.mark.parametrize("name", MULTI)
def test_multi_capture_imports_and_says_what_is_missing(
        tmp_path: Path, real_fixtures: Path, name: str, capsys: pytest.CaptureFixture[str]) -> None:
    bundle = tmp_path / "bundle"
    assert main(["capture", "import", str(real_fixtures / "multi" / name), str(bundle)]) == 0
    assert main(["discover", "--from", str(bundle)]) == 0
    assert main(["topo", "--from", str(bundle), "--json"]) == 0
    capsys.readouterr()
    # These captures carry no lscpu: gres-conf must say so, in one line, with exit 2.
    assert main(["gres-conf", "--from", str(bundle)]) == 2
    err = capsys.readouterr().err
    assert "lscpu.csv" in err and err.count("\n") == 1


def test_fixture_lists_are_not_empty(real_fixtures: Path) -> None:
    assert len(XMLS) >= 6 and len(MULTI) >= 4
