"""NVML's total energy counter (nvmlDeviceGetTotalEnergyConsumption) served by the replay library
from each step's ``energy_mj``, sampled by the monitor and kept in its store, a restart of the
counter (a driver reload) included; a GPU whose steps give no counter has none."""

from __future__ import annotations

import json
import sqlite3
import time
from pathlib import Path

from tests.helpers.nvml_replay import MakeLiveNode

L40S = Path(__file__).parents[3] / "src" / "gpuslurm" / "hw" / "builtin" / "l40s-4x"


def test_the_monitor_samples_and_stores_the_counter_across_a_restart(
        live_node: MakeLiveNode, tmp_path: Path) -> None:
    node = live_node(L40S)
    doc = json.loads(node.nvml_json.read_text())
    now = time.time()
    doc["replay"]["steps"] = [
        {"at": now - 1000, "devices": [{"gpu": 0, "mig": -1, "util": 50, "power_w": 300,
                                        "energy_mj": 123_456_789}]},
        {"at": now - 500, "devices": [{"gpu": 0, "mig": -1, "util": 50, "power_w": 300,
                                       "energy_mj": 2_500}]},  # the driver reloaded: it restarted
    ]
    node.nvml_json.write_text(json.dumps(doc))
    db = tmp_path / "monitor.db"
    seen = []
    for shift in (-700, 0):  # the first step, then the second
        done = node.run("monitor", "--once", "--json", "--db", str(db),
                        extra_env={"GPUSLURM_NVML_REPLAY_CLOCK": str(shift)})
        gpus = {g["gpu_uuid"]: g for g in json.loads(done.stdout.splitlines()[0])["gpus"]}
        first, *others = sorted(gpus.values(), key=lambda g: g["gpu_uuid"] != _uuid(doc, 0))
        seen.append(first["energy_mj"])
        assert {g["energy_mj"] for g in others} == {None}  # no counter in their steps: none
    assert seen == [123_456_789.0, 2_500.0]
    stored = sqlite3.connect(db).execute(
        "SELECT s.energy_mj FROM gpu_sample s JOIN device d ON d.id = s.device WHERE d.uuid = ? "
        "ORDER BY s.ts", (_uuid(doc, 0),)).fetchall()
    assert stored == [(123_456_789.0,), (2_500.0,)]


def _uuid(doc: dict, index: int) -> str:  # type: ignore[type-arg]
    gpus = sorted(doc["gpus"], key=lambda g: g["index"])
    return str(gpus[index]["uuid"])
