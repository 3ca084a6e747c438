"""``gpuslurm pick`` inside real Slurm jobs never leaves the job's GPUs.

Two jobs of two GPUs each run at once on the emulated DGX H100; outside any job pick 2 would
choose GPUs 0 and 1, so the second job (given other GPUs) shows that pick kept to its own.
Each job waits (at most 60 s) until the other has started too: under load the first could end
before the second is scheduled, and Slurm would give the second the same two GPUs.
"""

from __future__ import annotations

import json
import os
import pwd
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from gpuslurm.hw.source import load_node
from gpuslurm.ranges import MAX_CPUS, parse_ranges
from gpuslurm.slurm.hookenv import HookEnv, resolve_job_gpus

if TYPE_CHECKING:
    from tests.helpers.cluster_fixture import SlurmCluster

pytestmark = pytest.mark.slurm
BIN = str(Path(sys.executable).parent / "gpuslurm")

SCRIPT = f"""
echo "GPUS=$SLURM_JOB_GPUS"
touch "$MEET/$SLURM_JOB_ID"
met=no
for _ in $(seq 600); do [ "$(ls "$MEET" | wc -l)" -ge 2 ] && met=yes && break; sleep 0.1; done
{BIN} pick 2 --from dgx-h100 --format json | tr -d '\\n'; echo
{BIN} pick 3 --from dgx-h100 2>&1; echo "rc=$?"
{BIN} pick 1 --from dgx-h100 -- sh -c 'echo "CVD=$CUDA_VISIBLE_DEVICES"'
echo "met=$met"
"""


def test_pick_keeps_to_the_jobs_gpus(slurm_cluster: SlurmCluster) -> None:
    node = load_node("dgx-h100")
    meet = slurm_cluster.state_dir / f"pick-meet-{os.getpid()}"
    meet.mkdir()
    script = SCRIPT.replace("$MEET", str(meet))
    jobs = [slurm_cluster.sbatch(["--gres=gpu:2"], script) for _ in range(2)]
    seen: set[str] = set()
    for job in jobs:
        assert slurm_cluster.wait(job, timeout=90) == "COMPLETED", slurm_cluster.log_tail()
        lines = slurm_cluster.output(job).splitlines()
        assert lines[-1] == "met=yes", ("the two jobs never ran at once", lines)
        indices = tuple(int(i) for i in lines[0].removeprefix("GPUS=").split(","))
        own = {d.uuid for d in resolve_job_gpus(HookEnv(job_gpus=indices), node)}
        assert len(own) == 2
        picked = {g["uuid"] for g in json.loads(lines[1])["gpus"]}
        assert picked == own, (lines, own)
        assert "3 GPUs wanted but the job holds 2" in lines[2] and lines[3] == "rc=2"
        cvd = next(line for line in lines if line.startswith("CVD="))
        assert cvd.removeprefix("CVD=") in own
        # the emulated node's GPUs sit on CPUs this host lacks: the job's CPUs are kept, and said
        kept = [line for line in lines if "keeping the allowed CPUs" in line]
        assert len(kept) <= 1
        seen |= own
    assert len(seen) == 4  # the jobs ran side by side on different GPUs


