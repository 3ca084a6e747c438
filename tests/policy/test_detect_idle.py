from __future__ import annotations

from collections.abc import Callable

import pytest
from tests.helpers.detect_helpers import GPUS, alloc, cycle, detect_cfg, gpu, kinds, proc, run, utils

from gpuslurm.errors import InputError
from gpuslurm.policy.detect import Detector
from gpuslurm.samples import Cycle, GpuSample, ScanProblem

G0, G1, G2 = GPUS[0], GPUS[1], GPUS[2]
IDLE = {"window_s": "60", "grace_s": "0", "threshold_pct": "5", "min_samples": "3"}
TIMES = [10.0 * i for i in range(13)]  # 0 … 120 s


def _det(**keys: str) -> Detector:
    idle = "".join(f"{k} = {v}\n" for k, v in {**IDLE, **keys}.items())
    return Detector(detect_cfg("[detect.share]\nenabled = false\n[detect.defensive]\nenabled = false\n"
                               f"[detect.idle]\n{idle}"))


def test_two_gpus_at_zero_with_no_process_are_flagged_after_the_window() -> None:
    det = _det()
    job = alloc("812", "alice", G0, G1)
    out = run(det, TIMES, lambda t: cycle(t, utils(0.0), [], [job]))
    assert all(found == () for found in out[:6])  # 0 … 50 s: the window is not covered yet
    assert kinds(out[6]) == [("idle", "812", G0), ("idle", "812", G1)]  # at 60 s
    v = out[-1][0]
    assert (v.user, v.pid, v.process, v.severity) == ("alice", None, None, "warning")
    assert v.start == 0.0 and v.duration_s == 120.0  # the original start, a growing duration
    assert v.evidence == ("job 812 of alice holds GPU-0000 at 0 % on average over the last 60 s "
                          "(idle at or below 5 %); no process of the job ran on it in that time")


@pytest.mark.parametrize(("util", "idle"), [(5.0, True), (5.1, False), (4.9, True), (100.0, False)])
def test_exactly_at_the_threshold_is_idle(util: float, idle: bool) -> None:
    det = _det()
    job = alloc("812", "alice", G0)
    found = run(det, TIMES[:7], lambda t: cycle(t, utils(util), [], [job]))[-1]
    assert (len(found) == 1) is idle


def test_average_not_peak_decides() -> None:
    det = _det()
    job = alloc("812", "alice", G0)
    # one burst of 30 % in seven samples: an average of 30/7 ≈ 4.3 % is idle
    found = run(det, TIMES[:7], lambda t: cycle(t, utils(30.0 if t == 30 else 0.0), [], [job]))[-1]
    assert kinds(found) == [("idle", "812", G0)]
    assert "at 4.3 % on average" in found[0].evidence


def test_idle_process_is_named() -> None:
    det = _det()
    job = alloc("812", "alice", G0)
    found = run(det, TIMES[:7], lambda t: cycle(t, utils(1.0), [proc(77, G0, job="812")], [job]))[-1]
    (v,) = found
    assert (v.pid, v.process) == (77, "python")
    assert v.evidence.endswith("; python (PID 77, job 812) is on it")


def test_busy_gpu_of_a_partly_idle_job_is_not_flagged() -> None:
    det = _det()
    job = alloc("812", "alice", G0, G1)
    found = run(det, TIMES[:7], lambda t: cycle(t, utils(0.0, g1=90.0), [proc(7, G1, job="812")], [job]))
    assert kinds(found[-1]) == [("idle", "812", G0)]


def test_unknown_utilisation_is_not_idle() -> None:
    det = _det()
    job = alloc("812", "alice", G0)
    # the job runs a process, so an unknown figure cannot be inferred as 0 %
    out = run(det, TIMES, lambda t: cycle(t, utils(None), [proc(7, G0, job="812")], [job]))
    assert all(found == () for found in out)


def test_whole_gpu_without_a_figure_is_unknown_even_without_processes() -> None:
    det = _det()
    job = alloc("812", "alice", G0)
    assert all(f == () for f in run(det, TIMES, lambda t: cycle(t, utils(None), [], [job])))


def test_coverage_boundary() -> None:
    # 7 samples in the window; min_coverage 5/7 needs 5 known ones, 4 are not enough
    extra = {"min_coverage": repr(5 / 7)}
    for unknown_at, flagged in (({0.0, 10.0}, True), ({0.0, 10.0, 20.0}, False)):
        det = _det(**extra)
        job = alloc("812", "alice", G0)
        found = run(det, TIMES[:7], lambda t, u=unknown_at, j=job: cycle(
            t, utils(None if t in u else 0.0), [proc(7, G0, job="812")], [j]))[-1]
        assert (found != ()) is flagged, unknown_at


def test_too_few_samples_give_no_verdict() -> None:
    det = _det(min_samples="8")
    job = alloc("812", "alice", G0)
    assert run(det, TIMES[:7], lambda t: cycle(t, utils(0.0), [], [job]))[-1] == ()
    assert det.feed(cycle(70.0, utils(0.0), [], [job])) == ()  # still 7 samples in 60 s


