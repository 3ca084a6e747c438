"""``gpuslurm status --from`` on real captures shows what the capture recorded, on the captured node.

Before: dual_a5000 showed 0.0/24.0 GiB, no temperature or power, "no process holds a GPU", the
node named after the machine running the command, and both GPUs keyed ``12345678`` (the 8-character
prefix of their placeholder UUIDs).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

from tests.helpers.scheduler_stand_in import no_jobs_config


def status(tmp_path: Path, bundle: Path, *args: str) -> subprocess.CompletedProcess[str]:
    config = no_jobs_config(tmp_path / "site")
    env = {"PATH": "/usr/bin:/bin", "GPUSLURM_CONFIG": str(config), "COLUMNS": "80"}
    return subprocess.run([sys.executable, "-m", "gpuslurm", "status", "--from", str(bundle), *args],
                          capture_output=True, text=True, timeout=120, env=env, check=False)


def bundle_of(tmp_path: Path, real: Path, name: str, host: str) -> Path:
    bundle = tmp_path / host
    bundle.mkdir()
    shutil.copy(real / "nvidia-smi-q-x" / name, bundle / "nvidia-smi-q.xml")
    (bundle / "hostname").write_text(host + "\n")
    return bundle


def test_dual_a5000_shows_the_captured_memory_heat_power_and_processes(tmp_path: Path,
                                                                      real_fixtures: Path) -> None:
    bundle = bundle_of(tmp_path, real_fixtures, "dual_a5000-v13.xml", "ws-a5000")
    done = status(tmp_path, bundle)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith("ws-a5000 ")  # the bundle's node, as gres-conf names it
    gpu0 = next(line for line in lines if line.startswith("   0 RTX A5000  81:00.0 "))
    gpu1 = next(line for line in lines if line.startswith("   1 RTX A5000  C1:00.0 "))
    assert "21.9/24.0 GiB" in gpu0 and " 13C " in gpu0 and " 6W " in gpu0
    assert "16.8/24.0 GiB" in gpu1 and " 15C " in gpu1 and " 14W " in gpu1
    assert "12345678" not in "\n".join(lines[:8])  # no row keyed by a UUID prefix
    assert "no process holds a GPU" not in done.stdout
    procs = [line.split() for line in lines if "llama-server" in line and "GiB" in line]
    assert sorted((p[0], p[1]) for p in procs) == [("0", "100477"), ("1", "100477")]


def test_tesla_t4_json_carries_the_capture(tmp_path: Path, real_fixtures: Path) -> None:
    bundle = bundle_of(tmp_path, real_fixtures, "tesla-t4.xml", "t4-node")
    done = status(tmp_path, bundle, "--json")
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    assert data["node"] == "t4-node"
    (gpu,) = data["gpus"]
    assert (gpu["label"], gpu["bus_id"], gpu["model"]) == ("0", "00000000:00:1E.0", "Tesla T4")
    assert (gpu["mem_used_mib"], gpu["temp_c"], gpu["power_w"]) == (1032.0, 40.0, 26.78)
    assert sorted((p["pid"], p["name"], p["mem_mib"]) for p in data["processes"]) == \
        [(675, "Xorg", 22.0), (5762, "python", 1005.0)]


def test_a_builtin_bundle_keeps_its_node_name_and_captured_temperatures(tmp_path: Path) -> None:
    done = status(tmp_path, Path("dgx-h100"), "--json")
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    assert data["node"] == "dgx-h100-01"
    assert [g["temp_c"] for g in data["gpus"]][:2] == [29.0, 30.0]
