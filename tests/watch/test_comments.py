"""The monitor keeps running jobs' AdminComment current: which jobs are updated when, failures.

The scheduling is tested with recording functions; the monitor end to end with a real store, a
real replayed node and a stand-in ``scontrol`` executable run through the runner.
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from gpuslurm.errors import CommandError, GpuslurmError, InputError
from gpuslurm.hooks.epilog import admin_comment
from gpuslurm.hw.replay.scenario import ScenarioSampler
from gpuslurm.hw.source import load_node
from gpuslurm.samples import Allocation
from gpuslurm.slurm.scontrol import refused_as_finished, set_admin_comment
from gpuslurm.state.jobmap import JobMap, MappedDevice, write_map
from gpuslurm.state.store import GpuStats, Store
from gpuslurm.watch.attribute import Attributor
from gpuslurm.watch.comments import PROBLEM_KIND, CommentUpdater
from gpuslurm.watch.monitor import Monitor

NODE = load_node("dgx-h100")
U = [g.uuid for g in NODE.gpus]


def alloc(job_id: str, *uuids: str, start: float = 100.0) -> Allocation:
    return Allocation(job_id, "alice", 1000, uuids or (U[0],), start)


class Recorder:
    """Records every stats query and comment sent; fails as told."""

    def __init__(self) -> None:
        self.sent: list[tuple[float, str, str]] = []
        self.queries: list[tuple[tuple[str, ...], float, float]] = []
        self.fail: dict[str, GpuslurmError] = {}
        self.stats_fail: set[str] = set()
        self.now = 0.0

    def stats(self, uuids: Sequence[str], since: float, until: float) -> Mapping[str, Any]:
        self.queries.append((tuple(uuids), since, until))
        if set(uuids) & self.stats_fail:
            raise InputError("database disk image is malformed", source="monitor.db")
        return {u: GpuStats(u, 10, 10, 50.0, 80.0, 2048.0) for u in uuids}

    def send(self, job_id: str, text: str) -> None:
        self.sent.append((self.now, job_id, text))
        if job_id in self.fail:
            raise self.fail[job_id]

    def updater(self, interval_s: float = 300.0) -> CommentUpdater:
        return CommentUpdater(interval_s, stats=self.stats, text=admin_comment, send=self.send,
                              finished=refused_as_finished)

    def run(self, up: CommentUpdater, now: float, allocations: Sequence[Allocation]) -> list[Any]:
        self.now = now
        return list(up.update(now, allocations))

    def jobs_at(self, now: float) -> list[str]:
        return [j for t, j, _ in self.sent if t == now]


def test_every_job_is_updated_when_first_seen_then_once_per_interval() -> None:
    r = Recorder()
    up = r.updater(300)
    jobs = [alloc("11", U[0], U[1], start=50.0), alloc("12", U[2])]
    assert r.run(up, 1000, jobs) == []
    assert r.jobs_at(1000) == ["11", "12"]
    assert r.queries[0] == ((U[0], U[1]), 50.0, 1000.0)  # the job's GPUs since it started
    assert r.sent[0][2] == "gpuslurm: 2 GPU, util mean 50% max 80%, peak mem 2.0 GiB"
    for now in (1010, 1200, 1299.9):
        r.run(up, now, jobs)
        assert r.jobs_at(now) == [], now
    r.run(up, 1300, jobs)
    assert r.jobs_at(1300) == ["11", "12"]
    assert len(r.sent) == 4


def test_a_job_seen_for_the_first_time_is_updated_at_once_the_others_wait() -> None:
    r = Recorder()
    up = r.updater(300)
    r.run(up, 1000, [alloc("11")])
    r.run(up, 1100, [alloc("11"), alloc("13", U[3])])
    assert r.jobs_at(1100) == ["13"]
    r.run(up, 1300, [alloc("11"), alloc("13", U[3])])
    assert r.jobs_at(1300) == ["11"]
    r.run(up, 1400, [alloc("11"), alloc("13", U[3])])
    assert r.jobs_at(1400) == ["13"]


def test_a_job_that_left_is_forgotten() -> None:
    r = Recorder()
    up = r.updater(300)
    r.run(up, 1000, [alloc("11"), alloc("12")])
    r.run(up, 1010, [alloc("12")])
    assert set(up.tried) == {"12"}  # the record cannot grow with every job the node ran
    r.run(up, 1020, [alloc("11"), alloc("12")])  # same id again (a requeued job): a new first sight
    assert r.jobs_at(1020) == ["11"]


def test_a_job_listed_twice_is_updated_once() -> None:
    r = Recorder()
    up = r.updater(300)
    r.run(up, 1000, [alloc("11", U[0]), alloc("11", U[0])])
    assert r.jobs_at(1000) == ["11"]


def test_a_failure_is_a_problem_and_the_job_waits_a_whole_interval() -> None:
    r = Recorder()
    up = r.updater(300)
    r.fail["11"] = CommandError("scontrol exited 1: Invalid job id specified", ("scontrol",), 1,
                                "Invalid job id specified\n")
    problems = r.run(up, 1000, [alloc("11"), alloc("12")])
    assert [(p.ts, p.kind, p.subject) for p in problems] == [(1000, PROBLEM_KIND, "11")]
    assert "Invalid job id" in problems[0].detail
    assert r.jobs_at(1000) == ["11", "12"]  # one job's failure does not stop the others
    assert r.run(up, 1010, [alloc("11"), alloc("12")]) == []
    assert r.jobs_at(1010) == []  # no retry every cycle: one scontrol per job per interval
    del r.fail["11"]
    assert r.run(up, 1300, [alloc("11"), alloc("12")]) == []
    assert r.jobs_at(1300) == ["11", "12"]


def test_a_job_slurm_says_has_finished_is_not_a_problem() -> None:
    r = Recorder()
    up = r.updater(300)
    r.fail["11"] = CommandError("scontrol exited 1: Job has already finished", ("scontrol",), 1,
                                "Job has already finished\n")
    assert r.run(up, 1000, [alloc("11")]) == []
    assert r.run(up, 1010, [alloc("11")]) == [] and r.jobs_at(1010) == []


def test_scontrol_that_cannot_run_postpones_the_rest_of_the_round() -> None:
    r = Recorder()
    up = r.updater(300)
    r.fail["11"] = CommandError("scontrol: timed out after 10 s", ("scontrol",))
    jobs = [alloc("11"), alloc("12"), alloc("13")]
    problems = r.run(up, 1000, jobs)
    assert r.jobs_at(1000) == ["11"]  # at most one timeout per interval
    assert [p.subject for p in problems] == ["11"]
    assert "timed out" in problems[0].detail and "2 other job(s) wait" in problems[0].detail
    r.run(up, 1010, jobs)
    assert r.jobs_at(1010) == []
    del r.fail["11"]
    r.run(up, 1300, jobs)
    assert r.jobs_at(1300) == ["11", "12", "13"]


def test_an_unreadable_store_keeps_the_last_comment() -> None:
    r = Recorder()
    up = r.updater(300)
    r.stats_fail = {U[5]}
    problems = r.run(up, 1000, [alloc("11", U[5]), alloc("12", U[6])])
    assert [(p.subject, p.detail) for p in problems] == \
        [("11", "cannot read the store: monitor.db: database disk image is malformed")]
    assert r.jobs_at(1000) == ["12"]  # never "no monitor data" over a good earlier comment


def test_refused_as_finished() -> None:
    assert refused_as_finished(CommandError("scontrol exited 1: Job has already finished", (), 1, ""))
    assert refused_as_finished(CommandError("scontrol exited 1: x", (), 1,
                                            "scontrol: error: Job/step already completing or completed\n"))
    assert not refused_as_finished(CommandError("scontrol exited 1: Invalid job id specified", (), 1, ""))
    assert not refused_as_finished(CommandError("scontrol: timed out after 1 s", ()))
    assert not refused_as_finished(InputError("Job has already finished"))


# -- the monitor, end to end on one node ------------------------------------------------------


def stand_in_scontrol(root: Path, *, stderr: str = "", code: int = 0) -> tuple[Path, Path]:
    """An executable that records each call's argv as one JSON line."""
    log = root / "scontrol.jsonl"
    script = root / "scontrol"
    script.write_text("#!/usr/bin/env python3\nimport json, sys\n"
                      f"open({str(log)!r}, 'a').write(json.dumps(sys.argv[1:]) + '\\n')\n"
                      f"sys.stderr.write({stderr!r})\nsys.exit({code})\n")
    script.chmod(0o755)
    return script, log


