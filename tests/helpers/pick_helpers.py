"""What the tests of ``gpuslurm pick`` share: the command, the job variables it reads, a scenario
file and a bundle's GPU UUIDs."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from gpuslurm.hw.source import load_node

GPUSLURM = [sys.executable, "-m", "gpuslurm", "pick"]


JOB_VARS = ("SLURM_JOB_ID", "PBS_JOBID", "SLURM_JOB_GPUS", "SLURM_STEP_GPUS", "GPUSLURM_GPU_UUIDS",
            "GPUSLURM_SCENARIO", "GPUSLURM_CAPTURE", "CUDA_VISIBLE_DEVICES")


def uuids(name: str) -> list[str]:
    return [g.uuid for g in load_node(name).gpus]


def scenario(tmp_path: Path, body: dict[str, object]) -> str:
    path = tmp_path / "scenario.json"
    path.write_text(json.dumps(body))
    return str(path)
