"""place/pick: the devices' state from one reading, the out-of-service record and the store's
window, and the request checked against the node (pure: values in, values out)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpuslurm.errors import InputError
from gpuslurm.hw.source import load_node
from gpuslurm.place.engine import DeviceState
from gpuslurm.place.pick import (
    check_request,
    out_of_service_states,
    reading_states,
    window_uuids,
    with_window,
)
from gpuslurm.place.request import Request
from gpuslurm.samples import GpuSample, ProcessReading, Reading
from gpuslurm.state.out_of_service import OutOfService
from gpuslurm.state.store import GpuStats

NODE = load_node("l40s-4x")
UUIDS = [g.uuid for g in NODE.gpus]
MIG = load_node("a100-mig")


def test_another_users_process_counts_as_foreign_and_ours_does_not() -> None:
    reading = Reading(tuple(GpuSample(0.0, u, util_pct=5.0, mem_used_mib=100.0) for u in UUIDS),
                      (ProcessReading(11, UUIDS[0]), ProcessReading(12, UUIDS[1])))
    states = reading_states(NODE, reading, lambda pid: pid == 11)
    assert states[UUIDS[0].lower()].foreign_procs == 0
    assert states[UUIDS[1].lower()] == DeviceState(5.0, 100.0, 1)


def test_a_lost_gpu_and_a_silent_one_are_unhealthy() -> None:
    reading = Reading((GpuSample(0.0, UUIDS[0]),), (), (("gpu-lost", UUIDS[1], "fell off the bus"),))
    states = reading_states(NODE, reading, lambda pid: True)
    assert states[UUIDS[0].lower()].healthy
    assert states[UUIDS[1].lower()] == DeviceState(healthy=False, problem="fell off the bus")
    assert [states[u.lower()].problem for u in UUIDS[2:]] == ["no reading from the GPU"] * 2


@given(st.lists(st.tuples(st.sampled_from(UUIDS), st.integers(1, 1 << 22)), max_size=20),
       st.sets(st.integers(1, 1 << 22)))
def test_foreign_processes_are_exactly_those_not_ours(procs: list[tuple[str, int]], mine: set[int]) -> None:
    reading = Reading(tuple(GpuSample(0.0, u) for u in UUIDS),
                      tuple(ProcessReading(pid, u) for u, pid in procs))
    states = reading_states(NODE, reading, mine.__contains__)
    for u in UUIDS:
        assert states[u.lower()].foreign_procs == sum(1 for g, pid in procs if g == u and pid not in mine)


def test_a_gpu_out_of_service_takes_its_mig_devices_with_it() -> None:
    gpu = next(g for g in MIG.gpus if g.mig_devices)
    out = {gpu.uuid: OutOfService(gpu.uuid, "xid 79", 0.0, "admin")}
    states = out_of_service_states(MIG, {}, out)
    keys = {gpu.uuid.lower(), *(m.uuid.lower() for m in gpu.mig_devices if m.uuid)}
    assert set(states) == keys
    assert all(s == DeviceState(healthy=False, problem="out of service: xid 79") for s in states.values())


def test_the_window_adds_to_a_sample_and_keeps_its_health() -> None:
    states = {UUIDS[0].lower(): DeviceState(50.0, 10.0, 2)}
    stats = {UUIDS[0]: GpuStats(UUIDS[0], 6, 6, 80.0, 90.0, 4000.0),
             UUIDS[1]: GpuStats(UUIDS[1], 6, 6, 20.0, 30.0, 100.0)}
    out = with_window(states, stats)
    assert out[UUIDS[0].lower()] == DeviceState(50.0, 10.0, 2, window_util_pct=80.0, window_mem_mib=4000.0)
    assert out[UUIDS[1].lower()] == DeviceState(window_util_pct=20.0, window_mem_mib=100.0)
    assert set(window_uuids(MIG)) >= {g.uuid for g in MIG.gpus}


@pytest.mark.parametrize(("req", "allowed", "message"), [
    (Request(5), None, "5 GPUs wanted but"),
    (Request(2), (UUIDS[0],), "2 GPUs wanted but the job holds 1"),
    (Request(1, mig_profile="1g.10gb"), None, "no MIG device of profile '1g.10gb'"),
])
def test_requests_the_node_can_never_meet_are_bad_input(req: Request, allowed: tuple[str, ...] | None,
                                                         message: str) -> None:
    with pytest.raises(InputError, match=message) as caught:
        check_request(NODE, req, allowed)
    assert caught.value.exit_code == 2
    check_request(NODE, Request(4), None)  # the whole node: fine