def calls(log: Path) -> list[list[str]]:
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


class Clock:
    def __init__(self, t: float) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def node_monitor(tmp_path: Path, scontrol: Path, clock: Clock, warnings: list[str],
                 store: Store) -> Monitor:
    scenario = tmp_path / "scenario.json"
    scenario.write_text(json.dumps({"start": clock.t - 100, "steps": [{"at": 0, "gpus": {
        U[0]: {"util": 90, "mem_mib": 30720}, U[1]: {"util": 30, "mem_mib": 1024}}}]}))
    jobs = tmp_path / "run" / "jobs"
    write_map(JobMap("4242", "alice", 1000, (MappedDevice(U[0], 0), MappedDevice(U[1], 1)),
                     clock.t - 5), str(jobs))

    def send(job_id: str, text: str) -> None:
        set_admin_comment(job_id, text, scontrol=str(scontrol), timeout=10)

    comments = CommentUpdater(60, stats=store.gpu_stats, text=admin_comment, send=send,
                              finished=refused_as_finished)
    return Monitor(ScenarioSampler(NODE, scenario), Attributor(jobs_dir=str(jobs)), store, "node07",
                   comments=comments, warn=warnings.append, clock=clock)


def test_the_monitor_sets_the_comment_from_what_it_stored(tmp_path: Path) -> None:
    scontrol, log = stand_in_scontrol(tmp_path)
    clock = Clock(time.time())
    warnings: list[str] = []
    with Store.open(str(tmp_path / "monitor.db")) as store:
        mon = node_monitor(tmp_path, scontrol, clock, warnings, store)
        mon.cycle()
        assert calls(log) == [["update", "JobId=4242",
                               "AdminComment=gpuslurm: 2 GPU, util mean 60% max 90%, peak mem 30.0 GiB"]]
        for _ in range(5):
            clock.t += 10
            mon.cycle()
        assert len(calls(log)) == 1  # within the interval: nothing
        clock.t += 10
        mon.cycle()  # 60 s after the first update
        assert len(calls(log)) == 2
    assert warnings == []


