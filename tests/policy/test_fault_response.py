"""The one fault response (gpuslurm.policy.fault_response): faults and the GPUs in service in, one
decision per GPU out; the last GPU in service is never taken out, and the record is decided under
its lock (gpuslurm.state.out_of_service.take_out_decided). The real DGX H100's GPUs (minor ≠ index
on the dual A5000 is covered by the hooks' tests)."""

from __future__ import annotations

from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from gpuslurm.hw.source import load_node
from gpuslurm.policy.fault_response import (
    ALREADY_OUT,
    BY_ACTION,
    DRAIN,
    LAST_IN_SERVICE,
    LOG,
    TAKE_OUT,
    UNNAMED,
    UNRECORDED,
    respond,
)
from gpuslurm.policy.health import Fault
from gpuslurm.state.out_of_service import OutOfServiceStore, take_out, take_out_decided

NODE = load_node("dgx-h100")
GPUS = NODE.gpus
U = [g.uuid for g in GPUS]
ACTIONS = ("drain", "gpu_out", "log")


def fault(uuid: str, action: str, check: str = "xid", message: str = "Xid 79") -> Fault:
    return Fault(uuid, check, action, message)


def test_gpu_out_takes_only_that_gpu_out() -> None:
    (d,) = respond([fault(U[3], "gpu_out")], GPUS, ()).decisions
    assert (d.uuid, d.response, d.why, d.gpu) == (U[3], TAKE_OUT, BY_ACTION, GPUS[3])


def test_drain_wins_over_gpu_out_and_log_on_one_gpu() -> None:
    faults = [fault(U[1], "log", "temperature", "hot"), fault(U[1], "gpu_out"),
              fault(U[1], "drain", "ecc", "3 ECC")]
    (d,) = respond(faults, GPUS, ()).decisions
    assert d.response == DRAIN and d.faults == tuple(faults)
    assert [f.message for f in d.acted] == ["Xid 79", "3 ECC"] and d.reason == "Xid 79; 3 ECC"


def test_a_drain_on_one_gpu_does_not_stop_another_gpus_take_out() -> None:
    resp = respond([fault(U[0], "drain"), fault(U[5], "gpu_out")], GPUS, ())
    assert [(d.uuid, d.response) for d in resp.decisions] == [(U[0], DRAIN), (U[5], TAKE_OUT)]
    assert resp.drain_faults == [fault(U[0], "drain")]


def test_the_last_gpu_in_service_drains_instead() -> None:
    (d,) = respond([fault(U[7], "gpu_out")], GPUS, U[:7]).decisions
    assert (d.response, d.why) == (DRAIN, LAST_IN_SERVICE)
    assert respond([fault(U[7], "gpu_out")], GPUS, U[:7]).out_records("prolog", 1.0) == {}


def test_all_faulty_at_once_all_go_but_the_last_in_bus_order() -> None:
    resp = respond([fault(u, "gpu_out") for u in reversed(U)], GPUS, ())
    assert [d.response for d in resp.decisions] == [TAKE_OUT] * 7 + [DRAIN]
    assert resp.drains[0].uuid == U[7] and resp.drains[0].why == LAST_IN_SERVICE


def test_a_gpu_already_out_is_only_logged_and_compared_without_case() -> None:
    (d,) = respond([fault(U[2], "drain")], GPUS, [U[2].lower()]).decisions
    assert (d.response, d.why) == (LOG, ALREADY_OUT)


def test_a_gpu_that_cannot_be_named_drains_for_any_action_but_log() -> None:
    resp = respond([fault("index:4", "gpu_out", "lost_gpu"), fault("index:6", "log", "lost_gpu")], GPUS, ())
    assert [(d.uuid, d.response, d.why, d.gpu) for d in resp.decisions] == [
        ("index:4", DRAIN, UNNAMED, None), ("index:6", LOG, BY_ACTION, None)]


def test_unrecorded_drains_for_each_take_out() -> None:
    resp = respond([fault(U[0], "gpu_out"), fault(U[1], "log")], GPUS, ()).unrecorded()
    assert [(d.response, d.why) for d in resp.decisions] == [(DRAIN, UNRECORDED), (LOG, BY_ACTION)]


def test_out_records_name_the_gpu_as_taken_out() -> None:
    (rec,) = respond([fault(U[3], "gpu_out", message="Xid 79\nforged")], GPUS, ()).out_records(
        "monitor", 5.0).values()
    assert (rec.uuid, rec.by, rec.since, rec.index, rec.minor) == (U[3], "monitor", 5.0, 3, GPUS[3].minor)
    assert rec.reason == "Xid 79 forged"  # one printable line, as every record


