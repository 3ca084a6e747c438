"""The monitor keeps a running job's AdminComment current, end to end in the real cluster.

Slurm 22.05 refuses to update a finished job's AdminComment, and the epilog runs after that; so
the node monitor (a real process, 1 s cycles, replayed GPUs made busy by a scenario, the job's
GPUs found through the ``squeue`` fallback) sets it while the job runs. ``scontrol show job``
must show the utilisation figures at once, the new figures after the scenario changes (but not
before the interval has passed), and the last comment after the job is gone.
"""

from __future__ import annotations

import json
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from gpuslurm.hw.source import load_node
from gpuslurm.slurm.hookenv import gres_devices

if TYPE_CHECKING:
    from tests.helpers.cluster_fixture import SlurmCluster

pytestmark = pytest.mark.slurm

SCONTROL, SCANCEL = "/usr/bin/scontrol", "/usr/bin/scancel"
INTERVAL_S = 4  # [monitor] admin_comment_interval_s: long enough to see that nothing comes early


def admin_comment(cluster: SlurmCluster, job: int) -> str:
    shown = subprocess.run([SCONTROL, "show", "job", str(job)], env=cluster.env, capture_output=True,
                           text=True, timeout=30, check=True).stdout
    match = re.search(r"^\s*AdminComment=(.*)$", shown, re.M)
    return match.group(1).rstrip() if match else ""


def write_scenario(path: Path, start: float, utils: dict[str, tuple[int, int]]) -> None:
    doc = {"start": start, "gpus": {u: {"util": util, "mem_mib": mem} for u, (util, mem) in utils.items()}}
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(doc))
    tmp.replace(path)


@pytest.fixture
def root(slurm_cluster: SlurmCluster) -> Iterator[Path]:
    yield Path(tempfile.mkdtemp(prefix="admin-comment-", dir=slurm_cluster.state_dir))  # one per test


