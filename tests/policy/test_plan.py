"""The pure action planner: what is logged, alerted, killed, warned and cancelled, and when."""

from __future__ import annotations

from gpuslurm.config import ActConfig, ActIdle, ActRogue, ActShare, parse_config
from gpuslurm.policy.act import Planner, Step
from gpuslurm.samples import Violation

GPU0, GPU1 = "GPU-0", "GPU-1"


def rogue(pid: int = 4242, user: str | None = "alice", start: float = 100.0) -> Violation:
    return Violation("rogue", "n1", user, "7", pid, "python", GPU1, start, 0.0, "python on GPU-1", "critical")


def idle(job: str = "12", gpu: str = GPU0, user: str = "bob") -> Violation:
    return Violation("idle", "n1", user, job, None, None, gpu, 50.0, 0.0, f"job {job} idle on {gpu}")


def acts(steps: list[Step]) -> list[tuple[str, str]]:
    return [(s.action, s.event) for s in steps]


def test_new_violation_is_logged_and_alerted_once_then_ongoing_on_schedule() -> None:
    p = Planner(ActConfig(log_interval_s=60, alert_interval_s=300))
    v = rogue()
    assert acts(p.plan(100, [v])) == [("log", "new"), ("alert", "new")]
    assert acts(p.plan(110, [v._replace(duration_s=10)])) == []
    assert acts(p.plan(160, [v._replace(duration_s=60)])) == [("log", "ongoing")]
    assert acts(p.plan(220, [v])) == [("log", "ongoing")]
    assert acts(p.plan(400, [v])) == [("log", "ongoing"), ("alert", "ongoing")]
    ended = p.plan(410, [])
    assert acts(ended) == [("log", "ended")] and ended[0].violation == v
    assert len(p) == 0  # forgotten once it ended


def test_alerts_are_rate_limited_per_violation_not_globally() -> None:
    p = Planner(ActConfig(alert_interval_s=3600))
    a, b = rogue(pid=10), rogue(pid=11)
    assert acts(p.plan(1, [a])).count(("alert", "new")) == 1
    steps = p.plan(2, [a, b])
    assert [s.violation.pid for s in steps if s.action == "alert"] == [11]
    assert not [s for t in range(3, 200) for s in p.plan(t, [a, b]) if s.action == "alert"]


def test_a_violation_that_ends_and_comes_back_is_new_again() -> None:
    p = Planner(ActConfig())
    v = rogue()
    p.plan(1, [v])
    p.plan(2, [])
    again = v._replace(start=3)
    assert acts(p.plan(3, [again])) == [("log", "new"), ("alert", "new")]


def test_per_kind_switches() -> None:
    cfg = ActConfig(rogue=ActRogue(log=False, alert=True), share=ActShare(log=True, alert=False))
    p = Planner(cfg)
    share = Violation("over-share", "n1", "carol", "9", 5, "x", GPU0, 0, 0, "e")
    assert acts(p.plan(1, [rogue(), share])) == [("alert", "new"), ("log", "new")]
    assert acts(p.plan(2, [])) == [("log", "ended")]  # only the logged kind says it ended


def test_alert_user_only_when_configured_and_user_known() -> None:
    p = Planner(ActConfig(rogue=ActRogue(alert_user=True)))
    planned = p.plan(1, [rogue(pid=5), rogue(pid=6, user=None)])
    steps = {s.violation.pid: s for s in planned if s.action == "alert"}
    assert steps[5].notify_user and not steps[6].notify_user


def test_kill_is_off_by_default_and_dry_run_unless_enabled() -> None:
    v = rogue()
    assert "kill" not in [a for a, _ in acts(Planner(ActConfig()).plan(1, [v]))]
    dry = [s for s in Planner(ActConfig(rogue=ActRogue(kill=True))).plan(1, [v]) if s.action == "kill"]
    assert len(dry) == 1 and dry[0].dry_run
    live = [s for s in Planner(ActConfig(dry_run=False, rogue=ActRogue(kill=True))).plan(1, [v])
            if s.action == "kill"]
    assert len(live) == 1 and not live[0].dry_run


def test_kill_is_tried_once_per_violation() -> None:
    p = Planner(ActConfig(dry_run=False, rogue=ActRogue(kill=True)))
    v = rogue()
    kills = [s for t in range(10) for s in p.plan(t, [v]) if s.action == "kill"]
    assert len(kills) == 1


