"""The replay scenario's timed faults (Xids, ECC counts, temperature, lost GPUs): parsed strictly,
laid over health.json at the scenario's time, and written for the replay NVML library.

Hostile scenario files (NaN, huge numbers, wrong types, bytes that are not UTF-8) are one line on
stderr and exit 2 from the commands that replay them; Hypothesis holds the parser to "a Scenario
with every value in range, or one CaptureError".
"""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpuslurm.errors import CaptureError
from gpuslurm.hw.formats.scenario import MAX_ECC, MAX_SECONDS, MAX_XID, parse_scenario
from gpuslurm.hw.model.health import GpuHealth
from gpuslurm.hw.replay.nvml_replay import replay_dict
from gpuslurm.hw.replay.scenario import health_at, readings
from gpuslurm.hw.source import load_node

NODE = load_node("dgx-h100")
U = [g.uuid for g in NODE.gpus]
MIG_NODE = load_node("a100-mig")
BUILTIN = Path(__file__).parents[2] / "src" / "gpuslurm" / "hw" / "builtin"


def _parse(doc: Any, node: Any = NODE) -> Any:
    return parse_scenario(json.dumps(doc), "/s/scenario.json", node)


def test_faults_are_laid_over_health_at_their_time() -> None:
    sc = _parse(
        {
            "start": 1000,
            "steps": [
                {"at": 0, "gpus": {U[1]: {"ecc_uncorrectable": 1, "temp_c": 50}, U[0]: {"xid": [13]}}},
                {"at": 10, "gpus": {U[3]: {"xid": [79, 48]}, U[2]: {"temp_c": 90.5}}},
                {"at": 20, "gpus": {U[1]: {"ecc_uncorrectable": 4}, U[3]: {"lost": True}}},
                {"at": 30, "gpus": {}},
            ],
        }
    )
    base = {u: GpuHealth(u, temperature_c=40, xid=(63,) if u == U[3] else ()) for u in U}
    at = {t: health_at(sc, 1000, 1000 + t, base) for t in (-1, 5, 15, 25, 35)}
    # before the first step: health.json's facts; a GPU the scenario gives an ECC count has ECC on
    # (the library answers 0, not NOT_SUPPORTED, until the step)
    assert at[-1] == {**base, U[1]: base[U[1]]._replace(ecc_uncorrectable=0)}
    assert (at[5][U[1]].ecc_uncorrectable, at[5][U[1]].temperature_c, at[5][U[0]].xid) == (1, 50, (13,))
    assert at[5][U[2]].ecc_uncorrectable is None  # ECC never mentioned: unknown
    assert at[15][U[3]].xid == (63, 79, 48) and at[15][U[2]].temperature_c == 91  # rounded as lround
    assert (
        at[15][U[1]].ecc_uncorrectable == 1 and at[15][U[1]].temperature_c == 40
    )  # carried; step's temp gone
    assert at[25][U[3]] == GpuHealth(U[3], lost=True)  # off the bus: nothing else is known
    assert at[25][U[1]].ecc_uncorrectable == 4
    assert at[35][U[3]].lost is False and at[35][U[3]].xid == (63, 79, 48)  # back; its Xids stay
    assert at[35][U[0]].xid == (13,)