def test_a_failing_scontrol_is_a_stored_problem_and_the_loop_goes_on(tmp_path: Path) -> None:
    scontrol, log = stand_in_scontrol(tmp_path, stderr="slurm_update error: Access/permission denied\n",
                                      code=1)
    clock = Clock(time.time())
    warnings: list[str] = []
    with Store.open(str(tmp_path / "monitor.db")) as store:
        mon = node_monitor(tmp_path, scontrol, clock, warnings, store)
        first = mon.cycle()
        clock.t += 10
        second = mon.cycle()
        clock.t += 10
        third = mon.cycle()
    conn = sqlite3.connect(f"file:{tmp_path / 'monitor.db'}?mode=ro", uri=True)
    try:
        stored = conn.execute("SELECT ts, kind, subject FROM problem").fetchall()
    finally:
        conn.close()
    assert len(calls(log)) == 1
    assert first.problems == () and third.problems == ()
    [p] = second.problems  # said with the next cycle: the cycle that met it was already stored
    assert (p.ts, p.kind, p.subject) == (first.ts, "admin-comment", "4242")
    assert "Access/permission denied" in p.detail
    assert stored == [(first.ts, "admin-comment", "4242")]
    assert warnings == [f"cannot update the AdminComment of job 4242: {p.detail}"]


def test_a_bug_in_the_updater_never_stops_the_cycle(tmp_path: Path) -> None:
    clock = Clock(time.time())
    warnings: list[str] = []

    def broken(uuids: Sequence[str], since: float, until: float) -> Mapping[str, Any]:
        raise ZeroDivisionError("oops")

    with Store.open(str(tmp_path / "monitor.db")) as store:
        mon = node_monitor(tmp_path, tmp_path / "none", clock, warnings, store)
        mon.comments = CommentUpdater(60, stats=broken, text=admin_comment, send=lambda j, t: None)
        mon.cycle()
        clock.t += 10
        second = mon.cycle()
    assert [(p.kind, p.subject) for p in second.problems] == [("admin-comment", "monitor")]
    assert warnings == ["cannot update AdminComments: internal error: ZeroDivisionError: oops"]


