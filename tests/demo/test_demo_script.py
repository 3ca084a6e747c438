"""The demo's scripted day (pure): a sane schedule, a deterministic scenario, ordered job maps."""

from __future__ import annotations

import itertools

from gpuslurm.demo import script
from gpuslurm.hw.formats.scenario import parse_scenario
from gpuslurm.hw.source import load_node

NODE = load_node("dgx-h100")
U = [g.uuid for g in sorted(NODE.gpus, key=lambda g: g.index)]
DAY = 24 * 3600.0


def test_the_schedule_never_gives_a_gpu_twice() -> None:
    assert script.check_schedule(len(U)) == []
    assert script.check_schedule(4)  # a smaller node would not fit the script: said, not ignored


def test_the_scenario_is_valid_for_the_bundle_and_replays_the_same_way() -> None:
    import json

    steps = script.scenario_steps(U, DAY)
    assert len(steps) == DAY / script.STEP_S
    assert steps == script.scenario_steps(U, DAY)  # seeded: the demo's story does not change
    parsed = parse_scenario(json.dumps({"start": 0, "steps": steps}), "demo", NODE)
    assert len(parsed.steps) == len(steps)


def _procs_at(steps: list[dict[str, object]], frac: float) -> dict[int, dict[str, object]]:
    step = steps[int(frac * len(steps))]
    return {p["pid"]: p for p in step["procs"]}  # type: ignore[attr-defined,index]


def test_the_rogue_runs_alone_on_its_gpu_in_no_job_during_its_span() -> None:
    steps = script.scenario_steps(U, DAY)
    rogue = script.ROGUE
    during = _procs_at(steps, (rogue.start + rogue.end) / 2)
    assert during[rogue.pid]["gpu"] == U[rogue.gpu] and float(during[rogue.pid]["sm"]) > 80  # type: ignore[arg-type]
    assert [p for p in during.values() if p["gpu"] == U[rogue.gpu]] == [during[rogue.pid]]
    assert rogue.pid not in _procs_at(steps, rogue.start / 2)
    assert all(rogue.pid != pid for job in script.JOBS for pid in script.job_pids(job))


def test_the_idle_job_barely_touches_its_gpus_and_the_trainer_is_busy() -> None:
    steps = script.scenario_steps(U, DAY)
    idle = next(j for j in script.JOBS if j.kind == "notebook")
    trainer = next(j for j in script.JOBS if j.user == "alice")
    mid = (idle.start + idle.end) / 2
    gpus = steps[int(mid * len(steps))]["gpus"]
    assert all(gpus[U[i]]["util"] <= 2.0 for i in idle.gpus)  # type: ignore[index]
    assert all(gpus[U[i]]["util"] >= 85.0 for i in trainer.gpus)  # type: ignore[index]
    assert all(gpus[U[i]]["mem_mib"] > 0 for i in idle.gpus)  # type: ignore[index]  # it holds memory


def test_alice_is_over_her_quota_and_bob_is_not() -> None:
    # GPUs busy on average against the quota: the over-share story the report must tell
    steps = script.scenario_steps(U, DAY)
    mid = steps[len(steps) // 3]

    def share(user: str) -> float:
        return sum(float(mid["gpus"][U[i]]["util"]) for j in script.JOBS if j.user == user  # type: ignore[index]
                   for i in j.gpus if any(p["gpu"] == U[i] for p in mid["procs"])) / 100 / len(U)  # type: ignore[attr-defined]

    assert share("alice") > script.user("alice").quota
    assert share("bob") < script.user("bob").quota


def test_job_maps_are_written_before_and_removed_after_their_jobs() -> None:
    events = script.map_events(2 * 3600.0)
    assert [e.at for e in events] == sorted(e.at for e in events)
    for job in script.JOBS:
        mine = [e for e in events if e.job.job_id == job.job_id]
        assert mine[0].start and (len(mine) == 1 or (len(mine) == 2 and not mine[1].start))
        assert all(e.at % script.STEP_S == 0 for e in mine)
    # a job ending as another starts on its GPU: the removal comes first
    same = [(e.at, e.start) for e in events]
    assert all(not (a[0] == b[0] and a[1] and not b[1]) for a, b in itertools.pairwise(same))
