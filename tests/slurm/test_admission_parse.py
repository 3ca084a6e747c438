"""slurm.admission's parsers (scontrol Gres=, squeue's gres_detail, sacctmgr GrpTRES) and one
``throttle auto`` round against recorded command output (a stand-in for the three programs)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpuslurm.errors import InputError
from gpuslurm.policy.admission import AdmissionConfig, AdmissionState
from gpuslurm.slurm.admission import (
    SlurmAdmission,
    auto_round,
    configured_gpus,
    gpus_held,
    load_state,
    node_gpu_count,
    parse_gpu_limits,
    save_state,
)
from gpuslurm.slurm.squeue import parse_squeue_json

# scontrol -o show node, Slurm 22.05, the test cluster's node (shortened)
NODE_LINE = ("NodeName=dgx-h100-01 Arch=x86_64 CoresPerSocket=56 CPUAlloc=0 CPUEfctv=224 CPUTot=224 "
             "Features=h100,gpumem_80g ActiveFeatures=h100,gpumem_80g "
             "Gres=gpu:nvidia_h100_80gb_hbm3:8(S:0-1) "
             "NodeAddr=127.0.0.1 State=IDLE CfgTRES=cpu=224,mem=2015.48G,billing=224,gres/gpu=8")


def test_node_gres() -> None:
    assert node_gpu_count("gpu:nvidia_h100_80gb_hbm3:8(S:0-1)") == 8
    assert node_gpu_count("gpu:a:2(S:0),gpu:b:2(S:1),mps:400,shard:16") == 4
    assert node_gpu_count("gpu:4") == 4 and node_gpu_count("(null)") == 0 and node_gpu_count("") == 0
    assert node_gpu_count("gpu:h100:2(S:0-1)(IDX:0,1),gpu:l4:1") == 3  # commas inside parentheses
    assert configured_gpus(NODE_LINE + "\n" + NODE_LINE.replace("dgx-h100-01", "dgx-h100-02")) == 16
    assert configured_gpus("NodeName=login State=IDLE Gres=(null)\n") == 0


@given(st.text(max_size=80))
def test_node_gres_never_raises(text: str) -> None:
    assert node_gpu_count(text) >= 0 and configured_gpus(text) >= 0


def _squeue(*jobs: tuple[str, str, list[str]]) -> str:
    return json.dumps({"jobs": [{"job_id": i + 1, "user_name": user, "user_id": 1000 + i, "job_state": state,
                                 "nodes": "dgx-h100-01", "start_time": 0, "gres_detail": detail}
                                for i, (user, state, detail) in enumerate(jobs)], "errors": []})


def test_gpus_held_counts_running_jobs_only() -> None:
    jobs = parse_squeue_json(_squeue(("alice", "RUNNING", ["gpu:h100:5(IDX:0-4)"]),
                                     ("bob", "RUNNING", ["gpu:h100:1(IDX:7)"]),
                                     ("alice", "PENDING", []), ("carol", "RUNNING", []),
                                     ("bob", "RUNNING", ["gpu:h100:1(IDX:5)", "gpu:h100:1(IDX:0)"])))
    assert gpus_held(jobs) == {"alice": 5, "bob": 3}


def test_gpu_limits() -> None:
    text = ("|\nroot|\nnobody|gres/gpu=1\nalice|cpu=10,gres/gpu=4,mem=1G\nalice|\nbob|gres/gpu=-1\n"
            "carol|gres/gpu:h100=2\n")
    assert parse_gpu_limits(text) == {"root": (None,), "nobody": (1,), "alice": (4, None), "bob": (None,),
                                      "carol": (None,)}
    with pytest.raises(InputError):
        parse_gpu_limits("alice|cpu=1|extra\n")


@given(st.text(max_size=200))
def test_gpu_limits_parse_or_refuse(text: str) -> None:
    try:
        out = parse_gpu_limits(text)
    except InputError:
        return
    assert all(v is None or v >= 0 for vs in out.values() for v in vs)


class Recorded(SlurmAdmission):
    """The three programs' answers, recorded; what would have been run, kept."""

    def __init__(self, usage: dict[str, int], limits: dict[str, tuple[int | None, ...]]) -> None:
        super().__init__()
        self.usage, self.limits, self.calls = usage, limits, []  # type: list[tuple[str, int | None]]

    def read_load(self) -> tuple[int, dict[str, int]]:
        return 8, dict(self.usage)

    def read_limits(self) -> dict[str, tuple[int | None, ...]]:
        return dict(self.limits)

    def set_limit(self, user: str, limit: int | None) -> None:
        self.calls.append((user, limit))
        self.limits[user] = (limit,)


