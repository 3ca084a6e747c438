"""The prolog's ``gpu_out`` action: the faulty GPU out of service, the job requeued, the node not failed.

A replayed DGX H100 and a stand-in scontrol that records its calls (tests/helpers/hook_helpers.py).
"""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from tests.helpers.hook_helpers import HookSite, make_site

from gpuslurm.hooks.log import HookLog
from gpuslurm.slurm.hooks import run_prolog


@pytest.fixture
def site(tmp_path: Path) -> HookSite:
    s = make_site(tmp_path)
    s.write_config('[health.xid]\naction = "gpu_out"\n')
    return s


def quiet() -> HookLog:
    return HookLog("prolog", stream=io.StringIO(), use_syslog=False)


def _record(site: HookSite) -> dict[str, dict[str, object]]:
    path = site.root / "state" / "out-of-service.json"
    return {g["uuid"]: g for g in json.loads(path.read_text())["gpus"]} if path.exists() else {}


def test_a_faulty_gpu_goes_out_and_the_job_is_requeued_not_failed(site: HookSite) -> None:
    site.set_health({site.uuids[2]: {"xid": [79]}})
    log = quiet()
    assert run_prolog(site.environ(gpus="1,2"), log) == 0, log.lines  # 0: Slurm does not drain the node
    rec = _record(site)
    assert list(rec) == [site.uuids[2]] and rec[site.uuids[2]]["by"] == "prolog"
    drain, comment, requeue = site.scontrol_calls()
    assert drain[:3] == ["update", "NodeName=node07", "State=DRAIN"]
    assert drain[3].startswith(f"Reason=gpuslurm: GPU out: index 2 (/dev/nvidia2, {site.uuids[2]}): Xid 79")
    assert drain[3].endswith("resumes with 7 GPUs when its jobs end")
    assert comment[:2] == ["update", "JobId=1234"] and comment[2].startswith("Comment=gpuslurm requeued")
    assert "Xid 79" in comment[2] and requeue == ["requeue", "1234"]
    assert not (site.jobs_dir / "1234.json").exists()  # the job never ran


def test_a_job_given_a_gpu_already_out_is_requeued_without_a_drain(site: HookSite) -> None:
    site.set_health({site.uuids[2]: {"xid": [79]}})
    run_prolog(site.environ(gpus="2"), quiet())
    before = len(site.scontrol_calls())
    site.set_health({})
    assert run_prolog(site.environ(gpus="2,3"), quiet()) == 0
    calls = site.scontrol_calls()[before:]
    assert [c[0] for c in calls] == ["update", "requeue"] and "is out of service" in calls[0][2]
    assert run_prolog(site.environ(gpus="3"), quiet()) == 0  # other GPUs serve as before
    assert (site.jobs_dir / "1234.json").exists()


def test_the_last_gpu_drains_the_node_as_before(tmp_path: Path) -> None:
    site = make_site(tmp_path, builtin="l40s-4x")
    site.write_config('[health.xid]\naction = "gpu_out"\n')
    (site.root / "state").mkdir()
    recs = [{"uuid": u, "reason": "earlier", "since": 1.0, "by": "admin", "index": i, "minor": i}
            for i, u in enumerate(site.uuids[:-1])]
    (site.root / "state" / "out-of-service.json").write_text(json.dumps({"version": 1, "gpus": recs}))
    site.set_health({site.uuids[-1]: {"xid": [48]}})
    assert run_prolog(site.environ(gpus=str(len(site.uuids) - 1)), quiet()) == 1
    [drain] = site.scontrol_calls()
    assert drain[3].startswith("Reason=gpuslurm: GPU index") and "Xid 48" in drain[3]


def test_a_corrupt_record_fails_closed(site: HookSite) -> None:
    (site.root / "state").mkdir()
    (site.root / "state" / "out-of-service.json").write_text("[")
    assert run_prolog(site.environ(gpus="0"), quiet()) == 2
    assert not (site.jobs_dir / "1234.json").exists()


def test_roots_holder_job_passes_without_a_gate_and_a_users_does_not(site: HookSite) -> None:
    site.set_health({site.uuids[2]: {"xid": [79]}})
    run_prolog(site.environ(gpus="2"), quiet())  # GPU 2 out of service now
    before = len(site.scontrol_calls())
    holder = site.environ(job_id="77", gpus="2", SLURM_JOB_UID="0", SLURM_JOB_USER="root",
                          SLURM_JOB_COMMENT="gpuslurm:gpu-out-holder")
    assert run_prolog(holder, quiet()) == 0
    assert site.scontrol_calls()[before:] == [] and not (site.jobs_dir / "77.json").exists()
    sneaky = site.environ(job_id="78", gpus="2", SLURM_JOB_COMMENT="gpuslurm:gpu-out-holder")
    assert run_prolog(sneaky, quiet()) == 0
    assert [c[0] for c in site.scontrol_calls()[before:]] == ["update", "requeue"]  # alice's: requeued


def test_a_drain_on_one_gpu_still_takes_the_other_gpus_out(tmp_path: Path) -> None:
    """The one fault response (docs/health.md): GPU 1's drain fault drains the node, and GPU 2's
    ``gpu_out`` fault still takes GPU 2 out, as the monitor does; the prolog used to forget it."""
    site = make_site(tmp_path)
    site.write_config('[health.xid]\naction = "gpu_out"\n[health.ecc]\naction = "drain"\n')
    site.set_health({site.uuids[1]: {"ecc_uncorrectable": 2}, site.uuids[2]: {"xid": [79]}})
    log = quiet()
    assert run_prolog(site.environ(gpus="1,2"), log) == 1, log.lines
    assert list(_record(site)) == [site.uuids[2]]
    [drain] = site.scontrol_calls()
    gpu1 = f"index 1 (/dev/nvidia1, {site.uuids[1]})"
    assert drain[3].startswith(f"Reason=gpuslurm: GPU {gpu1}: 2 uncorrectable")
    assert "Xid 79" not in drain[3] and not (site.jobs_dir / "1234.json").exists()


def test_two_faulty_gpus_of_the_last_two_one_goes_and_the_node_drains(tmp_path: Path) -> None:
    site = make_site(tmp_path, builtin="l40s-4x")
    site.write_config('[health.xid]\naction = "gpu_out"\n')
    (site.root / "state").mkdir()
    recs = [{"uuid": u, "reason": "earlier", "since": 1.0, "by": "admin", "index": i, "minor": i}
            for i, u in enumerate(site.uuids[:-2])]
    (site.root / "state" / "out-of-service.json").write_text(json.dumps({"version": 1, "gpus": recs}))
    a, b = site.uuids[-2:]
    site.set_health({a: {"xid": [79]}, b: {"xid": [48]}})
    log = quiet()
    assert run_prolog(site.environ(gpus=f"{len(site.uuids) - 2},{len(site.uuids) - 1}"), log) == 1
    assert a in _record(site) and b not in _record(site)
    [drain] = site.scontrol_calls()
    assert "Xid 48" in drain[3] and "Xid 79" not in drain[3]
    assert any("is the last GPU in service" in line for line in log.lines)
