"""Slurm's shares reach the detector through the monitor: refreshed, kept on failure, recorded."""

from __future__ import annotations

import contextlib
import json
import os
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from tests.helpers.watch_helpers import sleeper, stop

from gpuslurm.config import parse_config
from gpuslurm.errors import CommandError
from gpuslurm.hw.replay.scenario import ScenarioSampler
from gpuslurm.hw.source import load_node
from gpuslurm.policy.detect import Detector
from gpuslurm.slurm.sshare import ShareCache
from gpuslurm.state.jobmap import JobMap, MappedDevice, write_map
from gpuslurm.state.store import Store
from gpuslurm.watch.attribute import Attributor
from gpuslurm.watch.monitor import SSHARE_PROBLEM, Monitor

NODE = load_node("dgx-h100")  # 8 GPUs: one busy GPU is 1/8 of the node
U = [g.uuid for g in NODE.gpus]
TREE = Path(__file__).resolve().parents[1] / "slurm" / "sshare" / "handmade-tree.txt"
DETECT = """
[detect.share]
quota_source = "slurm"
duration_s = 10
min_samples = 1
min_coverage = 0.0
[detect.idle]
enabled = false
[detect.rogue]
enabled = false  # the sleeper is in no job cgroup: over share is what is looked at here
[detect.defensive]
enabled = false
"""


class Answers:
    def __init__(self, *answers: object) -> None:
        self.answers = list(answers)

    def __call__(self) -> object:
        a = self.answers.pop(0)
        if isinstance(a, Exception):
            raise a
        return a


@pytest.fixture
def busy(tmp_path: Path) -> Iterator[tuple[Path, int]]:
    """A real process of root in job 5, keeping GPU 0 at 100 % (scenario), with the job's map."""
    p = sleeper()
    jobs = tmp_path / "run" / "jobs"
    write_map(JobMap("5", "root", 0, (MappedDevice(U[0], 0),), 0.0), str(jobs))
    scenario = tmp_path / "scenario.json"
    scenario.write_text(json.dumps({"start": 0, "gpus": {U[0]: {"util": 100}},
                                    "procs": [{"pid": p.pid, "gpu": U[0], "sm": 100}]}))
    yield scenario, p.pid
    stop(p)


def test_shares_are_refreshed_kept_on_failure_and_the_failure_recorded(tmp_path: Path,
                                                                       busy: tuple[Path, int]) -> None:
    scenario, pid = busy
    cfg = parse_config(DETECT, "test.toml")
    det = Detector(cfg.detect)
    feed: ShareCache[object] = ShareCache(
        Answers({"root": 0.05}, CommandError("sshare exited 1: slurmctld is down"), {"root": 0.5}),
        refresh_s=20.0)
    clock = iter([100.0, 110.0, 120.0, 130.0, 140.0])
    warnings: list[str] = []
    store = Store.open(str(tmp_path / "monitor.db"))
    try:
        m = Monitor(ScenarioSampler(NODE, scenario), Attributor(jobs_dir=str(tmp_path / "run" / "jobs")),
                    store, "node07", detector=det, quotas=feed,  # type: ignore[arg-type]
                    warn=warnings.append, clock=lambda: next(clock))
        found = []
        for _ in range(5):
            m.cycle()
            found.append([(v.kind, v.pid) for v in det.violations])
    finally:
        store.close()
    with contextlib.closing(sqlite3.connect(tmp_path / "monitor.db")) as conn:
        problems = conn.execute("SELECT ts, kind, subject, detail FROM problem").fetchall()
    # 1/8 of the node against a 5 % quota: over share once the window is judged
    assert found[1] == [("over-share", pid)]
    # the read due at 120 fails: the 5 % quota stays, the failure is a problem of that cycle
    assert found[2] == found[3] == [("over-share", pid)]
    assert problems == [(120.0, SSHARE_PROBLEM, "sshare", "sshare exited 1: slurmctld is down")]
    assert warnings == [
        "cannot read Slurm's shares (the last quotas stay): sshare exited 1: slurmctld is down"]
    # retried 20 s later (min of 60 s and the refresh): a 50 % quota, nobody over share
    assert found[4] == []


def test_shares_are_ignored_unless_the_config_asks_for_them(tmp_path: Path, busy: tuple[Path, int]) -> None:
    scenario, _ = busy
    cfg = parse_config(DETECT.replace('"slurm"', '"config"'), "test.toml")  # default_quota 1
    det = Detector(cfg.detect)
    clock = iter([100.0, 110.0, 120.0])
    store = Store.open(str(tmp_path / "monitor.db"))
    try:
        m = Monitor(ScenarioSampler(NODE, scenario), Attributor(jobs_dir=str(tmp_path / "run" / "jobs")),
                    store, "node07", detector=det, quotas=ShareCache(lambda: {"root": 0.01}, 20.0),
                    clock=lambda: next(clock))
        for _ in range(3):
            m.cycle()
    finally:
        store.close()
    assert det.violations == ()


def test_the_monitor_command_reads_sshare_and_records_its_failure(tmp_path: Path,
                                                                  busy: tuple[Path, int]) -> None:
    scenario, _ = busy
    sshare = tmp_path / "sshare"
    config = tmp_path / "gpuslurm.toml"
    config.write_text(f'[paths]\nrun_dir = "{tmp_path / "run"}"\nstate_dir = "{tmp_path / "state"}"\n'
                      f'violations_dir = "{tmp_path / "violations"}"\nsqueue = "{tmp_path / "no-squeue"}"\n'
                      f'sshare = "{sshare}"\n{DETECT}')
    env = {**os.environ, "GPUSLURM_CONFIG": str(config), "GPUSLURM_SCENARIO": str(scenario),
           "GPUSLURM_CAPTURE": "dgx-h100"}
    cmd = [sys.executable, "-m", "gpuslurm", "monitor", "--once", "--db", str(tmp_path / "m.db")]

    sshare.write_text(f"#!/bin/sh\ncat {TREE}\n")
    sshare.chmod(0o755)
    ok = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=60)
    assert ok.returncode == 0, ok.stderr
    assert "sshare" not in ok.stdout + ok.stderr

    sshare.write_text("#!/bin/sh\necho 'sshare: error: Unable to contact slurm controller' >&2\nexit 1\n")
    bad = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=60)
    assert bad.returncode == 0, bad.stderr
    assert "  sshare-error: sshare: sshare exited 1: sshare: error: Unable to contact slurm controller" \
        in bad.stdout.splitlines()
    assert "cannot read Slurm's shares (the last quotas stay)" in bad.stderr
