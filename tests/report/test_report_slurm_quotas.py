"""fairshare-report with ``quota_source = "slurm"``: quotas from sshare, rescaled to the report's GPUs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from tests.helpers.report_helpers import END, T0, make_store

WINDOW = ["--since", f"@{T0:.0f}", "--until", f"@{END:.0f}", "--format", "json"]
# 22.05 -P format. Fractions of the cluster: alice 1/2 × 1/5 = 0.1, bob and carol 0.25; accounts 0.5.
TREE = """Account|User|RawShares|NormShares
root|||0.000000
 chem||1|0.500000
  chem|bob|1|0.500000
  chem|carol|1|0.500000
 phys||1|0.500000
  phys|alice|1|0.200000
  phys|dave|4|0.800000
"""


def run(tmp_path: Path, sshare_body: str, share: str, *args: str) -> subprocess.CompletedProcess[str]:
    sshare = tmp_path / "sshare"
    sshare.write_text(f"#!/bin/sh\n{sshare_body}\n")
    sshare.chmod(0o755)
    cfg = tmp_path / "gpuslurm.toml"
    cfg.write_text(f'[paths]\nsshare = "{sshare}"\n[detect.share]\nquota_source = "slurm"\n{share}')
    env = {**os.environ, "GPUSLURM_CONFIG": str(cfg)}
    db = make_store(tmp_path / "monitor.db")
    return subprocess.run([sys.executable, "-m", "gpuslurm", "fairshare-report", "--db", str(db),
                           *WINDOW, *args], env=env, capture_output=True, text=True, timeout=60)


def quotas(r: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    assert r.returncode == 0, r.stderr
    return {row["key"]: (row["quota_pct"], row["over_quota"]) for row in json.loads(r.stdout)["rows"]}


@pytest.fixture
def tree(tmp_path: Path) -> str:
    path = tmp_path / "tree.txt"
    path.write_text(TREE)
    return f"cat {path}"


def test_user_quotas_are_slurms_fractions_rescaled_to_the_reports_gpus(tmp_path: Path, tree: str) -> None:
    # the report covers 3 GPUs of a 6-GPU cluster: every fraction doubles
    got = quotas(run(tmp_path, tree, "slurm_cluster_gpus = 6\n"))
    assert got == {"alice": (20.0, True), "carol": (50.0, False), "bob": (50.0, False)}


def test_config_users_still_come_first_and_zero_gpus_means_no_rescaling(tmp_path: Path, tree: str) -> None:
    got = quotas(run(tmp_path, tree, "users = { bob = 0.05 }\n"))
    assert got["alice"] == (10.0, True) and got["bob"] == (5.0, False) and got["carol"] == (25.0, False)


def test_account_rows_use_config_then_slurm(tmp_path: Path, tree: str) -> None:
    got = quotas(run(tmp_path, tree, "slurm_cluster_gpus = 6\naccounts = { phys = 0.25 }\n",
                     "--by", "account"))
    assert got["phys"] == (25.0, True)  # the config's entry wins: 30 % used
    assert got["chem"] == (100.0, False)  # Slurm's 0.5 × 6 / 3, capped at 1


def test_a_failing_sshare_is_said_and_the_config_alone_judges(tmp_path: Path) -> None:
    r = run(tmp_path, "echo 'sshare: error: Unable to contact slurm controller' >&2; exit 1",
            "default_quota = 0.9\n")
    assert quotas(r)["alice"] == (90.0, False)
    assert r.stderr.strip().splitlines() == [
        "gpuslurm fairshare-report: cannot read Slurm's shares, judging by [detect.share] alone: "
        "sshare exited 1: sshare: error: Unable to contact slurm controller"]