def test_placement_reads_real_scontrol_detail(slurm_cluster: SlurmCluster) -> None:
    import socket
    import subprocess
    import time

    job = slurm_cluster.sbatch(["--gres=gpu:2", "-c", "4"], 'echo "GPUS=$SLURM_JOB_GPUS"; sleep 30')
    try:
        deadline = time.monotonic() + 60
        while slurm_cluster.state(job) != "RUNNING":
            assert time.monotonic() < deadline, slurm_cluster.log_tail()
            time.sleep(0.3)
        host = socket.gethostname().split(".", 1)[0]
        proc = subprocess.run([BIN, "placement", "--from", "dgx-h100", "--node", host, "--json"],
                              env=slurm_cluster.env, capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0, proc.stderr
        rows = {r["job"]: r for r in json.loads(proc.stdout)["jobs"]}
        row = rows[str(job)]
        time.sleep(0.5)
        gpus = slurm_cluster.output(job).splitlines()[0].removeprefix("GPUS=")
        assert row["gres_idx"] == [int(i) for i in gpus.split(",")]  # IDX = SLURM_JOB_GPUS
        assert len(row["gpus"]) == 2
        # -c 4 on a node of 2 threads per core: two cores, abstract CPU_IDs mapped to 4 OS CPUs
        # (a core's threads are n and n + 112 on the DGX layout)
        assert len(parse_ranges(row["cpus"], MAX_CPUS)) == 4, row
        assert len(parse_ranges(row["slurm_cpus"], MAX_CPUS)) == 4, row
        os_cpus = parse_ranges(row["cpus"], MAX_CPUS)
        assert {c % 112 for c in os_cpus} == {c for c in os_cpus if c < 112}, row
        assert row["numa_affine"] in ("yes", "partly", "no"), row
    finally:
        subprocess.run(["/usr/bin/scancel", str(job)], env=slurm_cluster.env, timeout=30, check=False)


def test_placement_is_not_fooled_by_a_job_name_holding_scontrol_lines(slurm_cluster: SlurmCluster,
                                                                     tmp_path: Path) -> None:
    """As the attacker (nobody): jobs whose names and comment copy scontrol's own layout — the
    victim's ``JobId=`` with nobody as its user and all 8 GPUs, a job 999999 that does not exist
    — submitted beside root's real job. Slurm 22.05 keeps the newlines. The live command reads
    jobs from squeue and each with its own scontrol call: the victim keeps its user, its GPUs
    and its CPUs, and no job is invented. A recording of the same text leaves the victim out as
    ambiguous instead of giving it to nobody."""
    import socket
    import subprocess
    import time

    host = socket.gethostname().split(".", 1)[0]
    # jobs of earlier tests in this session cluster may still be completing: theirs, not invented
    earlier = set(subprocess.run(["/usr/bin/squeue", "-h", "-o", "%i"], env=slurm_cluster.env,
                                 capture_output=True, text=True, timeout=30, check=True).stdout.split())
    victim = slurm_cluster.sbatch(["--gres=gpu:2", "-c", "4", "-J", "victim"], "sleep 60")
    forged = (f"JobId={victim} JobName=victim\n   UserId=nobody(65534) GroupId=nogroup(65534)\n"
              f"   JobState=RUNNING\n     Nodes={host} CPU_IDs=0-7 Mem=0 GRES=gpu:8(IDX:0-7)")
    invented = (f"JobId=999999 JobName=ghost\n   UserId=nobody(65534) GroupId=nogroup(65534)\n"
                f"   JobState=RUNNING\n     Nodes={host} CPU_IDs=0-1 Mem=0 GRES=gpu:8(IDX:0-7)")
    # the uid, not the name: 26.05's sbatch refuses --uid=nobody ("Invalid --uid specification")
    attacker = [f"--uid={pwd.getpwnam('nobody').pw_uid}", "--chdir=/", "--output=/dev/null", "--gres=gpu:1"]
    jobs = [victim,
            slurm_cluster.sbatch([*attacker, "-J", f"a JobId={victim} UserId=nobody(65534) "
                                  "JobState=RUNNING"], "sleep 60"),
            slurm_cluster.sbatch([*attacker, "-J", "b\n" + forged, "--comment", "c\n" + invented],
                                 "sleep 60")]
    try:
        deadline = time.monotonic() + 60
        while any(slurm_cluster.state(j) != "RUNNING" for j in jobs):
            assert time.monotonic() < deadline, slurm_cluster.log_tail()
            time.sleep(0.3)
        # errors="replace": other tests' jobs in this session cluster may have non-UTF-8 names
        text = subprocess.run(["/usr/bin/scontrol", "show", "-d", "job"], env=slurm_cluster.env,
                              capture_output=True, text=True, errors="replace", timeout=30,
                              check=True).stdout
        assert f"\nJobId={victim} JobName=victim\n   UserId=nobody" in text  # the forgery is there
        proc = subprocess.run([BIN, "placement", "--from", "dgx-h100", "--node", host, "--json"],
                              env=slurm_cluster.env, capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0, proc.stderr
        rows = {r["job"]: r for r in json.loads(proc.stdout)["jobs"]}
        # nothing invented, nothing lost
        assert set(rows) - earlier == {str(j) for j in jobs}, (sorted(rows), earlier, jobs)
        assert "999999" not in rows
        mine = rows[str(victim)]
        assert mine["user"] == "root" and len(mine["gres_idx"]) == 2, mine
        assert len(parse_ranges(mine["slurm_cpus"], MAX_CPUS)) == 4, mine
        assert {rows[str(j)]["user"] for j in jobs[1:]} == {"nobody"}
        recording = tmp_path / "scontrol.txt"
        recording.write_text(text)
        proc = subprocess.run([BIN, "placement", "--from", "dgx-h100", "--node", host, "--json",
                               "--input", str(recording)], capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0, proc.stderr
        recorded = {r["job"]: r for r in json.loads(proc.stdout)["jobs"]}
        assert str(victim) not in recorded and f"job {victim} left out" in proc.stderr
        assert all(r["user"] != "nobody" or r["job"] != str(victim) for r in recorded.values())
    finally:
        subprocess.run(["/usr/bin/scancel", *map(str, jobs)], env=slurm_cluster.env, timeout=30,
                       check=False)