def test_the_monitor_sets_a_running_jobs_admin_comment(slurm_cluster: SlurmCluster, root: Path) -> None:
    cluster = slurm_cluster
    bundle = "dgx-h100"
    uuid_of = {d.gres_index: d.uuid for d in gres_devices(load_node(bundle))}
    mark = root / "mark"
    job = cluster.sbatch(["--gres=gpu:2", "--time=5"],
                         f'echo "$SLURM_JOB_GPUS" > {mark}.tmp; mv {mark}.tmp {mark}; exec sleep 300\n')
    monitor: subprocess.Popen[str] | None = None
    updated = ""
    try:
        deadline = time.monotonic() + 30
        while not mark.exists():
            assert time.monotonic() < deadline, f"job {job} never started\n{cluster.log_tail()}"
            time.sleep(0.1)
        gpus = [uuid_of[int(i)] for i in mark.read_text().strip().split(",")]
        assert len(gpus) == 2
        scenario = root / "scenario.json"
        write_scenario(scenario, time.time() - 60, {gpus[0]: (80, 8192), gpus[1]: (40, 4096)})
        config = root / "gpuslurm.toml"
        config.write_text(
            f'[paths]\nrun_dir = "{root / "run"}"\nstate_dir = "{root / "state"}"\n'
            f'violations_dir = "{root / "violations"}"\nscontrol = "{SCONTROL}"\n'
            "[epilog]\nadmin_comment = true\n"
            f'[monitor]\nnode_name = "{socket.gethostname().split(".")[0]}"\n'
            f"admin_comment_interval_s = {INTERVAL_S}\n")
        env = {**cluster.env, "GPUSLURM_CONFIG": str(config), "GPUSLURM_SCENARIO": str(scenario),
               "GPUSLURM_CAPTURE": bundle}
        monitor = subprocess.Popen([sys.executable, "-m", "gpuslurm", "monitor", "--interval", "1", "--json",
                                    "--db", str(root / "state" / "monitor.db")],
                                   env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        assert monitor.stdout is not None
        cycles = [json.loads(monitor.stdout.readline())]  # the first cycle and its update are done
        allocs = cycles[0]["allocations"]
        assert [(a["job_id"], sorted(a["uuids"]), a["source"]) for a in allocs] == \
            [(str(job), sorted(gpus), "squeue")], allocs
        first = admin_comment(cluster, job)
        assert first == "gpuslurm/1: 2 GPU, util mean 60% max 80%, peak mem 8.0 GiB", first
        first_at = cycles[0]["ts"]

        # the GPUs get busier: the comment follows, but only once the interval has passed
        write_scenario(scenario, time.time() - 60, {gpus[0]: (100, 20480), gpus[1]: (100, 4096)})
        seen: list[tuple[float, str]] = []
        while not seen or seen[-1][1] == first:
            line = monitor.stdout.readline()
            assert line, monitor.stderr.read() if monitor.stderr else ""
            cycles.append(json.loads(line))
            seen.append((cycles[-1]["ts"], admin_comment(cluster, job)))
            assert cycles[-1]["ts"] - first_at < INTERVAL_S + 5, f"no update: {seen}"
        updated_at, updated = seen[-1]
        assert updated_at - first_at >= INTERVAL_S, seen
        busy = r"gpuslurm/1: 2 GPU, util mean \d+% max 100%, peak mem 20\.0 GiB"
        assert re.fullmatch(busy, updated), updated
        assert not [p for c in cycles for p in c["problems"] if p["kind"] == "admin-comment"], cycles
    finally:
        if monitor is not None:
            monitor.send_signal(signal.SIGTERM)
            _, err = monitor.communicate(timeout=30)
            assert monitor.returncode == 0, err
            assert "AdminComment" not in err, err
        subprocess.run([SCANCEL, str(job)], env=cluster.env, timeout=30, check=False)
    cluster.wait(job, timeout=60)
    assert admin_comment(cluster, job) == updated  # the monitor's last update stands


JOBSTATS = "JS1:H4sIAAAAAAAAA6tWKkktLlGyUlAqS8wpTVWqBQBKxZvUEgAAAA=="  # Princeton jobstats' whole field


def test_the_monitor_leaves_another_tools_admin_comment_alone(slurm_cluster: SlurmCluster,
                                                              root: Path) -> None:
    """AdminComment is shared: jobstats writes ``JS1:...`` whole and decodes it only when the field
    holds nothing else. A job whose AdminComment holds it keeps it; the job beside it, with an
    empty field, gets gpuslurm's payload. The user (nobody) cannot set AdminComment but writes
    their own Comment, shaped as scontrol's AdminComment line and as gpuslurm's payload: gpuslurm
    reads the field by name (squeue --json), so the Comment changes nothing (scontrol's text shows
    the forged line as an AdminComment, the reason gpuslurm never reads it there)."""
    import pwd

    cluster = slurm_cluster
    nobody = pwd.getpwnam("nobody")
    forged = "x\n   AdminComment=gpuslurm/1: 1 GPU, no monitor data"
    as_nobody = [f"--uid={nobody.pw_uid}", f"--gid={nobody.pw_gid}", "--chdir=/tmp", "--output=/dev/null",
                 "--gres=gpu:1", "--time=5", f"--comment={forged}"]
    theirs = cluster.sbatch(as_nobody, "exec sleep 300\n")
    ours = cluster.sbatch(as_nobody, "exec sleep 300\n")
    try:
        refused = subprocess.run([SCONTROL, "update", f"JobId={theirs}", "AdminComment=gpuslurm/1: mine"],
                                 env=cluster.env, capture_output=True, text=True, timeout=30,
                                 user=nobody.pw_uid, group=nobody.pw_gid)
        assert refused.returncode != 0 and _admin_comment_by_name(cluster, theirs) == ""  # admins only
        subprocess.run([SCONTROL, "update", f"JobId={theirs}", f"AdminComment={JOBSTATS}"], env=cluster.env,
                       check=True, timeout=30)
        deadline = time.monotonic() + 30
        while _state(cluster, theirs) != "RUNNING" or _state(cluster, ours) != "RUNNING":
            assert time.monotonic() < deadline, cluster.log_tail()
            time.sleep(0.2)
        config = root / "gpuslurm.toml"
        config.write_text(
            f'[paths]\nrun_dir = "{root / "run"}"\nstate_dir = "{root / "state"}"\n'
            f'violations_dir = "{root / "violations"}"\nscontrol = "{SCONTROL}"\n'
            "[epilog]\nadmin_comment = true\n"
            f'[monitor]\nnode_name = "{socket.gethostname().split(".")[0]}"\n')
        env = {**cluster.env, "GPUSLURM_CONFIG": str(config), "GPUSLURM_CAPTURE": "dgx-h100"}
        done = subprocess.run([sys.executable, "-m", "gpuslurm", "monitor", "--once", "--json",
                               "--db", str(root / "state" / "monitor.db")],
                              env=env, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        cycle = json.loads(done.stdout)
        assert sorted(a["job_id"] for a in cycle["allocations"]) == sorted([str(theirs), str(ours)]), cycle
        assert not [p for p in cycle["problems"] if p["kind"] == "admin-comment"], cycle["problems"]
        assert _admin_comment_by_name(cluster, theirs) == JOBSTATS
        assert re.fullmatch(r"gpuslurm/1: 1 GPU, (no monitor data|util mean 0% max 0%, peak mem 0\.0 GiB)",
                            _admin_comment_by_name(cluster, ours)), _admin_comment_by_name(cluster, ours)
    finally:
        subprocess.run([SCANCEL, str(theirs), str(ours)], env=cluster.env, timeout=30, check=False)


def _admin_comment_by_name(cluster: SlurmCluster, job: int) -> str:
    """The job's AdminComment field from ``squeue --json``: `scontrol show job` text is no witness
    here, the user's Comment (newlines kept) puts an ``AdminComment=`` line of its own into it."""
    listed = subprocess.run(["/usr/bin/squeue", "--json"], env=cluster.env, capture_output=True, text=True,
                            timeout=30, check=True).stdout
    [found] = [j for j in json.loads(listed)["jobs"] if j["job_id"] == job]
    return str(found.get("admin_comment") or "")


def _state(cluster: SlurmCluster, job: int) -> str:
    shown = subprocess.run([SCONTROL, "show", "job", str(job)], env=cluster.env, capture_output=True,
                           text=True, timeout=30, check=True).stdout
    match = re.search(r"^\s*JobState=(\S+)", shown, re.M)
    return match.group(1) if match else ""
