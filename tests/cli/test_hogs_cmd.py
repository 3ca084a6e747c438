"""``gpuslurm hogs`` on what a real monitor run stored: current findings only, in words and JSON."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from tests.helpers.scheduler_stand_in import no_jobs_config

from gpuslurm.cli.hogs_cmd import current
from gpuslurm.hw.source import load_node
from gpuslurm.samples import Violation


def _run(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gpuslurm", *args], env=env, capture_output=True,
                          text=True, timeout=120, check=False)


@pytest.fixture
def monitored(tmp_path: Path) -> Iterator[tuple[dict[str, str], int, str]]:
    """One monitor cycle in which a real process of no job uses GPU 3."""
    sleeper = subprocess.Popen(["/bin/sleep", "60"])
    gpu = load_node("dgx-h100").gpus[3].uuid
    scenario = tmp_path / "scenario.json"
    scenario.write_text(json.dumps({"gpus": {gpu: {"util": 97}},
                                    "procs": [{"pid": sleeper.pid, "gpu": gpu, "mem_mib": 4000}]}))
    config = no_jobs_config(tmp_path)  # no host's squeue: its answer is no part of this test
    config.write_text(config.read_text() + '[monitor]\nnode_name = "node07"\n')
    env = {**os.environ, "GPUSLURM_CONFIG": str(config), "GPUSLURM_SCENARIO": str(scenario),
           "GPUSLURM_CAPTURE": "dgx-h100"}
    proc = _run(env, "monitor", "--once")
    assert proc.returncode == 0, proc.stderr
    yield env, sleeper.pid, gpu
    sleeper.kill()
    sleeper.wait()


def test_hogs_lists_the_rogue_process_the_monitor_saw(monitored: tuple[dict[str, str], int, str]) -> None:
    env, pid, gpu = monitored
    out = _run(env, "hogs", "--json")
    assert out.returncode == 0, out.stderr
    [v] = json.loads(out.stdout)["violations"]
    assert (v["kind"], v["node"], v["pid"], v["gpu_uuid"], v["process"], v["job_id"]) == \
        ("rogue", "node07", pid, gpu, "sleep", None)
    table = _run(env, "hogs")
    assert table.returncode == 0, table.stderr
    assert "rogue      node07" in table.stdout and str(pid) in table.stdout and gpu in table.stdout
    shared_dir = Path(env["GPUSLURM_CONFIG"]).parent / "violations"
    shared = _run(env, "hogs", "--json", "--violations-dir", str(shared_dir))
    listed = json.loads(shared.stdout)["violations"]
    assert [(v["kind"], v["pid"]) for v in listed] == [("rogue", pid)], shared.stderr


def test_a_missing_store_is_one_line_and_exit_2(tmp_path: Path) -> None:
    config = tmp_path / "gpuslurm.toml"
    config.write_text(f'[paths]\nstate_dir = "{tmp_path / "state"}"\n')
    out = _run({**os.environ, "GPUSLURM_CONFIG": str(config)}, "hogs")
    assert out.returncode == 2
    assert out.stderr.count("\n") == 1 and "is `gpuslurm monitor` running" in out.stderr


def test_only_findings_seen_recently_are_current() -> None:
    now = time.time()
    seen = Violation("idle", "n1", "bob", "7", None, None, "GPU-a", now - 900, 880.0, "idle")
    old = seen._replace(job_id="6", start=now - 9000, duration_s=600.0)
    # the same finding appended twice to the shared directory: the latest record counts, once
    earlier = seen._replace(duration_s=820.0)
    assert current([old, earlier, seen], now, slack_s=35) == [seen]
    assert current([seen], now, slack_s=5) == []
