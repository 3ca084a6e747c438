"""The pure health gate and the health.json scenario reader.

The live reader through NVML (the real pynvml against the replay library) and the gate on what it
reads are in tests/hw/nvml/test_health_gate.py and tests/hw/nvml/test_health.py.
"""

from __future__ import annotations

from typing import Any

import pytest

from gpuslurm.config import parse_config
from gpuslurm.errors import CaptureError
from gpuslurm.hw.formats.health_json import parse_scenario
from gpuslurm.hw.model.health import GpuHealth, GpuProcess
from gpuslurm.policy.health import drain_reason, gate_enabled, gate_faults, gpu_label, released_faults

DEFAULT = parse_config("").health
U = "GPU-aaaa"


def checks(health: GpuHealth, cfg: Any = DEFAULT) -> list[tuple[str, str]]:
    return [(f.check, f.action) for f in gate_faults(health, cfg)]


def test_unknown_facts_are_healthy() -> None:
    assert checks(GpuHealth(U)) == []


@pytest.mark.parametrize(("health", "check"), [
    (GpuHealth(U, lost=True), "lost_gpu"),
    (GpuHealth(U, error="NVML nvmlDeviceGetUUID failed"), "lost_gpu"),
    (GpuHealth(U, xid=(79,)), "xid"),
    (GpuHealth(U, ecc_uncorrectable=1), "ecc"),
    (GpuHealth(U, remap_pending=True), "row_remap"),
    (GpuHealth(U, remap_failed=True), "row_remap"),
    (GpuHealth(U, retired_pages_pending=True), "row_remap"),
    (GpuHealth(U, temperature_c=86), "temperature"),
    (GpuHealth(U, processes=(GpuProcess(5, "bob"),)), "leftover_processes"),
    (GpuHealth(U, processes=(GpuProcess(5, None),)), "leftover_processes"),  # owner unknown: counts
])
def test_each_fault(health: GpuHealth, check: str) -> None:
    assert checks(health) == [(check, "drain")]


def test_limits_are_inclusive_and_ignores_apply() -> None:
    assert checks(GpuHealth(U, temperature_c=85, ecc_uncorrectable=0, xid=(13, 31, 43, 45))) == []
    cfg = parse_config("[health.ecc]\nmax_uncorrectable = 2\n[health.xid]\nignore = []\n").health
    assert checks(GpuHealth(U, ecc_uncorrectable=2, xid=(13,)), cfg) == [("xid", "drain")]


def test_lost_gpu_hides_the_rest_and_actions_are_configurable() -> None:
    assert checks(GpuHealth(U, lost=True, temperature_c=200)) == [("lost_gpu", "drain")]
    cfg = parse_config('[health.lost_gpu]\naction = "log"\n[health.temperature]\naction = "off"\n').health
    assert checks(GpuHealth(U, lost=True), cfg) == [("lost_gpu", "log")]
    assert checks(GpuHealth(U, temperature_c=200), cfg) == []


def test_gate_enabled_only_when_some_prolog_check_is_on() -> None:
    off = "\n".join(f'[health.{n}]\naction = "off"' for n in
                    ("lost_gpu", "xid", "ecc", "row_remap", "temperature", "throttle", "leftover_processes"))
    assert gate_enabled(DEFAULT)
    assert not gate_enabled(parse_config(off).health)


def test_released_checks_memory_and_processes() -> None:
    h = GpuHealth(U, memory_used_mib=1025, processes=(GpuProcess(1, "alice", 10),))
    assert [f.check for f in released_faults(h, DEFAULT)] == ["leftover_processes", "memory_released"]
    assert released_faults(GpuHealth(U, memory_used_mib=1024, processes=()), DEFAULT) == []
    # the prolog does not check memory: the driver and other jobs' MIG slices hold some
    assert checks(GpuHealth(U, memory_used_mib=80000)) == []


def test_drain_reason_names_gpu_index_device_file_and_uuid() -> None:
    faults = gate_faults(GpuHealth(U, xid=(48, 79, 48)), DEFAULT)
    reason = drain_reason(faults, {U: gpu_label(3, 1, U)})
    xids = "Xid 48 (double-bit ECC error; needs reset); Xid 79 (GPU has fallen off the bus; needs reboot)"
    assert reason == f"gpuslurm: GPU index 3 (/dev/nvidia1, {U}): {xids}"
    assert drain_reason(faults, {}) == f"gpuslurm: GPU ? ({U}): {xids}"


def test_scenario_parses_and_matches_uuids_case_insensitively() -> None:
    text = ('{"GPU-AbC": {"lost": false, "xid": [79], "temperature_c": 95, "ecc_uncorrectable": 0,'
            ' "retired_pages_pending": false, "remap_pending": true, "memory_used_mib": 3,'
            ' "processes": [{"pid": 4, "user": "bob", "used_mib": 9}]}}')
    got = parse_scenario(text, "h.json", ["GPU-abc", "GPU-other"])
    assert got["GPU-abc"] == GpuHealth("GPU-abc", xid=(79,), temperature_c=95, ecc_uncorrectable=0,
                                       retired_pages_pending=False, remap_pending=True,
                                       memory_used_mib=3, processes=(GpuProcess(4, "bob", 9),))
    assert got["GPU-other"] == GpuHealth("GPU-other")


@pytest.mark.parametrize(("text", "message"), [
    ("[]", "must be a JSON object"),
    ("{", "not valid JSON"),
    ('{"G": {"lost": 1}}', "'lost' must be true or false"),
    ('{"G": {"temperature_c": "hot"}}', "must be a whole number"),
    ('{"G": {"xid": 79}}', "list of Xid codes"),
    ('{"G": {"processes": [{"user": "x"}]}}', "with a pid"),
    ('{"G": {"processes": [{"pid": 1, "cmd": "x"}]}}', "unknown process key 'cmd'"),
    ('{"G": {"temp": 1}}', "unknown key 'temp'"),
])
def test_bad_scenarios_name_the_problem(text: str, message: str) -> None:
    with pytest.raises(CaptureError, match=message) as info:
        parse_scenario(text, "bundle/health.json", [])
    assert info.value.source == "bundle/health.json"


def test_hardware_throttling_is_logged_by_default() -> None:
    from gpuslurm.hw.model.health import SLOWDOWNS as READER_SLOWDOWNS
    from gpuslurm.policy.health import SLOWDOWNS

    assert SLOWDOWNS == READER_SLOWDOWNS
    [fault] = gate_faults(GpuHealth(U, clock_events=("sw_power_cap", "hw_power_brake")), DEFAULT)
    assert (fault.check, fault.action) == ("throttle", "log")
    assert fault.message == "clocks slowed: hw_power_brake"  # a power cap is policy, not a fault
    assert gate_faults(GpuHealth(U, clock_events=("gpu_idle", "sw_power_cap")), DEFAULT) == []