faults_st = st.lists(st.tuples(st.integers(0, len(GPUS) - 1), st.sampled_from(ACTIONS),
                               st.sampled_from(("xid", "ecc", "lost_gpu"))), max_size=20)


@given(faults_st, st.sets(st.integers(0, len(GPUS) - 1)), st.integers(0, 3))
def test_one_decision_per_faulty_gpu_and_the_last_never_taken_out(
        spec: list[tuple[int, str, str]], out_idx: set[int], unnamed: int) -> None:
    faults = [fault(U[i], action, check, f"{check} {action}") for i, action, check in spec]
    faults += [fault(f"index:{9 + k}", "gpu_out", "lost_gpu") for k in range(unnamed)]
    out = [U[i] for i in out_idx]
    resp = respond(faults, GPUS, out)
    assert sorted(d.uuid for d in resp.decisions) == sorted({f.uuid for f in faults})  # exactly one each
    for d in resp.decisions:
        assert d.response in (TAKE_OUT, DRAIN, LOG)
        assert set(d.faults) == {f for f in faults if f.uuid == d.uuid}
        actions = {f.action for f in d.faults}
        if d.uuid in out:
            assert (d.response, d.why) == (LOG, ALREADY_OUT)
        elif d.gpu is None:
            assert d.response == DRAIN
        elif "drain" in actions:
            assert d.response == DRAIN and d.why == BY_ACTION
        elif "gpu_out" in actions:
            assert d.response == TAKE_OUT or (d.response, d.why) == (DRAIN, LAST_IN_SERVICE)
        else:
            assert d.response == LOG
        if d.response == DRAIN:
            assert d.acted and all(f.action != "log" for f in d.acted)  # a drain always says why
    in_service = [u for u in U if u not in out]
    taken = {d.uuid for d in resp.take_outs}
    assert taken < set(in_service) or (not in_service and not taken)  # never the last one
    lasts = [d for d in resp.drains if d.why == LAST_IN_SERVICE]
    assert len(lasts) <= 1 and (not lasts or len(taken) + 1 == len(in_service))  # and never silently
    assert set(resp.out_records("prolog", 1.0)) == taken


@given(st.permutations(list(range(len(GPUS)))))
def test_the_order_faults_come_in_changes_nothing(order: list[int]) -> None:
    faults = [fault(U[i], ACTIONS[i % 3]) for i in order]
    assert respond(faults, GPUS, ()) == respond(sorted(faults), GPUS, ())


def test_decided_under_the_lock_on_the_record_as_it_is_then(tmp_path: Path) -> None:
    """The prolog read the record with 6 GPUs out; before it takes GPU 6 out the monitor takes GPU 7
    out. Decided on what it read, GPU 6 would go and leave the node no GPU in service."""
    store = OutOfServiceStore(str(tmp_path))
    for g in GPUS[:6]:
        take_out(store, GPUS, g, "earlier", "admin", now=1.0)
    read_before = store.read()
    take_out(store, GPUS, GPUS[7], "Xid 79", "monitor", now=2.0)
    faults = [fault(U[6], "gpu_out")]
    resp = take_out_decided(store, lambda out: respond(faults, GPUS, out), "prolog", now=3.0, out=read_before)
    assert [(d.response, d.why) for d in resp.decisions] == [(DRAIN, LAST_IN_SERVICE)]
    assert U[6] not in store.read()


def test_nothing_to_take_out_takes_no_lock_and_writes_nothing(tmp_path: Path) -> None:
    store = OutOfServiceStore(str(tmp_path / "state"))
    resp = take_out_decided(store, lambda out: respond([fault(U[0], "drain")], GPUS, out), "prolog",
                            now=1.0, out={})
    assert resp.drains and not (tmp_path / "state").exists()


def test_a_gpu_taken_out_meanwhile_keeps_its_first_record(tmp_path: Path) -> None:
    store = OutOfServiceStore(str(tmp_path))
    take_out(store, GPUS, GPUS[2], "by the admin", "admin", now=1.0)
    resp = take_out_decided(store, lambda out: respond([fault(U[2], "gpu_out")], GPUS, out), "monitor",
                            now=2.0, out={})
    assert [(d.response, d.why) for d in resp.decisions] == [(LOG, ALREADY_OUT)]
    assert store.read()[U[2]].reason == "by the admin"
