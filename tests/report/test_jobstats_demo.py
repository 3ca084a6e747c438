"""``gpuslurm jobstats`` on the demo's store (``gpuslurm demo``): every job's JSON matches its
schema, the demo's idle allocation (carol's Jupyter session) is called idle and the busy training
jobs good, and each GPU's energy agrees with its mean power over the time it covers."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from gpuslurm.cli.main import main
from gpuslurm.jsondoc import schema_path


@pytest.fixture(scope="module")
def demo_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("demo") / "run"
    done = subprocess.run([sys.executable, "-m", "gpuslurm", "demo", "--hours", "2", "--no-plot",
                           "--out", str(out)], capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr
    return out / "monitor.db"


def jobs(db: Path) -> list[str]:
    with sqlite3.connect(db) as conn:
        return [r[0] for r in conn.execute("SELECT job_id FROM allocation ORDER BY job_id")]


def stats(db: Path, job: str, capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    capsys.readouterr()
    assert main(["jobstats", job, "--db", str(db), "--json"]) == 0
    doc: dict[str, Any] = json.loads(capsys.readouterr().out)
    return doc


def test_every_demo_job_matches_the_schema_and_its_energy_its_power(
        demo_db: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUSLURM_CONFIG", str(demo_db.parent / "gpuslurm.toml"))
    schema = json.loads(Path(schema_path("jobstats")).read_text())
    found = jobs(demo_db)
    assert len(found) >= 5
    for job in found:
        doc = stats(demo_db, job, capsys)
        jsonschema.validate(doc, schema, cls=jsonschema.Draft202012Validator)
        assert doc["job"]["id"] == job and doc["gpus"]
        for g in doc["gpus"]:
            assert g["energy_source"] == "power"  # the built-in DGX H100's replay has no counter
            assert g["energy_j"] == pytest.approx(g["power_mean_w"] * g["energy_covered_s"], rel=0.05)
            assert 0 <= g["idle_s"] <= g["observed_s"]


def test_the_idle_session_is_called_idle_and_training_good(
        demo_db: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUSLURM_CONFIG", str(demo_db.parent / "gpuslurm.toml"))
    docs = [stats(demo_db, job, capsys) for job in jobs(demo_db)]
    by_process = {p["name"]: d for d in docs for p in d["processes"]}
    jupyter, torchrun = by_process["jupyter-lab"], by_process["torchrun"]
    assert jupyter["verdict"] == "idle GPUs" and jupyter["job"]["user"] == "carol"
    assert jupyter["notes"][0]["kind"] == "idle"
    assert torchrun["verdict"] == "good" and not torchrun["notes"]
    capsys.readouterr()
    assert main(["jobstats", jupyter["job"]["id"], "--db", str(demo_db)]) == 0
    table = capsys.readouterr().out
    assert "Verdict: idle GPUs" in table and table.count("jupyter-lab") == len(jupyter["processes"])
