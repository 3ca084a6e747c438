from __future__ import annotations

import pytest
from tests.helpers.detect_helpers import GPUS, alloc, cycle, detect_cfg, gpu, kinds, proc, run, utils

from gpuslurm.policy.detect import Detector

G0, G1, G2, G3 = GPUS
BASE = {"duration_s": "60", "threshold_pct": "80", "min_samples": "3"}
TIMES = [10.0 * i for i in range(7)]  # 0 … 60 s: exactly one covered window at the end


def _det(users: str = "{ alice = 0.3 }", shares: dict[str, float] | None = None, **keys: str) -> Detector:
    share = "".join(f"{k} = {v}\n" for k, v in {**BASE, "users": users, **keys}.items())
    toml = f"[detect.idle]\nenabled = false\n[detect.defensive]\nenabled = false\n[detect.share]\n{share}"
    return Detector(detect_cfg(toml), shares)


def _alice(busy: float, *gpus: str, account: str | None = None):
    job = alloc("812", "alice", *gpus, account=account)
    procs = [proc(12345 + i, g, job="812") for i, g in enumerate(gpus)]
    return lambda t: cycle(t, {**utils(0.0), **dict.fromkeys(gpus, busy)}, procs, [job])


def test_busy_user_over_quota_after_the_duration() -> None:
    det = _det()
    out = run(det, [10.0 * i for i in range(109)], _alice(94.0, G0, G1))
    assert all(found == () for found in out[:6])
    assert kinds(out[6]) == [("over-share", "812", G0), ("over-share", "812", G1)]
    v = out[-1][0]
    assert (v.user, v.pid, v.process, v.start, v.duration_s) == ("alice", 12345, "python", 0.0, 1080.0)
    assert v.evidence == ("python (PID 12345, job 812) on GPU-0000: 94 % for 18 min, over alice's 30 % "
                          "quota (alice used 47 % of the node's GPUs over the last 60 s; hog above 80 % "
                          "for 60 s)")


def test_busy_user_within_quota_is_fine() -> None:
    assert run(_det(), TIMES, _alice(94.0, G0))[-1] == ()  # 0.235 of the node


@pytest.mark.parametrize(("busy", "flagged"), [(80.0, False), (80.5, True)])
def test_utilisation_exactly_at_threshold_is_not_a_hog(busy: float, flagged: bool) -> None:
    assert (run(_det(), TIMES, _alice(busy, G0, G1))[-1] != ()) is flagged


@pytest.mark.parametrize(("quota", "flagged"), [("0.5", False), ("0.49", True)])
def test_usage_exactly_at_quota_is_not_over(quota: str, flagged: bool) -> None:
    assert (run(_det(f"{{ alice = {quota} }}"), TIMES, _alice(100.0, G0, G1))[-1] != ()) is flagged


def test_default_quota_of_one_never_fires_and_a_lower_one_does() -> None:
    assert run(_det("{}"), TIMES, _alice(100.0, *GPUS))[-1] == ()
    assert run(_det("{}", default_quota="0.25"), TIMES, _alice(100.0, G0, G1))[-1] != ()


def test_account_quota_and_user_quota_first() -> None:
    make = _alice(94.0, G0, G1, account="physics")
    assert run(_det("{}", accounts="{ physics = 0.6 }"), TIMES, make)[-1] == ()
    assert run(_det("{}", accounts="{ physics = 0.4 }"), TIMES, make)[-1] != ()
    assert run(_det("{ alice = 0.3 }", accounts="{ physics = 0.6 }"), TIMES, make)[-1] != ()


