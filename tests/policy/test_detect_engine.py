from __future__ import annotations

from tests.helpers.detect_helpers import GPUS, alloc, cycle, detect_cfg, proc, utils

from gpuslurm.policy.detect import Detector, rebuild
from gpuslurm.samples import Cycle, Violation

G0, G1, G2, G3 = GPUS
MIXED = ("[detect.idle]\nwindow_s = 120\ngrace_s = 30\n"
         "[detect.share]\nduration_s = 90\nusers = { alice = 0.3 }\n"
         "[detect.defensive]\nwindow_s = 60\nlookback_s = 240\n")


def _mixed(t: float) -> Cycle:
    """Alice hogs two GPUs, carol's job idles from 100 s, bob's rogue comes and goes, jobs churn."""
    jobs = [alloc("1", "alice", G0, G1), alloc("3", "carol", G3, start=100.0)] if t >= 100 else [
        alloc("1", "alice", G0, G1)]
    procs = [proc(10, G0, "1"), proc(11, G1, "1")]
    if int(t) % 300 < 150:
        procs.append(proc(66, G2, None, user="bob"))
    busy = 40.0 if 400 <= t < 500 else 95.0
    return cycle(t, utils(0.0, g0=busy, g1=busy, g2=30.0), procs, jobs)


TIMES = [10.0 * i for i in range(90)]
CYCLES = [_mixed(t) for t in TIMES]


def _key(v: Violation) -> tuple[object, ...]:
    return (v.kind, v.user, v.job_id, v.pid, v.gpu_uuid)


def test_the_mixed_scenario_finds_every_kind() -> None:
    det = Detector(detect_cfg(MIXED))
    seen = {v.kind for c in CYCLES for v in det.feed(c)}
    assert seen == {"rogue", "idle", "over-share"}


def test_rebuild_from_the_whole_history_is_the_live_state() -> None:
    cfg = detect_cfg(MIXED)
    live = Detector(cfg)
    after = [live.feed(c) for c in CYCLES]
    for k in (1, 17, 45, 70):
        det = rebuild(CYCLES[:k], cfg)
        assert det.violations == after[k - 1]
        for i in range(k, len(CYCLES)):
            assert det.feed(CYCLES[i]) == after[i], i
            assert det.thresholds == live.thresholds or i < len(CYCLES) - 1


def test_rebuild_from_history_s_of_history_gives_the_same_verdicts() -> None:
    cfg = detect_cfg(MIXED)
    live = Detector(cfg)
    after = [(live.feed(c), live.thresholds) for c in CYCLES]
    need = live.history_s
    assert need == 120.0 + 240.0  # the longest window before the defensive lookback
    for k in (40, 60, 75):
        since = CYCLES[k - 1].ts - need
        det = rebuild([c for c in CYCLES[:k] if c.ts >= since], cfg)
        for i in range(k, len(CYCLES)):
            found = det.feed(CYCLES[i])
            assert [_key(v) for v in found] == [_key(v) for v in after[i][0]], i
            assert det.thresholds == after[i][1], i
            # only starts older than the history loaded may differ (and the last digit of an
            # average: running sums over a longer history round differently)
            for mine, theirs in zip(found, after[i][0], strict=True):
                assert mine.start == theirs.start or mine.start >= since > theirs.start


def test_a_restart_does_not_forget_a_nine_minute_hog() -> None:
    cfg = detect_cfg("[detect.share]\nusers = { alice = 0.3 }\n[detect.idle]\nenabled = false\n")
    job = alloc("1", "alice", G0, G1)
    cycles = [cycle(t, utils(0.0, g0=95.0, g1=95.0), [proc(10, G0, "1"), proc(11, G1, "1")], [job])
              for t in [10.0 * i for i in range(130)]]
    first = lambda det, cs: next(c.ts for c in cs if det.feed(c))  # noqa: E731
    assert first(Detector(cfg), cycles) == 600.0  # ten minutes, uninterrupted
    stored = cycles[:55]  # the monitor dies at 540 s
    assert first(rebuild(stored, cfg), cycles[55:]) == 600.0
    assert first(Detector(cfg), cycles[55:]) == 1150.0  # what forgetting would cost


def test_old_and_repeated_cycles_are_ignored() -> None:
    det = Detector(detect_cfg(MIXED))
    for c in CYCLES[:30]:
        det.feed(c)
    before = (det.violations, det.thresholds, det.state_size())
    assert det.feed(CYCLES[29]) == before[0]
    assert det.feed(CYCLES[3]._replace(procs=())) == before[0]
    assert (det.violations, det.thresholds, det.state_size()) == before


def test_memory_stays_bounded_over_many_short_jobs() -> None:
    cfg = detect_cfg("[detect.idle]\nwindow_s = 60\ngrace_s = 0\n"
                     "[detect.share]\nduration_s = 60\ndefault_quota = 0.1\n")
    det = Detector(cfg)
    sizes = []
    t = 0.0
    for n in range(3000):
        job = alloc(str(n), ("alice", "bob", "carol")[n % 3], GPUS[n % 4], GPUS[(n + 1) % 4])
        procs = [proc(10000 + n, GPUS[n % 4], str(n), user=job.user),
                 proc(50000 + n, GPUS[(n + 2) % 4], None, user="bob")]  # a new rogue PID every cycle
        for _ in range(4):  # each job lives four cycles
            t += 10.0
            det.feed(cycle(t, utils(90.0), procs, [job]))
        sizes.append(det.state_size())
    assert max(sizes[2000:]) <= max(sizes[500:1000])  # the defensive lookback fills in the first 180
    assert max(sizes) < 100


def test_violation_order_is_stable() -> None:
    det = Detector(detect_cfg(MIXED))
    found = [det.feed(c) for c in CYCLES][-1]
    assert list(found) == sorted(found, key=lambda v: (v.kind, v.job_id or "", v.pid or 0, v.gpu_uuid))
