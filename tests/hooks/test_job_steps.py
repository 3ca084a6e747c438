"""``job_start`` and ``job_end`` called directly, with a recording Scheduler
(tests/helpers/recording_scheduler.py) on a replayed DGX H100: what each step asks of the
scheduler, in the fault cases, without Slurm's or PBS's hook input in between
(tests/hooks/test_prolog.py runs them through Slurm's)."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from tests.helpers.hook_helpers import HookSite, make_site
from tests.helpers.recording_scheduler import RecordingScheduler

from gpuslurm.config import load_config
from gpuslurm.errors import EXIT_UNHEALTHY, CommandError
from gpuslurm.hooks.epilog import job_end
from gpuslurm.hooks.log import HookLog
from gpuslurm.hooks.prolog import job_start
from gpuslurm.hw.source import hardware_source
from gpuslurm.state.job import GpuClaim, HookJob
from gpuslurm.state.jobmap import read_map
from gpuslurm.state.out_of_service import HOLDER_COMMENT


@pytest.fixture
def site(tmp_path: Path) -> HookSite:
    return make_site(tmp_path)


def quiet(hook: str) -> HookLog:
    return HookLog(hook, stream=io.StringIO(), use_syslog=False)


def a_job(*indices: int, **fields: object) -> HookJob:
    return HookJob("recording", "1234", 1000, "alice", "node07",
                   gpus=GpuClaim(indices=indices) if indices else None)._replace(**fields)


def start(site: HookSite, job: HookJob, sched: RecordingScheduler, log: HookLog | None = None) -> int:
    return job_start(job, sched, load_config(str(site.config)), log or quiet("prolog"),
                     hardware_source(str(site.bundle)))


def end(site: HookSite, job: HookJob, sched: RecordingScheduler, log: HookLog | None = None) -> int:
    return job_end(job, sched, load_config(str(site.config)), log or quiet("epilog"),
                   hardware_source(str(site.bundle)))


def test_a_healthy_job_is_mapped_and_the_scheduler_only_asked_whether_it_isolates(site: HookSite) -> None:
    sched = RecordingScheduler(constrains=True)
    assert start(site, a_job(1, 3), sched) == 0
    assert sched.calls == [("constrains_devices", ())]  # [cgroup] devices = "auto": the scheduler's say
    jmap = read_map("1234", str(site.jobs_dir))
    assert jmap is not None and jmap.uuids == (site.uuids[1], site.uuids[3])


def test_a_holder_of_a_gpu_out_of_service_asks_nothing_and_gets_no_map(site: HookSite) -> None:
    sched = RecordingScheduler()
    holder = a_job(2, uid=0, user="root", comment=HOLDER_COMMENT)
    assert start(site, holder, sched) == 0
    assert [name for name, _ in sched.calls] == ["constrains_devices"]
    assert not (site.jobs_dir / "1234.json").exists()


def test_a_drain_fault_drains_through_the_scheduler_and_fails_the_step(site: HookSite) -> None:
    site.set_health({site.uuids[2]: {"temperature_c": 95}})
    sched = RecordingScheduler()
    assert start(site, a_job(0, 2), sched) == EXIT_UNHEALTHY
    [(node, reason)] = sched.called("drain_node")
    assert node == "node07"
    assert reason == (f"gpuslurm: GPU index 2 (/dev/nvidia2, {site.uuids[2]}): "
                      "temperature 95 C over limit 85 C")
    assert sched.called("requeue_job") == sched.called("refuse_job") == []
    assert not (site.jobs_dir / "1234.json").exists()


def test_a_drain_the_scheduler_refuses_still_fails_the_step(site: HookSite) -> None:
    site.set_health({site.uuids[0]: {"lost": True}})
    sched, log = RecordingScheduler(fail=("drain_node",)), quiet("prolog")
    assert start(site, a_job(0), sched, log) == EXIT_UNHEALTHY  # the scheduler drains it on the failure
    assert any("could not drain node07" in line for line in log.lines)


def test_a_gpu_out_fault_takes_the_gpu_out_and_requeues_the_job(site: HookSite) -> None:
    site.write_config('[health.xid]\naction = "gpu_out"\n')
    site.set_health({site.uuids[2]: {"xid": [79]}})
    sched = RecordingScheduler()
    assert start(site, a_job(1, 2), sched) == 0  # the node stays up
    [(_, reason)] = sched.called("drain_node")
    assert reason.startswith(f"gpuslurm: GPU out: index 2 (/dev/nvidia2, {site.uuids[2]}): Xid 79")
    [(job_id, why)] = sched.called("requeue_job")
    assert job_id == "1234" and why.startswith("gpuslurm requeued this job: ") and "Xid 79" in why
    assert not (site.jobs_dir / "1234.json").exists()


def test_a_requeue_the_scheduler_refuses_fails_the_step_with_its_code(site: HookSite) -> None:
    site.write_config('[health.xid]\naction = "gpu_out"\n')
    site.set_health({site.uuids[2]: {"xid": [79]}})
    sched = RecordingScheduler(fail=("requeue_job",))
    assert start(site, a_job(2), sched) == CommandError("x").exit_code != 0


def test_a_malformed_mps_request_refuses_the_job_not_the_node(site: HookSite) -> None:
    sched = RecordingScheduler()
    assert start(site, a_job(0, mps_share="250"), sched) == 0
    [(job_id, why)] = sched.called("refuse_job")
    assert job_id == "1234" and why.startswith("gpuslurm refused this job: bad MPS request")
    assert sched.called("drain_node") == []


def test_job_end_removes_the_map_and_gives_the_scheduler_the_summary_line(site: HookSite) -> None:
    site.write_config("[epilog]\nadmin_comment = true\n")
    sched = RecordingScheduler()
    assert start(site, a_job(4, 5), sched) == 0
    assert end(site, a_job(4, 5), sched) == 0
    assert not (site.jobs_dir / "1234.json").exists()
    [(job_id, text)] = sched.called("set_final_comment")
    assert job_id == "1234" and text
    summary = json.loads((site.summaries / "1234-summary.json").read_text())
    assert [g["uuid"] for g in summary["gpus"]] == site.uuids[4:6]
    assert sched.called("drain_node") == []


def test_job_end_drains_on_leftovers_and_fails_only_when_the_drain_fails(site: HookSite) -> None:
    site.write_config("[epilog]\nkill_leftover = false\n")
    left = {site.uuids[1]: {"processes": [{"pid": 99, "user": "alice", "used_mib": 4000}],
                            "memory_used_mib": 4100}}
    for fail, rc in (((), 0), (("drain_node",), 1)):
        sched = RecordingScheduler(fail=fail)
        site.set_health({})
        assert start(site, a_job(0, 1), sched) == 0
        site.set_health(left)
        assert end(site, a_job(0, 1), sched) == rc
        [(node, reason)] = sched.called("drain_node")
        assert node == "node07" and "1 process(es) left after the job" in reason


def test_a_final_comment_the_scheduler_refuses_is_logged_never_fatal(site: HookSite) -> None:
    site.write_config("[epilog]\nadmin_comment = true\n")
    sched, log = RecordingScheduler(fail=("set_final_comment",)), quiet("epilog")
    assert start(site, a_job(3), sched) == 0
    assert end(site, a_job(3), sched, log) == 0
    assert sched.called("set_final_comment") and sched.called("drain_node") == []
