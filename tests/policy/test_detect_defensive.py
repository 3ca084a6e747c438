from __future__ import annotations

from tests.helpers.detect_helpers import GPUS, alloc, cycle, detect_cfg, proc, run, utils

from gpuslurm.config import Config
from gpuslurm.policy.defensive import Thresholds, thresholds
from gpuslurm.policy.detect import Detector

G0, G1 = GPUS[0], GPUS[1]
# windows of 60 s, 5 of them in the lookback: on with 2 windows of hogs (0.4 > 0.3), off with 1
DEFENSIVE = ("[detect.share]\nenabled = false\n"
             "[detect.idle]\nwindow_s = 60\ngrace_s = 0\nthreshold_pct = 5\n"
             "[detect.defensive]\nwindow_s = 60\nlookback_s = 300\nfraction = 0.3\n")


def _rogue_at(hog_times: set[float]):
    job = alloc("812", "alice", G0)
    def make(t: float):
        procs = [proc(4242, G1, None, user="bob")] if t in hog_times else []
        return cycle(t, utils(50.0), procs, [job])
    return make


def test_default_thresholds_and_tightened_ones() -> None:
    cfg = Config().detect
    assert thresholds(cfg, False) == Thresholds(False, 0.0, 5.0, 1800.0, 80.0, 600.0)
    assert thresholds(cfg, True, 0.5) == Thresholds(True, 0.5, 10.0, 900.0, 60.0, 300.0)
    # a tightened idle threshold never exceeds 100 %
    cfg = detect_cfg("[detect.idle]\nthreshold_pct = 60\n[detect.defensive]\nidle_threshold_factor = 3\n")
    assert thresholds(cfg, True).idle_threshold_pct == 100.0


def test_switches_on_after_enough_windows_with_hogs_and_off_when_they_age_out() -> None:
    det = Detector(detect_cfg(DEFENSIVE))
    assert det.thresholds.defensive is False
    make = _rogue_at({0.0, 10.0, 60.0})
    states = {t: (det.feed(make(t)), det.thresholds) for t in [10.0 * i for i in range(40)]}
    assert states[50.0][1].defensive is False and states[50.0][1].hog_fraction == 0.2
    assert states[60.0][1].defensive is True and states[60.0][1].hog_fraction == 0.4
    assert states[60.0][1].idle_threshold_pct == 10.0 and states[60.0][1].idle_window_s == 30.0
    assert states[290.0][1].defensive is True  # windows 0 and 1 still within the last five
    assert states[300.0][1].defensive is False  # window 0 (0–59 s) has aged out
    assert states[360.0][1].hog_fraction == 0.0


def test_exactly_the_fraction_is_not_defensive() -> None:
    toml = DEFENSIVE.replace("lookback_s = 300", "lookback_s = 600")  # 10 windows
    det = Detector(detect_cfg(toml))
    run(det, [0.0, 60.0, 120.0], _rogue_at({0.0, 60.0, 120.0}))
    assert det.thresholds.hog_fraction == 0.3 and det.thresholds.defensive is False
    det.feed(_rogue_at({180.0})(180.0))
    assert det.thresholds.defensive is True


def test_defensive_mode_flags_what_normal_mode_lets_pass() -> None:
    job = alloc("812", "alice", G0)
    def make(t: float):  # the job's GPU at 8 %: over the normal 5 % threshold, under the tight 10 %
        procs = [proc(4242, G1, None, user="bob")] if t in (0.0, 60.0) else []
        return cycle(t, utils(8.0), [*procs, proc(7, G0, "812")], [job])
    det = Detector(detect_cfg(DEFENSIVE))
    out = run(det, [10.0 * i for i in range(12)], make)
    assert [v.kind for v in out[6]] == ["rogue"]  # 60 s: the idle window is covered, 8 % > 5 %
    idle = [v for v in out[7] if v.kind == "idle"]  # 70 s: defensive since the last cycle
    assert len(idle) == 1
    assert "(idle at or below 10 %, defensive mode)" in idle[0].evidence
    assert "over the last 30 s" in idle[0].evidence


def test_which_kinds_count() -> None:
    det = Detector(detect_cfg(DEFENSIVE + 'kinds = ["idle"]\n'))
    run(det, [10.0 * i for i in range(10)], _rogue_at({0.0, 60.0}))
    assert det.thresholds.defensive is False


def test_disabled_never_switches() -> None:
    det = Detector(detect_cfg(DEFENSIVE + "enabled = false\n"))
    run(det, [10.0 * i for i in range(30)], _rogue_at({10.0 * i for i in range(30)}))
    assert det.thresholds.defensive is False