def test_kill_exemptions() -> None:
    cfg = ActConfig(dry_run=False, exempt_users=("monitor",), rogue=ActRogue(kill=True))
    p = Planner(cfg)
    vs = [rogue(pid=1, user="alice"), rogue(pid=20, user="monitor"), rogue(pid=21, user="root"),
          rogue(pid=22, user=None), rogue(pid=23, user="alice")]
    assert [s.violation.pid for s in p.plan(1, vs) if s.action == "kill"] == [23]
    root_ok = Planner(cfg._replace(rogue=ActRogue(kill=True, kill_root=True)))
    assert [s.violation.pid for s in root_ok.plan(1, vs) if s.action == "kill"] == [21, 23]


def test_idle_job_warned_n_times_with_spacing_then_cancelled() -> None:
    cfg = ActConfig(dry_run=False, idle=ActIdle(scancel=True, warnings=3, warning_interval_s=100))
    p = Planner(cfg)
    held = {"12": (GPU0, GPU1)}
    both = [idle(gpu=GPU0), idle(gpu=GPU1)]
    seen: list[tuple[float, str, str]] = []
    for t in range(0, 500, 10):
        seen += [(t, s.action, s.event) for s in p.plan(t, both, held) if s.action in ("warn", "scancel")]
    assert seen == [(0, "warn", "1/3"), (100, "warn", "2/3"), (200, "warn", "3/3"),
                    (300, "scancel", "after 3 warning(s)")]
    # with scancel on, the job's warnings replace the per-GPU idle alerts
    assert not [s for s in Planner(cfg).plan(0, both, held) if s.action == "alert"]


def test_idle_job_with_a_busy_gpu_is_not_warned_and_its_count_restarts() -> None:
    cfg = ActConfig(dry_run=False, idle=ActIdle(scancel=True, warnings=1, warning_interval_s=10))
    p = Planner(cfg)
    held = {"12": (GPU0, GPU1)}
    assert acts([s for s in p.plan(0, [idle(gpu=GPU0), idle(gpu=GPU1)], held) if s.action == "warn"]) == \
        [("warn", "1/1")]
    assert [s for s in p.plan(10, [idle(gpu=GPU0)], held) if s.action in ("warn", "scancel")] == []
    steps = [s for s in p.plan(20, [idle(gpu=GPU0), idle(gpu=GPU1)], held) if s.action in ("warn", "scancel")]
    assert acts(steps) == [("warn", "1/1")]  # back to the first warning, not a cancel


def test_idle_scancel_dry_run_and_zero_warnings_and_exempt() -> None:
    cfg = ActConfig(idle=ActIdle(scancel=True, warnings=0, alert_user=True))
    steps = [s for s in Planner(cfg).plan(0, [idle()]) if s.action == "scancel"]
    assert len(steps) == 1 and steps[0].dry_run and not steps[0].notify_user  # no user mail in a dry run
    live = Planner(cfg._replace(dry_run=False))
    assert [s.notify_user for s in live.plan(0, [idle()]) if s.action == "scancel"] == [True]
    exempt = Planner(cfg._replace(dry_run=False, exempt_users=("bob",)))
    assert not [s for s in exempt.plan(0, [idle()]) if s.action in ("warn", "scancel")]


def test_a_failed_scancel_is_retried_one_interval_later() -> None:
    cfg = ActConfig(dry_run=False, idle=ActIdle(scancel=True, warnings=0, warning_interval_s=30))
    p = Planner(cfg)
    first = [s for s in p.plan(0, [idle()]) if s.action == "scancel"]
    p.failed(first[0])
    assert not [s for s in p.plan(10, [idle()]) if s.action == "scancel"]
    assert [s.action for s in p.plan(30, [idle()]) if s.action == "scancel"] == ["scancel"]
    assert not [s for s in p.plan(90, [idle()]) if s.action == "scancel"]  # it worked: never again


def test_state_is_bounded_by_current_violations() -> None:
    p = Planner(ActConfig(idle=ActIdle(scancel=True)))
    for t in range(1000):
        p.plan(t, [rogue(pid=t, start=t), idle(job=str(t))])
    assert len(p) == 3  # the two violations and the idle job


def test_act_section_parses_and_checks_ranges() -> None:
    cfg = parse_config('[act]\ndry_run = false\nmail_to = ["hpc@example.org"]\n'
                       '[act.rogue]\nkill = true\n[act.idle]\nscancel = true\nwarnings = 2\n')
    assert not cfg.act.dry_run and cfg.act.rogue.kill and cfg.act.idle.warnings == 2
    assert cfg.act.mail_to == ("hpc@example.org",)
    import pytest

    from gpuslurm.errors import InputError

    with pytest.raises(InputError, match=r"warnings in \[act.idle\] must be between"):
        parse_config("[act.idle]\nwarnings = -1\n")
    with pytest.raises(InputError, match="unknown key 'kil'"):
        parse_config("[act.rogue]\nkil = true\n")