def test_slurm_shares_only_when_configured() -> None:
    make = _alice(94.0, G0, G1)
    assert run(_det("{}", {"alice": 0.2}, quota_source='"slurm"'), TIMES, make)[-1] != ()
    assert run(_det("{}", {"alice": 0.2}), TIMES, make)[-1] == ()  # quota_source = "config"
    assert run(_det("{}", {"bob": 0.2}, quota_source='"slurm"'), TIMES, make)[-1] == ()
    # the users table still comes first
    assert run(_det("{ alice = 0.9 }", {"alice": 0.2}, quota_source='"slurm"'), TIMES, make)[-1] == ()
    # shares can arrive later (the adapter refreshes them)
    det = _det("{}", quota_source='"slurm"')
    assert run(det, TIMES, make)[-1] == ()
    det.set_shares({"alice": 0.2})
    assert run(det, [70.0 + 10 * i for i in range(7)], make)[-1] != ()


def test_shared_gpu_uses_each_process_own_utilisation() -> None:
    det = _det("{ alice = 0.1, bob = 0.01 }")
    jobs = [alloc("1", "alice", G0), alloc("2", "bob", G0)]
    procs = [proc(10, G0, "1", util=85.0), proc(20, G0, "2", user="bob", util=10.0)]
    found = run(det, TIMES, lambda t: cycle(t, utils(0.0, g0=95.0), procs, jobs))[-1]
    assert [(v.user, v.pid) for v in found] == [("alice", 10)]


def test_shared_gpu_without_process_figures_is_split_evenly() -> None:
    det = _det("{ alice = 0.01, bob = 0.01 }")
    jobs = [alloc("1", "alice", G0), alloc("2", "bob", G0)]
    procs = [proc(10, G0, "1"), proc(20, G0, "2", user="bob")]
    assert run(det, TIMES, lambda t: cycle(t, utils(0.0, g0=100.0), procs, jobs))[-1] == ()  # 50 % each


def test_several_processes_of_a_user_on_one_gpu_add_up() -> None:
    det = _det("{ alice = 0.1 }")
    job = alloc("1", "alice", G0)
    procs = [proc(10, G0, "1", util=30.0, name="loader"), proc(11, G0, "1", util=55.0, name="train")]
    procs.append(proc(20, G0, None, user="bob", util=5.0))
    (v,) = [f for f in run(det, TIMES, lambda t: cycle(t, utils(0.0, g0=90.0), procs, [job]))[-1]
            if f.kind == "over-share"]
    assert (v.pid, v.process) == (11, "train")
    assert v.evidence.startswith("train (PID 11, job 1) and 1 more of alice's processes on GPU-0000: 85 %")


def test_unknown_utilisation_gives_no_verdict() -> None:
    assert run(_det(), TIMES, _alice(None, G0, G1))[-1] == ()  # type: ignore[arg-type]


def test_mig_device_counts_its_share_of_the_gpu() -> None:
    gpus = [gpu("GPU-aaaa", None), gpu("GPU-aaaa", 90.0, "MIG-a1"), gpu("GPU-aaaa", None, "MIG-a2")]
    job = alloc("1", "alice", "MIG-a1")
    procs = [proc(10, "GPU-aaaa", "1", mig="MIG-a1")]
    # 90 % of half a GPU on a one-GPU node: 45 % of the node
    assert kinds(run(_det("{ alice = 0.44 }"), TIMES, lambda t: cycle(t, gpus, procs, [job]))[-1]) == [
        ("over-share", "1", "MIG-a1")]
    assert run(_det("{ alice = 0.45 }"), TIMES, lambda t: cycle(t, gpus, procs, [job]))[-1] == ()


def test_a_dip_below_threshold_ends_it_and_users_who_leave_are_forgotten() -> None:
    det = _det()
    run(det, TIMES, _alice(94.0, G0, G1))
    assert det.violations
    out = run(det, [70.0 + 10 * i for i in range(3)], _alice(0.0, G0, G1))
    assert out[-1] == ()  # the average over the last 60 s fell to 47 %
    assert det.state_size() > 0
    det.feed(cycle(200.0, utils(0.0), [], []))
    assert det.state_size() == 0


def test_disabled() -> None:
    assert run(_det(enabled="false"), TIMES, _alice(100.0, *GPUS))[-1] == ()
