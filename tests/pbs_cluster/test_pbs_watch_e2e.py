"""PbsScheduler and the monitor against the real OpenPBS cluster: a real user's job, its process
attributed by its session (no cgroups hook here), its GPUs from exec_vnode; offline/resume with a
comment; refusing a job; a job's comment; status and fairshare-report showing the PBS job."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from tests.helpers.pbs_fixture import PREFIX, PbsCluster
from tests.helpers.slurm_helpers import wait_for_line

from gpuslurm.gres.pbs_vnodes import plan_vnodes
from gpuslurm.hw.source import load_node
from gpuslurm.pbs.qstat import parse_pbsnodes_json, parse_qstat_json
from gpuslurm.pbs.scheduler import PbsScheduler
from gpuslurm.state.jobmap import JobMap, MappedDevice, write_map

pytestmark = pytest.mark.pbs

BUNDLE = os.environ.get("GPUSLURM_BUNDLE", "dgx-h100")
COMMANDS = ("qstat", "pbsnodes", "qalter", "qhold", "qrerun", "qdel", "qmgr")  # conftest.py wraps these


def _scheduler(pbs_bin: Path, jobs_dir: Path | None = None) -> PbsScheduler:
    return PbsScheduler(qstat=str(pbs_bin / "qstat"), pbsnodes=str(pbs_bin / "pbsnodes"), timeout=30,
                        jobs_dir=str(jobs_dir) if jobs_dir else None, qalter=str(pbs_bin / "qalter"),
                        qhold=str(pbs_bin / "qhold"), qrerun=str(pbs_bin / "qrerun"),
                        qdel=str(pbs_bin / "qdel"))


def _state(cluster: PbsCluster, job: str) -> dict[str, object]:
    doc = json.loads(cluster.run(str(PREFIX / "bin" / "qstat"), "-f", "-F", "json", job))
    item: dict[str, object] = doc["Jobs"][job]
    return item


def _wait_state(cluster: PbsCluster, job: str, want: str, timeout: float = 60) -> dict[str, object]:
    deadline = time.monotonic() + timeout
    while True:
        item = _state(cluster, job)
        if item["job_state"] == want or time.monotonic() > deadline:
            return item
        time.sleep(0.5)


@pytest.fixture
def gpu_job(pbs_cluster: PbsCluster) -> Iterator[tuple[str, int]]:
    """A running job of the test user holding all 4 GPUs of a NUMA vnode; (job id, its shell's pid)."""
    mark = pbs_cluster.state_dir / "jobs" / f"watch-{os.getpid()}-{time.monotonic_ns()}"
    job = pbs_cluster.qsub(["-l", "select=1:ncpus=4:ngpus=4"], f'echo "$$" > {mark}\nexec sleep 300\n')
    try:
        pid = int(wait_for_line(mark, 60))
        # pbs_mom reports the job's session to the server with its next status update
        deadline = time.monotonic() + 60
        while "session_id" not in _state(pbs_cluster, job) and time.monotonic() < deadline:
            time.sleep(0.5)
        yield job, pid
    finally:
        pbs_cluster.run(str(PREFIX / "bin" / "qdel"), "-W", "force", job, check=False)


def _numa_uuids(exec_vnode: str) -> list[str]:
    node = load_node(BUNDLE)
    numa = int(re.fullmatch(r"\(pbshost\[(\d+)\]:ncpus=4:ngpus=4\)", exec_vnode).group(1))  # type: ignore[union-attr]
    minors = next(v.gpu_minors for v in plan_vnodes(node) if v.numa_node == numa)
    return sorted(g.uuid for g in node.gpus if g.minor in minors)


def test_node_allocations_and_sessions(pbs_cluster: PbsCluster, pbs_bin: Path, gpu_job: tuple[str, int],
                                       tmp_path: Path) -> None:
    job, pid = gpu_job
    item = _state(pbs_cluster, job)
    sched = _scheduler(pbs_bin, tmp_path / "jobs")
    allocs = {a.job_id: a for a in sched.node_allocations("pbshost", load_node(BUNDLE))}
    mine = allocs[job]
    assert (mine.user, mine.source) == ("gpuspbs1", "qstat")
    assert mine.uid == int(subprocess.run(["id", "-u", "gpuspbs1"], capture_output=True, text=True,
                                          check=True).stdout)
    assert sorted(mine.uuids) == _numa_uuids(str(item["exec_vnode"]))
    assert abs(mine.start - time.time()) < 600
    assert item["session_id"] == os.getsid(pid)
    assert sched.sessions() == {os.getsid(pid): job}  # the job's shell leads the session
    assert sched.node_allocations("otherhost", load_node(BUNDLE)) == ()
    # a job map (what execjob_begin writes) is the truth about the GPUs
    chosen = _numa_uuids(str(item["exec_vnode"]))[:1]
    write_map(JobMap(job, "gpuspbs1", mine.uid, (MappedDevice(chosen[0], 0),), 1.0), str(tmp_path / "jobs"))
    again = {a.job_id: a for a in sched.node_allocations("pbshost", load_node(BUNDLE))}[job]
    assert (again.uuids, again.source) == (tuple(chosen), "map")


def _config(tmp_path: Path, pbs_bin: Path) -> Path:
    config = tmp_path / "gpuslurm.toml"
    config.write_text(f'[paths]\nrun_dir = "{tmp_path / "run"}"\nstate_dir = "{tmp_path / "state"}"\n'
                      f'violations_dir = "{tmp_path / "violations"}"\n'
                      + "".join(f'{name} = "{pbs_bin / name}"\n' for name in COMMANDS)
                      + '[monitor]\nnode_name = "pbshost"\n[scheduler]\nkind = "pbs"\n')
    return config


def _gpuslurm(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gpuslurm", *args], env=env, capture_output=True, text=True,
                          timeout=120, check=False)


def test_monitor_status_and_report_show_the_pbs_job(pbs_cluster: PbsCluster, pbs_bin: Path,
                                                    gpu_job: tuple[str, int], tmp_path: Path) -> None:
    job, pid = gpu_job
    given = _numa_uuids(str(_state(pbs_cluster, job)["exec_vnode"]))
    other = next(g.uuid for g in load_node(BUNDLE).gpus if g.uuid not in given)
    scenario = tmp_path / "scenario.json"
    scenario.write_text(json.dumps({"procs": [{"pid": pid, "gpu": given[0], "mem_mib": 100, "sm": 50},
                                              {"pid": pid, "gpu": other, "mem_mib": 50}]}))
    env = {**os.environ, "GPUSLURM_CONFIG": str(_config(tmp_path, pbs_bin)),
           "GPUSLURM_SCENARIO": str(scenario), "GPUSLURM_CAPTURE": BUNDLE}
    db = tmp_path / "state" / "monitor.db"
    out = _gpuslurm(env, "monitor", "--once", "--json", "--db", str(db))
    assert out.returncode == 0, out.stderr
    cycle = json.loads(out.stdout)
    procs = {p["gpu_uuid"]: p for p in cycle["procs"]}
    # no cgroups hook in this cluster: the job's session names the job
    assert procs[given[0]]["job_id"] == job and procs[other]["job_id"] == job
    assert procs[given[0]]["user"] == "gpuspbs1"
    allocs = {a["job_id"]: a for a in cycle["allocations"]}
    assert sorted(allocs[job]["uuids"]) == given and allocs[job]["source"] == "qstat"
    rogue = [json.loads(line) for f in (tmp_path / "violations").iterdir()
             for line in f.read_text().splitlines()]
    assert [(v["kind"], v["pid"], v["gpu_uuid"], v["job_id"]) for v in rogue] == [("rogue", pid, other, job)]

    report = _gpuslurm(env, "fairshare-report", "--db", str(db), "--by", "job", "--format", "json",
                       "--last", "1h")
    assert report.returncode == 0, report.stderr
    assert job in report.stdout and "gpuspbs1" in report.stdout

    # status: the job's map (as execjob_begin writes it) names it, its user and its GPUs
    run_jobs = tmp_path / "run" / "jobs"
    uid = int(subprocess.run(["id", "-u", "gpuspbs1"], capture_output=True, text=True, check=True).stdout)
    write_map(JobMap(job, "gpuspbs1", uid, (MappedDevice(given[0], 0),), time.time()), str(run_jobs))
    status = _gpuslurm(env, "status", "--json", "--db", str(db))
    assert status.returncode == 0, status.stderr
    assert job in status.stdout and "gpuspbs1" in status.stdout


def test_offline_with_comment_and_resume(pbs_cluster: PbsCluster, pbs_bin: Path) -> None:
    sched = _scheduler(pbs_bin)
    reason = "gpuslurm: GPU-0c1f xid 79\n(fallen off the bus)"
    try:
        sched.drain_node("pbshost", reason)
        nodes = parse_pbsnodes_json(pbs_cluster.run(str(PREFIX / "bin" / "pbsnodes"), "-av", "-F", "json"))
        assert {n.name: ("offline" in n.states, n.comment) for n in nodes} == \
            {n.name: (True, "gpuslurm: GPU-0c1f xid 79 (fallen off the bus)") for n in nodes}
        sched.drain_node("pbshost", "gpuslurm: " + "x" * 200)  # pbsnodes keeps 79 characters
        comments = {n.comment for n in parse_pbsnodes_json(
            pbs_cluster.run(str(PREFIX / "bin" / "pbsnodes"), "-av", "-F", "json"))}
        assert comments == {"gpuslurm: " + "x" * 66 + "..."}
    finally:
        sched.resume_node("pbshost")
    nodes = parse_pbsnodes_json(pbs_cluster.run(str(PREFIX / "bin" / "pbsnodes"), "-av", "-F", "json"))
    assert all("offline" not in n.states and n.comment == "" for n in nodes)


def test_refuse_job_holds_and_requeues_with_the_reason(pbs_cluster: PbsCluster, pbs_bin: Path) -> None:
    job = pbs_cluster.qsub(["-l", "select=1:ncpus=1"], "sleep 300\n")
    try:
        assert _wait_state(pbs_cluster, job, "R")["job_state"] == "R"
        sched = _scheduler(pbs_bin)
        done = sched.refuse_job(job, "gpuslurm: malformed MPS request, fix it and qrls")
        assert done == "held and requeued"
        item = _wait_state(pbs_cluster, job, "H")
        assert item["job_state"] == "H" and item["Hold_Types"] == "u"
        assert "malformed MPS request" in str(item.get("comment", "")), item.get("comment")
    finally:
        pbs_cluster.run(str(PREFIX / "bin" / "qdel"), "-W", "force", job, check=False)


def test_refusing_a_job_pbs_cannot_rerun_deletes_it(pbs_cluster: PbsCluster, pbs_bin: Path) -> None:
    job = pbs_cluster.qsub(["-r", "n", "-l", "select=1:ncpus=1"], "sleep 300\n")
    try:
        assert _wait_state(pbs_cluster, job, "R")["job_state"] == "R"
        assert _scheduler(pbs_bin).refuse_job(job, "gpuslurm: no") == "deleted"
        deadline = time.monotonic() + 30
        while True:  # qdel returns before the job has ended
            done = pbs_cluster.run(str(PREFIX / "bin" / "qstat"), "-xf", "-F", "json", job)
            state = json.loads(done)["Jobs"][job]["job_state"]
            if state in ("E", "F") or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        assert state in ("E", "F")
    finally:
        pbs_cluster.run(str(PREFIX / "bin" / "qdel"), "-W", "force", job, check=False)


def test_set_admin_comment_on_a_running_job(pbs_cluster: PbsCluster, pbs_bin: Path) -> None:
    job = pbs_cluster.qsub(["-l", "select=1:ncpus=1"], "sleep 300\n")
    try:
        assert _wait_state(pbs_cluster, job, "R")["job_state"] == "R"
        # PBS writes its own "Job run at ..." comment as the job starts, sometimes after the state
        # shows R: wait for it, or it overwrites ours (the monitor rewrites its comment each cycle)
        deadline = time.monotonic() + 30
        while not str(_state(pbs_cluster, job).get("comment", "")).startswith("Job run at"):
            assert time.monotonic() < deadline, _state(pbs_cluster, job)
            time.sleep(0.2)
        text = "gpuslurm: 2 GPUs, used 37%, idle 1.2 GPU-h; peak 40 GiB = ok, \"quoted\""
        _scheduler(pbs_bin).set_admin_comment(job, text)
        assert str(_state(pbs_cluster, job)["comment"]).strip() == text.replace('"', "'")
        _scheduler(pbs_bin).set_admin_comment(job, "gpuslurm: plain words")  # no quoting needed
        assert _state(pbs_cluster, job)["comment"] == "gpuslurm: plain words"
        jobs = parse_qstat_json(pbs_cluster.run(str(PREFIX / "bin" / "qstat"), "-f", "-F", "json", job))
        assert [j.job_id for j in jobs] == [job]
    finally:
        pbs_cluster.run(str(PREFIX / "bin" / "qdel"), "-W", "force", job, check=False)