def test_the_library_gets_one_event_per_fault_in_order() -> None:
    mig_gpu = next(g for g in MIG_NODE.gpus if g.mig_mode and g.mig_devices)
    mig = mig_gpu.mig_devices[0]
    assert mig.uuid
    sc = _parse(
        {
            "steps": [
                {"at": 0, "gpus": {mig_gpu.uuid: {"ecc_uncorrectable": 0}}},
                {"at": 5, "gpus": {mig.uuid: {"xid": [31]}, mig_gpu.uuid: {"ecc_uncorrectable": 3}}},
                {"at": 6, "gpus": {mig_gpu.uuid: {"lost": True}}},
                {"at": 7, "gpus": {mig_gpu.uuid: {"lost": True, "ecc_uncorrectable": 3}}},
            ]
        },
        MIG_NODE,
    )
    steps = replay_dict(MIG_NODE, scenario=sc, start=100.0)["replay"]["steps"]
    pos, slot = mig_gpu.index, 0
    assert [s["events"] for s in steps] == [
        [],
        [{"gpu": pos, "mig": slot, "type": 0x8, "data": 31}, {"gpu": pos, "mig": -1, "type": 0x2, "data": 0}],
        [{"gpu": pos, "mig": -1, "type": 0x4000, "data": 0}],
        [],
    ]  # lost once; ECC unchanged: no event
    gpu_entry = next(d for d in steps[1]["devices"] if d["gpu"] == pos and d["mig"] == -1)
    assert gpu_entry["ecc_uncorrectable"] == 3 and [s["at"] for s in steps] == [100.0, 105.0, 106.0, 107.0]


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        (
            {"gpus": {U[0]: {"xid": [0]}}},
            "gpus['" + U[0] + "'].xid must be a whole number from 1 to 9999, not 0",
        ),
        ({"gpus": {U[0]: {"xid": []}}}, "xid must be a list of 1 to 16 Xid codes"),
        ({"gpus": {U[0]: {"xid": [79.0]}}}, "not 79.0"),
        ({"gpus": {U[0]: {"xid": ["79"]}}}, "not '79'"),
        ({"gpus": {U[0]: {"ecc_uncorrectable": -1}}}, "ecc_uncorrectable must be a whole number from 0"),
        (
            {"gpus": {U[0]: {"ecc_uncorrectable": 10**30}}},
            "from 0 to 1000000000, not 1000000000000000000000000000000",
        ),
        ({"gpus": {U[0]: {"ecc_uncorrectable": True}}}, "not True"),
        (
            {
                "steps": [
                    {"at": 5, "gpus": {U[0]: {"ecc_uncorrectable": 1}}},
                    {"at": 1, "gpus": {U[0]: {"ecc_uncorrectable": 3}}},
                ]
            },
            "ecc_uncorrectable of " + U[0] + " falls from 3 to 1 at 5 s",
        ),
        ({"gpus": {U[0]: {"temp_c": 1e300}}}, "temp_c must be a number from 0 to 1000"),
        ({"gpus": {U[0]: {"power_w": 10**6}}}, "power_w must be a number from 0 to 100000"),
        ({"gpus": {U[0]: {"mem_mib": 1 << 40}}}, "mem_mib must be a number from 0 to 1.67772e+07"),
        ({"steps": [{"at": 1e11}]}, "'at' must be seconds from the start"),
        ({"start": -5, "steps": [{}]}, "'start' must be Unix seconds"),
        ({"procs": [{"pid": 1 << 31, "gpu": U[0]}]}, "'pid' must be a process id"),
        ({"procs": [{"pid": p, "gpu": U[0]} for p in range(1, 66)]}, "more than 64 processes on GPU"),
        ({"steps": [{}] * 4097}, "more than 4096 steps"),
        ({"gpus": {"\udcff\n" * 30: {}}}, "unknown GPU"),
    ],
)
def test_bad_timed_faults_name_the_entry(doc: Any, message: str) -> None:
    with pytest.raises(CaptureError) as err:
        parse_scenario(json.dumps(doc), "/s/scenario.json", NODE)
    text = str(err.value)
    assert message in text and text.startswith("/s/scenario.json") and "\n" not in text


def test_an_ecc_count_on_a_mig_device_is_refused() -> None:
    mig = next(m.uuid for g in MIG_NODE.gpus for m in g.mig_devices if m.uuid)
    with pytest.raises(CaptureError, match="a GPU's count, not a MIG device's"):
        _parse({"gpus": {mig: {"ecc_uncorrectable": 1}}}, MIG_NODE)


@pytest.mark.parametrize(
    "text",
    [
        '{"gpus": {"' + U[0] + '": {"temp_c": NaN}}}',
        '{"gpus": {"' + U[0] + '": {"temp_c": Infinity}}}',
        '{"gpus": {"' + U[0] + '": {"temp_c": 1e400}}}',
        '{"start": -Infinity, "steps": [{}]}',
        "[" * 100000,
    ],
)
def test_json_that_is_no_number_is_refused(text: str) -> None:
    with pytest.raises(CaptureError) as err:
        parse_scenario(text, "/s/scenario.json", NODE)
    assert "\n" not in str(err.value)