CFG = AdmissionConfig(backoff_s=60)


def test_a_round_sets_lifts_and_never_touches_someone_elses_limit() -> None:
    log: list[str] = []
    adm = Recorded({"alice": 6, "bob": 1, "dave": 1}, {"alice": (None,), "bob": (None,), "dave": (None,)})
    adm.usage = {"alice": 6, "bob": 1}
    state = auto_round(adm, AdmissionState(), CFG, 0, dry_run=False, log=log.append)
    assert adm.calls == [("alice", 1)] and state.limits == (("alice", 1),)
    assert any("set GrpTRES=gres/gpu=1 for alice" in line and "load 88%" in line for line in log)
    adm.limits["alice"] = (3,)  # an admin changed it meanwhile
    adm.usage = {"alice": 1}
    state = auto_round(adm, state, CFG, 10, dry_run=False, log=log.append)
    state = auto_round(adm, state, CFG, 70, dry_run=False, log=log.append)  # eases: would lift alice's
    assert adm.calls == [("alice", 1)] and adm.limits["alice"] == (3,)  # left alone, and forgotten
    assert state.limits == () and any("leave alice alone: gres/gpu=3" in line for line in log)


def test_an_admins_limit_is_not_overwritten_and_a_missing_association_is_said() -> None:
    log: list[str] = []
    adm = Recorded({"alice": 6, "bob": 1}, {"alice": (2,)})
    state = auto_round(adm, AdmissionState(), CFG, 0, dry_run=False, log=log.append)
    assert adm.calls == [] and state.limits == ()
    adm = Recorded({"erin": 6, "bob": 1}, {})
    auto_round(adm, AdmissionState(), CFG, 0, dry_run=False, log=log.append)
    assert adm.calls == [] and "cannot limit erin: no association in slurmdbd" in log


def test_dry_run_changes_nothing() -> None:
    log: list[str] = []
    adm = Recorded({"alice": 6, "bob": 1}, {"alice": (None,), "bob": (None,)})
    state = auto_round(adm, AdmissionState(), CFG, 0, dry_run=True, log=log.append)
    assert adm.calls == [] and state.limits == () and state.tier == 1
    assert any(line.startswith("would set GrpTRES=gres/gpu=1 for alice") for line in log)


def test_state_round_trip_and_a_bad_state_is_a_fresh_start(tmp_path: Path) -> None:
    state = AdmissionState(1, 5.0, 600.0, None, (("alice", 1),))
    save_state(str(tmp_path / "s"), state)
    assert load_state(str(tmp_path / "s")) == state
    assert (tmp_path / "s" / "admission.json").stat().st_mode & 0o777 == 0o600
    (tmp_path / "s" / "admission.json").write_text('{"tier": 1, "limits": [["bad user!", 1]]}')
    assert load_state(str(tmp_path / "s")) == AdmissionState()
    assert load_state(str(tmp_path / "none")) == AdmissionState()


def test_without_utilisation_the_tiers_still_act() -> None:
    class NoPrometheus(Recorded):
        def read_utilisation(self, now: float) -> float | None:
            raise InputError("unreachable: Connection refused", source="prometheus:http://prom:9090")

    log: list[str] = []
    adm = NoPrometheus({"alice": 6, "bob": 1}, {"alice": (None,), "bob": (None,)})
    state = auto_round(adm, AdmissionState(), CFG, 0, dry_run=False, log=log.append)
    assert adm.calls == [("alice", 1)] and state.limits == (("alice", 1),)
    assert log[0] == ("utilisation not read, the band controller waits: prometheus:http://prom:9090: "
                      "unreachable: Connection refused")


def test_utilisation_moves_the_limit_in_a_round() -> None:
    class Busy(Recorded):
        def read_utilisation(self, now: float) -> float | None:
            return 1.0

    log: list[str] = []
    adm = Busy({"alice": 3, "bob": 1, "carol": 1}, {u: (None,) for u in ("alice", "bob", "carol")})
    auto_round(adm, AdmissionState(), CFG, 0, dry_run=False, log=log.append)
    assert adm.calls == [("alice", 2)]  # tier 50 % is 4; at 100 % utilisation the controller halves it
    assert "utilisation 100%" in log[-1]