def test_lost_gpu_is_unknown_not_idle() -> None:
    det = _det()
    job = alloc("812", "alice", G0)
    gpus = {g: 0.0 for g in GPUS if g != G0}  # G0 is missing from every cycle
    assert all(f == () for f in run(det, TIMES, lambda t: cycle(t, gpus, [], [job])))


def test_grace_period_after_job_start() -> None:
    det = _det(grace_s="100")
    job = alloc("812", "alice", G0, start=0.0)
    out = run(det, TIMES, lambda t: cycle(t, utils(0.0), [], [job]))
    assert [t for t, found in zip(TIMES, out, strict=True) if found] == [100.0, 110.0, 120.0]
    assert out[-3][0].start == 40.0  # the window that first proved it idle


def test_becoming_busy_clears_the_violation_and_a_new_one_starts_fresh() -> None:
    det = _det()
    job = alloc("812", "alice", G0)
    run(det, TIMES[:7], lambda t: cycle(t, utils(0.0), [], [job]))
    assert det.violations
    assert det.feed(cycle(70.0, utils(100.0), [proc(7, G0, job="812")], [job])) == ()
    out = run(det, [80.0 + 10 * i for i in range(10)], lambda t: cycle(t, utils(0.0), [], [job]))
    first = next(found for found in out if found)
    assert first[0].start > 70.0


def test_mig_device_without_utilisation_and_without_processes_is_idle() -> None:
    det = _det()
    gpus = [gpu("GPU-aaaa", None), gpu("GPU-aaaa", None, "MIG-a1"), gpu("GPU-aaaa", None, "MIG-a2")]
    job = alloc("812", "alice", "MIG-a1")
    bobs = proc(9, "GPU-aaaa", "813", user="bob", mig="MIG-a2")
    found = run(det, TIMES[:7], lambda t: cycle(t, gpus, [bobs], [job, alloc("813", "bob", "MIG-a2")]))
    assert kinds(found[-1]) == [("idle", "812", "MIG-a1")]


def test_mig_device_with_a_process_of_unknown_utilisation_is_unknown() -> None:
    det = _det()
    gpus = [gpu("GPU-aaaa", None), gpu("GPU-aaaa", None, "MIG-a1")]
    job = alloc("812", "alice", "MIG-a1")
    busy = proc(9, "GPU-aaaa", "812", mig="MIG-a1")
    assert run(det, TIMES[:7], lambda t: cycle(t, gpus, [busy], [job]))[-1] == ()
    # with its own SM utilisation reported, it is known (and here idle)
    det = _det()
    found = run(det, TIMES[:7], lambda t: cycle(t, gpus, [busy._replace(sm_util_pct=2.0)], [job]))[-1]
    assert kinds(found) == [("idle", "812", "MIG-a1")]


def test_scan_problem_on_the_device_keeps_it_unknown() -> None:
    det = _det()
    gpus = [gpu("GPU-aaaa", None), gpu("GPU-aaaa", None, "MIG-a1")]
    job = alloc("812", "alice", "MIG-a1")
    problem = ScanProblem(0.0, "nvml-error", "MIG-a1", "process list")
    assert run(det, TIMES[:7], lambda t: cycle(t, gpus, [], [job], [problem]))[-1] == ()


def test_ended_jobs_are_forgotten() -> None:
    det = _det()
    job = alloc("812", "alice", G0)
    run(det, TIMES[:7], lambda t: cycle(t, utils(0.0), [], [job]))
    assert det.state_size() > 0
    assert det.feed(cycle(70.0, utils(0.0), [], [])) == ()
    assert det.state_size() == 0


def test_disabled() -> None:
    det = _det(enabled="false")
    job = alloc("812", "alice", G0)
    assert run(det, TIMES, lambda t: cycle(t, utils(0.0), [], [job]))[-1] == ()


def test_a_gpu_listed_twice_in_an_allocation_is_one_gpu() -> None:
    det = _det()
    job = alloc("812", "alice", G0, G0)
    found = run(det, TIMES[:7], lambda t: cycle(t, utils(0.0), [], [job]))
    assert found[5] == () and kinds(found[6]) == [("idle", "812", G0)]


def _holding(mib: float) -> Callable[[float], Cycle]:
    job = alloc("812", "alice", G0)

    def make(t: float) -> Cycle:
        return cycle(t, [GpuSample(t, G0, None, 0.0, mib, 80000.0, 60.0, 35.0)], [], [job])
    return make


def test_memory_held_at_zero_utilisation_is_idle_and_the_evidence_says_how_much() -> None:
    (v,) = run(_det(), TIMES[:7], _holding(30 * 1024))[-1]
    assert v.evidence.startswith("job 812 of alice holds GPU-0000 at 0 % on average over the last 60 s, "
                                 "holding 30.0 GiB of its memory (idle at or below 5 %)")


def test_held_memory_busy_does_not_call_a_gpu_holding_memory_idle() -> None:
    assert run(_det(held_memory='"busy"'), TIMES[:7], _holding(30 * 1024))[-1] == ()
    # below held_min_mib it holds nothing that counts: idle as before
    (v,) = run(_det(held_memory='"busy"', held_min_mib="40960"), TIMES[:7], _holding(30 * 1024))[-1]
    assert "holding" not in v.evidence
    with pytest.raises(InputError, match="held_memory"):
        _det(held_memory='"maybe"')