HOSTILE = (
    st.none()
    | st.booleans()
    | st.integers(-(1 << 70), 1 << 70)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=20)
    | st.lists(st.integers(-5, 100_000), max_size=20)
)
KEYS = st.sampled_from(["util", "mem_mib", "power_w", "temp_c", "lost", "xid", "ecc_uncorrectable", "bogus"])
GPU_KEYS = st.sampled_from([*U[:3], U[0].lower(), "GPU-nope", ""])
STEP = st.fixed_dictionaries(
    {},
    optional={
        "at": HOSTILE | st.floats(0, 1e4),
        "gpus": st.dictionaries(
            GPU_KEYS, st.dictionaries(KEYS, HOSTILE | st.integers(0, 200), max_size=4) | HOSTILE, max_size=3
        )
        | HOSTILE,
        "procs": st.lists(
            st.fixed_dictionaries(
                {"pid": st.integers(-2, 1 << 31) | HOSTILE, "gpu": GPU_KEYS},
                optional={"mem_mib": HOSTILE, "sm": HOSTILE},
            ),
            max_size=3,
        )
        | HOSTILE,
    },
)
DOC = st.fixed_dictionaries(
    {"steps": st.lists(STEP, max_size=4) | HOSTILE}, optional={"start": HOSTILE | st.floats(0, 2e9)}
)


@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
@given(doc=DOC)
def test_any_scenario_is_a_checked_scenario_or_one_error(doc: dict[str, Any]) -> None:
    text = json.dumps(doc)  # NaN and Infinity as JSON's non-standard literals
    try:
        sc = parse_scenario(text, "/s/scenario.json", NODE)
    except CaptureError as exc:
        assert str(exc).startswith("/s/scenario.json") and "\n" not in str(exc)
        return
    start = sc.start if sc.start is not None else 0.0
    assert 0 <= start <= MAX_SECONDS
    counts: dict[str, int] = {}
    for step in sc.steps:
        assert 0 <= step.at <= MAX_SECONDS
        for sample in step.gpus.values():
            for v in (sample.util_pct, sample.mem_used_mib, sample.power_w, sample.temp_c):
                assert v is None or (math.isfinite(v) and v >= 0)
        assert all(1 <= code <= MAX_XID for _, _, code in step.xids)
        for uuid, n in step.ecc:
            assert counts.get(uuid, 0) <= n <= MAX_ECC
            counts[uuid] = n
    # what the library gets is plain JSON (no NaN), and the health overlay never fails
    json.dumps(replay_dict(NODE, scenario=sc, start=start), allow_nan=False)
    health_at(sc, start, start + 1e4, {u: GpuHealth(u) for u in U})
    readings(NODE, sc.steps[-1] if sc.steps else None)


@pytest.mark.parametrize(
    "data",
    [
        b'{"gpus": {"GPU-\xff": {}}}',  # not UTF-8
        b'{"gpus": {"%s": {"temp_c": NaN}}}',
        b'{"steps": [{"at": 1e400}]}',
        b'{"steps": [{"at": 99999999999999999999}]}',
        b'{"steps": "all of them"}',
    ],
)
@pytest.mark.parametrize("command", [["health", "--json"], ["monitor", "--once", "--db", "DB"]])
def test_a_hostile_scenario_file_is_one_line_and_exit_2(
    data: bytes, command: list[str], tmp_path: Path
) -> None:
    bundle = tmp_path / "b"
    shutil.copytree(BUILTIN / "l40s-4x", bundle)
    uuid = load_node(str(bundle)).gpus[0].uuid
    (bundle / "scenario.json").write_bytes(data.replace(b"%s", uuid.encode()))
    (tmp_path / "c.toml").write_text(
        f'[paths]\nstate_dir = "{tmp_path / "state"}"\nrun_dir = "{tmp_path / "run"}"\n'
        f'squeue = "{tmp_path / "none"}"\nscontrol = "{tmp_path / "none"}"\n'
    )
    args = [a.replace("DB", str(tmp_path / "m.db")) for a in command]
    done = subprocess.run(
        [sys.executable, "-m", "gpuslurm", *args, "--from", str(bundle)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env={"PATH": "/usr/bin:/bin", "GPUSLURM_CONFIG": str(tmp_path / "c.toml")},
    )
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "scenario.json" in lines[0], done.stderr