@pytest.mark.parametrize(("admin_comment_on", "expected"), [(False, 0), (True, 1)])
def test_the_monitor_command_follows_the_epilog_switch(tmp_path: Path, admin_comment_on: bool,
                                                       expected: int) -> None:
    from click.testing import CliRunner

    from gpuslurm.cli.main import cli

    scontrol, log = stand_in_scontrol(tmp_path)
    write_map(JobMap("77", "alice", 1000, (MappedDevice(U[2], 2),), time.time() - 5),
              str(tmp_path / "run" / "jobs"))
    (tmp_path / "scenario.json").write_text(json.dumps({"gpus": {U[2]: {"util": 40}}}))
    squeue = tmp_path / "squeue"  # job 77, its AdminComment empty (gpuslurm writes only into its own)
    listed = json.dumps({"errors": [], "jobs": [{"job_id": 77, "nodes": "", "admin_comment": ""}]})
    squeue.write_text(f"#!/bin/sh\necho '{listed}'\n")
    squeue.chmod(0o755)
    config = tmp_path / "gpuslurm.toml"
    config.write_text(f'[paths]\nrun_dir = "{tmp_path / "run"}"\nstate_dir = "{tmp_path / "state"}"\n'
                      f'scontrol = "{scontrol}"\nsqueue = "{squeue}"\n'
                      f'[epilog]\nadmin_comment = {str(admin_comment_on).lower()}\n'
                      "[monitor]\nadmin_comment_interval_s = 600\n")
    env = {"GPUSLURM_CONFIG": str(config), "GPUSLURM_SCENARIO": str(tmp_path / "scenario.json"),
           "GPUSLURM_CAPTURE": "dgx-h100"}
    result = CliRunner().invoke(cli, ["monitor", "--once", "--db", str(tmp_path / "state" / "m.db")],
                                env=env, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert len(calls(log)) == expected
    if expected:
        assert calls(log)[0][2] == "AdminComment=gpuslurm/1: 1 GPU, util mean 40% max 40%, peak mem 0.0 GiB"


def test_the_monitor_command_warns_when_scontrol_is_missing(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from gpuslurm.cli.main import cli

    config = tmp_path / "gpuslurm.toml"
    config.write_text(f'[paths]\nrun_dir = "{tmp_path / "run"}"\nstate_dir = "{tmp_path / "state"}"\n'
                      f'scontrol = "{tmp_path / "no-scontrol"}"\nsqueue = "{tmp_path / "no-squeue"}"\n'
                      "[epilog]\nadmin_comment = true\n"
                      '[scheduler]\nkind = "slurm"\n')  # auto: PBS where this host has OpenPBS's qstat
    (tmp_path / "scenario.json").write_text("{}")
    env = {"GPUSLURM_CONFIG": str(config), "GPUSLURM_CAPTURE": "dgx-h100",
           "GPUSLURM_SCENARIO": str(tmp_path / "scenario.json")}
    result = CliRunner().invoke(cli, ["monitor", "--once", "--db",
                                                      str(tmp_path / "state" / "m.db")], env=env)
    assert result.exit_code == 0, result.output
    assert "no-scontrol is missing: jobs' AdminComment is not kept current" in result.stderr


def test_the_monitor_on_pbs_keeps_no_running_jobs_comment(tmp_path: Path) -> None:
    """[epilog] admin_comment is Slurm's AdminComment: on PBS the monitor says once that it keeps
    none, and runs no qalter."""
    from click.testing import CliRunner

    from gpuslurm.cli.main import cli

    qalter = tmp_path / "qalter"
    qalter.write_text(f"#!/bin/sh\necho \"$@\" >> {tmp_path / 'qalter.log'}\n")
    qalter.chmod(0o755)
    config = tmp_path / "gpuslurm.toml"
    config.write_text(f'[paths]\nrun_dir = "{tmp_path / "run"}"\nstate_dir = "{tmp_path / "state"}"\n'
                      f'qalter = "{qalter}"\nqstat = "{tmp_path / "no-qstat"}"\n'
                      '[epilog]\nadmin_comment = true\n[scheduler]\nkind = "pbs"\n')
    env = {"GPUSLURM_CONFIG": str(config), "GPUSLURM_CAPTURE": "dgx-h100"}
    result = CliRunner().invoke(cli, ["monitor", "--once", "--db", str(tmp_path / "state" / "m.db")], env=env)
    assert result.exit_code == 0, result.output
    assert result.stderr.count("keeps no running PBS job's comment current") == 1
    assert not (tmp_path / "qalter.log").exists()
