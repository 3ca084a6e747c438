"""watch/run.run_monitor called directly with the recording Scheduler: the monitor lists jobs, keeps
running jobs' comments and acts only through the adapter it is handed (no scheduler command runs)."""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from pathlib import Path

import pytest
from tests.helpers.recording_scheduler import RecordingScheduler

from gpuslurm.config import Config, EpilogConfig, MonitorConfig, PathsConfig
from gpuslurm.hw.source import hardware_source, load_node
from gpuslurm.samples import Cycle, ProcessReading, Violation
from gpuslurm.state.jobmap import JobMap, MappedDevice, write_map
from gpuslurm.watch.run import MonitorParts, run_monitor

DGX = hardware_source("dgx-h100")

U = [g.uuid for g in load_node("dgx-h100").gpus]


def config(tmp_path: Path, *, admin_comment: bool) -> Config:
    return Config(paths=PathsConfig(run_dir=str(tmp_path / "run"), state_dir=str(tmp_path / "state"),
                                    violations_dir=str(tmp_path / "violations")),
                  epilog=EpilogConfig(admin_comment=admin_comment),
                  monitor=MonitorConfig(node_name="n1", admin_comment_interval_s=600))


def parts(sched: RecordingScheduler, published: list[Sequence[Violation]]) -> MonitorParts:
    return MonitorParts(scheduler_for=lambda timeout: sched,
                        publish=lambda directory, node, found: published.append(found),
                        comment_text=lambda n, figures: f"gpuslurm: {n} GPU")


def test_one_cycle_lists_jobs_and_comments_through_the_adapter(tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = config(tmp_path, admin_comment=True)
    write_map(JobMap("77", "alice", 1000, (MappedDevice(U[2], 2),), time.time() - 5), cfg.paths.jobs_dir)
    (tmp_path / "scenario.json").write_text(json.dumps({"gpus": {U[2]: {"util": 40}}}))
    monkeypatch.setenv("GPUSLURM_SCENARIO", str(tmp_path / "scenario.json"))
    sched = RecordingScheduler()
    published: list[Sequence[Violation]] = []
    cycles: list[Cycle] = []
    run_monitor(cfg, DGX, parts(sched, published), db=str(tmp_path / "state" / "m.db"), once=True,
                on_cycle=cycles.append)
    assert len(cycles) == 1 and isinstance(cycles[0], Cycle)
    assert sched.called("set_running_comment") == [("77", "gpuslurm: 1 GPU")]
    assert (tmp_path / "state" / "m.db").is_file()


def test_a_scheduler_that_keeps_no_comments_is_said_once_and_never_asked(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = config(tmp_path, admin_comment=True)
    write_map(JobMap("77", "alice", 1000, (MappedDevice(U[2], 2),), time.time() - 5), cfg.paths.jobs_dir)
    sched = RecordingScheduler()
    monkeypatch.setattr(sched, "why_no_running_comments", lambda: "no comments here")
    warnings: list[str] = []
    run_monitor(cfg, DGX, parts(sched, []), db=str(tmp_path / "state" / "m.db"), once=True,
                warn=warnings.append)
    assert warnings.count("no comments here") == 1
    assert sched.called("set_running_comment") == []


def test_a_scheduler_that_lists_no_jobs_is_said_once_in_its_own_words_and_never_asked(
        tmp_path: Path) -> None:
    """The adapter says why it lists no jobs, and names itself when its node actions cannot run:
    the monitor repeats its words, with no scheduler's name of its own."""
    cfg = config(tmp_path, admin_comment=False)
    sched = RecordingScheduler(listing="/nowhere/squeue is missing: jobs without a job map stay unattributed",
                               no_actions="/nowhere/scontrol is missing")
    warnings: list[str] = []
    run_monitor(cfg, DGX, parts(sched, []),
                db=str(tmp_path / "state" / "m.db"), once=True, warn=warnings.append)
    assert warnings.count(sched.listing) == 1
    assert sched.called("node_allocations") == []
    assert "/nowhere/scontrol is missing: faults are logged, GPUs recorded out of service, but the " \
           "recording scheduler is not told" in warnings


def test_the_schedulers_cgroup_layout_names_jobs_even_when_it_lists_none(tmp_path: Path) -> None:
    """A process is attributed in the layout of the adapter handed in (here the recording one's,
    as a third scheduler's would be), whether or not its job-listing command is there; without an
    adapter, only gpuslurm's own job cgroups name a job."""
    from gpuslurm.state.store import Store
    from gpuslurm.watch.build import build_monitor
    from gpuslurm.watch.monitor import open_sampler

    fake = tmp_path / "proc"
    (fake / "77").mkdir(parents=True)
    (fake / "stat").write_text("cpu 1 2 3\nbtime 1000\n")
    (fake / "77" / "stat").write_text(f"77 (py) {' '.join(['S'] + ['0'] * 18 + ['500'] + ['0'] * 20)}\n")
    (fake / "77" / "status").write_text("Name:\tpy\nUid:\t1000\t1000\t1000\t1000\n")
    (fake / "77" / "cgroup").write_text("0::/recording:12/task\n")
    sampler, node = open_sampler(DGX)
    store = Store.open(str(tmp_path / "m.db"))
    try:
        for sched, job in ((RecordingScheduler(), "12"), (RecordingScheduler(listing="no squeue"), "12"),
                           (None, None)):
            monitor = build_monitor(sampler, store, "n1", jobs_dir=str(tmp_path / "jobs"), node=node,
                                    scheduler=sched, proc_root=str(fake), warn=lambda line: None)
            samples, _, _ = monitor.attributor.attribute(1.0, [ProcessReading(77, U[0])])
            assert [s.job_id for s in samples] == [job], sched
    finally:
        store.close()
        sampler.close()


@pytest.mark.parametrize("source", ["config", "slurm"])
def test_the_quota_feed_is_the_one_the_configured_source_names(tmp_path: Path, source: str) -> None:
    """watch/ names no scheduler: ``[detect.share] quota_source`` picks among the feeds the entry
    point hands in (Slurm's shares for "slurm"); "config" needs none."""
    from gpuslurm.config import DetectConfig, ShareDetect

    cfg = config(tmp_path, admin_comment=False)
    cfg = cfg._replace(detect=DetectConfig(share=ShareDetect(quota_source=source)))
    asked: list[tuple[str, int]] = []

    class Feed:
        def poll(self, now: float) -> tuple[None, None]:
            return None, None

    def slurm_feed(given: Config, gpus: int) -> Feed:
        asked.append((given.detect.share.quota_source, gpus))
        return Feed()

    run_monitor(cfg, DGX, parts(RecordingScheduler(), [])._replace(quota_feeds={"slurm": slurm_feed}),
                db=str(tmp_path / "state" / "m.db"), once=True)
    assert asked == ([("slurm", len(U))] if source == "slurm" else [])
