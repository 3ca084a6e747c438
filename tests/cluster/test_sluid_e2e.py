"""Slurm 26.05's SLUIDs in the real cluster: ``scontrol -d show job s<SLUID>`` names the job the
monitor's fallback asks about, also when the job's name forges a ``SLUID=`` line.

With ``GPUSLURM_RECORD_SHOW_JOB=<dir>`` the outputs are written there too: that is how
tests/slurm/show_job/26.05-*.txt were captured (``GPUSLURM_SLURM_RELEASE=26.05``).
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from gpuslurm.slurm.sluid import job_of_sluid_text

if TYPE_CHECKING:
    from tests.helpers.cluster_fixture import SlurmCluster

pytestmark = pytest.mark.slurm

SCONTROL, SCANCEL = "/usr/bin/scontrol", "/usr/bin/scancel"
FORGED = "sAAAAAAAAAAAAA"


def _show(cluster: SlurmCluster, what: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([SCONTROL, "-d", "show", "job", what], env=cluster.env, capture_output=True,
                          text=True, timeout=30, check=False)


def test_a_sluid_names_its_job_through_scontrol(slurm_cluster: SlurmCluster) -> None:
    if os.environ.get("GPUSLURM_SLURM_RELEASE", "22.05") != "26.05":
        pytest.skip("SLUIDs are shown by Slurm 26.05 (docs/compatibility.md)")
    record = os.environ.get("GPUSLURM_RECORD_SHOW_JOB")
    plain = slurm_cluster.sbatch(["--job-name=train"], "sleep 60\n")
    forged = slurm_cluster.sbatch([f"--job-name=x\n   SLUID={FORGED}"], "sleep 60\n")
    try:
        by_id = _show(slurm_cluster, str(plain))
        assert by_id.returncode == 0, by_id.stderr
        sluid = re.search(r"^ {3}SLUID=(\S+)$", by_id.stdout, re.M)
        assert sluid is not None, by_id.stdout
        by_sluid = _show(slurm_cluster, sluid.group(1))
        assert job_of_sluid_text(by_sluid.stdout, sluid.group(1)) == str(plain)
        forged_show = _show(slurm_cluster, str(forged))
        shown = re.findall(r"^ {3}SLUID=(s\w+)$", forged_show.stdout, re.M)
        assert FORGED in shown and len(shown) == 2, forged_show.stdout  # the name's line, then Slurm's
        real = next(s for s in shown if s != FORGED)
        forged_by_sluid = _show(slurm_cluster, real).stdout
        assert job_of_sluid_text(forged_by_sluid, real) == str(forged)  # the name hides nothing
        unknown = _show(slurm_cluster, "s00000000000AB")
        assert unknown.returncode != 0
        if record:
            out = Path(record)
            out.mkdir(parents=True, exist_ok=True)
            (out / "26.05-by-id.txt").write_text(by_id.stdout)
            (out / "26.05-by-sluid.txt").write_text(by_sluid.stdout)
            (out / "26.05-forged-name.txt").write_text(forged_by_sluid)
            (out / "26.05-unknown.txt").write_text(unknown.stdout + unknown.stderr)
            (out / "26.05-sluid").write_text(sluid.group(1) + "\n")
    finally:
        subprocess.run([SCANCEL, str(plain), str(forged)], env=slurm_cluster.env, check=False, timeout=30)
