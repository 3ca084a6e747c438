"""Defects an attack review of the hardening found, each replayed as the attacker."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from gpuslurm.runner import run_command

GPUSLURM = [sys.executable, "-m", "gpuslurm"]


def _run(args: list[str], **kw: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*GPUSLURM, *args], capture_output=True, text=True, timeout=60, **kw)  # type: ignore[call-overload]


def test_command_output_that_is_not_utf8_never_crashes_a_reader(tmp_path: Path) -> None:
    # A job's name (squeue --json) is the user's: any bytes. The root monitor reads it.
    fake = tmp_path / "squeue"
    fake.write_text("#!/bin/sh\nprintf '{\"jobs\":[{\"name\":\"\\377\\376\"}]}'\n")
    fake.chmod(0o755)
    out = run_command([str(fake)], timeout=10).stdout
    assert out.startswith('{"jobs"') and "\ufffd" in out


def test_placement_input_not_utf8_or_a_fifo_is_handled(tmp_path: Path) -> None:
    bad = tmp_path / "detail"
    bad.write_bytes(b"JobId=1\n\xff\n")
    r = _run(["placement", "--from", "l40s-4x", "--input", str(bad)])
    assert r.returncode == 0, r.stderr
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    r = _run(["placement", "--from", "l40s-4x", "--input", str(fifo)])
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "FIFO" in r.stderr


def test_pbs_conf_refuses_a_node_name_that_injects_lines() -> None:
    r = _run(["pbs-conf", "--from", "l40s-4x", "--node-name", "evil: resources_available.ngpus = 64\nevil"])
    assert r.returncode == 2 and r.stdout == "" and r.stderr.count("\n") == 1


def test_a_captured_hostname_with_a_newline_never_becomes_a_gres_conf_line(tmp_path: Path) -> None:
    # nvml.json is authoritative in a bundle; its hostname is printed in gres.conf's header
    import json

    from gpuslurm.hw.formats.nvml_json import node_to_dict
    from gpuslurm.hw.replay.bundle import read_bundle

    src = Path(__file__).parents[1] / "src/gpuslurm/hw/builtin/l40s-4x"
    doc = node_to_dict(read_bundle(src))
    doc["hostname"] = "gpu01\nNodeName=gpu01 Name=gpu File=/dev/nvidia7"
    bundle = tmp_path / "b"
    shutil.copytree(src, bundle)
    (bundle / "nvml.json").write_text(json.dumps(doc))
    r = _run(["gres-conf", "--from", str(bundle), "--node-name", "gpu01"])
    if r.returncode == 0:
        injected = [x for x in r.stdout.splitlines()
                    if x.startswith("NodeName=gpu01 Name=gpu File=/dev/nvidia7")]
        assert not injected, r.stdout
    else:
        assert r.returncode == 2 and r.stderr.count("\n") == 1


@pytest.mark.skipif(shutil.which("taskset") is None or (os.cpu_count() or 1) < 2,
                    reason="needs taskset and 2 CPUs")
def test_pick_never_prints_cpus_the_confined_caller_may_not_use() -> None:
    r = subprocess.run(["taskset", "-c", "1", *GPUSLURM, "pick", "1", "--from", "l40s-4x"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert "export GPUSLURM_CPUS=1\n" in r.stdout
