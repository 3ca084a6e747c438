"""``pick --wait`` reads the out-of-service record again on every retry: a GPU taken out of service
(``gpuslurm gpu offline``) while pick waits is never the one it picks, and one brought back is."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

from tests.helpers.pick_helpers import GPUSLURM, JOB_VARS, scenario, uuids

from gpuslurm.state.out_of_service import RECORD_FILE, OutOfService, format_record


def _record(state: Path, out: list[str]) -> None:
    """The record as `gpu offline` leaves it: replaced whole, 0644."""
    tmp = state / (RECORD_FILE + ".tmp")
    tmp.write_bytes(format_record({u: OutOfService(u, "fan failed", time.time(), "admin") for u in out}))
    tmp.chmod(0o644)
    os.replace(tmp, state / RECORD_FILE)


def test_a_gpu_taken_out_while_pick_waits_is_not_picked(tmp_path: Path) -> None:
    u = uuids("l40s-4x")
    state = tmp_path / "state"
    state.mkdir(mode=0o755)
    config = tmp_path / "gpuslurm.toml"
    config.write_text(f'[paths]\nstate_dir = "{state}"\n')
    _record(state, u[1:])  # GPUs 1-3 out of service; GPU 0 busy with someone else's process until 4 s
    busy = {"start": time.time(), "steps": [{"at": 0, "procs": [{"pid": 999999, "gpu": u[0]}]},
                                            {"at": 4.0, "procs": []}]}
    env = {**{k: v for k, v in os.environ.items() if k not in JOB_VARS},
           "GPUSLURM_CONFIG": str(config), "GPUSLURM_SCENARIO": scenario(tmp_path, busy)}
    child = subprocess.Popen([*GPUSLURM, "1", "--from", "l40s-4x", "--wait", "--timeout", "60s",
                              "--poll", "0.2s"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             env=env)
    assert child.stderr is not None
    first = child.stderr.readline()
    assert "waiting" in first, first
    _record(state, [u[0], u[2], u[3]])  # while it waits: GPU 0 goes out, GPU 1 comes back
    out, err = child.communicate(timeout=60)
    assert child.returncode == 0, err
    assert f"CUDA_VISIBLE_DEVICES={u[1]}" in out and u[0] not in out, out
