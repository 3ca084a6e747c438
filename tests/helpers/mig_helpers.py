"""Shared by the MIG tests: a writable copy of a built-in bundle whose ``nvml.json`` the
nvidia-smi stand-in (tests/helpers/fakes/nvidia-smi) edits, and the calls it logged."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from gpuslurm.hw.formats.nvml_json import dump_node
from gpuslurm.hw.replay.bundle import read_bundle
from gpuslurm.hw.source import BUILTIN_DIR

FAKE_SMI = Path(__file__).resolve().parent / "fakes" / "nvidia-smi"


def make_bundle(root: Path, builtin: str = "a100-mig") -> Path:
    """Copy a built-in bundle under ``root`` and add the nvml.json the stand-in keeps its state in."""
    bundle = root / "bundle"
    shutil.copytree(BUILTIN_DIR / builtin, bundle)
    (bundle / "nvml.json").write_text(dump_node(read_bundle(bundle)))
    return bundle


def smi_env(bundle: Path, log: Path, **extra: str) -> dict[str, str]:
    """Environment variables that point the stand-in at ``bundle`` and ``log``."""
    env = {"FAKE_NVIDIA_SMI_BUNDLE": str(bundle), "FAKE_NVIDIA_SMI_LOG": str(log)}
    env.update({f"FAKE_NVIDIA_SMI_{k.upper()}": v for k, v in extra.items()})
    return env


def smi_calls(log: Path) -> list[list[str]]:
    """The argument lists the stand-in was called with, in order."""
    if not log.exists():
        return []
    return [json.loads(line)["argv"] for line in log.read_text().splitlines()]


def smi_log(log: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


def write_config(path: Path, **paths: str) -> Path:
    """A gpuslurm config whose [paths] are ``paths`` (nvidia_smi defaults to the stand-in)."""
    values = {"nvidia_smi": str(FAKE_SMI), **paths}
    path.write_text("[paths]\n" + "".join(f'{k} = "{v}"\n' for k, v in values.items()))
    return path
