"""The health path on a "live" node (the real pynvml and the replay library) and replayed: a
scenario's Xid 79 reaches the monitor through its NVML event thread and takes that GPU out of
service; an ECC count rising, a temperature ramp and a GPU falling off the bus are seen by the
per-cycle health policy, and `gpuslurm health` live and `--from` the bundle agree at the same
scenario time.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from tests.helpers.nvml_replay import BUILTIN, LiveNode, MakeLiveNode, scenario_copy

from gpuslurm.hw.replay.bundle import read_bundle
from gpuslurm.state.out_of_service import OutOfServiceStore

DGX = BUILTIN / "dgx-h100"
GPUS = read_bundle(DGX).gpus
XID_AT = 15  # seconds after the monitor starts: it registers long before


def _config(tmp_path: Path, name: str, actions: str) -> Path:
    root = tmp_path / name
    (root / "state").mkdir(parents=True)
    config = root / "gpuslurm.toml"
    config.write_text(
        f'[paths]\nstate_dir = "{root / "state"}"\nrun_dir = "{root / "run"}"\n'
        f'scontrol = "{root / "no-scontrol"}"\nsqueue = "{root / "no-squeue"}"\n'
        f'[monitor]\nhealth = true\nkmsg = ""\n{actions}'
    )
    return config


GPU_OUT = "".join(
    f'[health.{check}]\naction = "gpu_out"\n' for check in ("xid", "ecc", "temperature", "lost_gpu")
)


def _out(config: Path) -> dict[str, Any]:
    return OutOfServiceStore(str(config.parent / "state")).read()


def test_an_xid_79_event_takes_the_gpu_out_live_and_replayed(live_node: MakeLiveNode, tmp_path: Path) -> None:
    """Xid 79 on GPU 3 and GPU 5 falling off the bus while the monitor runs."""
    g3, g5 = GPUS[3], GPUS[5]
    lost = {"at": XID_AT, "gpus": {g3.uuid: {"xid": [79]}, g5.uuid: {"lost": True}}}
    bundle = scenario_copy(tmp_path, DGX, [{"at": 0, "gpus": {}}, lost])
    node = live_node(bundle)
    config = _config(tmp_path, "live", GPU_OUT)
    env = {**node.lib.env(node.nvml_json, node.log), "GPUSLURM_CONFIG": str(config)}
    monitor = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "gpuslurm",
            "monitor",
            "--interval",
            "0.5",
            "--db",
            str(config.parent / "m.db"),
        ],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + XID_AT + 60
        while len(_out(config)) < 2 and monitor.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
    finally:
        monitor.terminate()
        stderr = monitor.communicate(timeout=30)[1]
    out = _out(config)
    assert sorted(out) == sorted([g3.uuid, g5.uuid]), stderr
    assert out[g3.uuid].by == "monitor" and "Xid 79 (GPU has fallen off the bus" in out[g3.uuid].reason
    assert out[g5.uuid].reason == "GPU is lost"
    assert f"NVML event: Xid 79 on {g3.uuid}" in stderr
    # R535 has no event for a fall off the bus: the wait's GPU_IS_LOST is said once, the thread goes on
    assert stderr.count("NVML event wait: a GPU is lost") == 1
    assert "kernel log" not in stderr  # the events were there: no fallback said
    # replayed, the same scenario time gives the same record (the Xid from the scenario's health)
    replayed = _config(tmp_path, "replayed", GPU_OUT)
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "gpuslurm",
            "monitor",
            "--once",
            "--from",
            str(bundle),
            "--db",
            str(replayed.parent / "m.db"),
        ],
        env={**env, "GPUSLURM_CONFIG": str(replayed)},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert {u: r.reason for u, r in _out(replayed).items()} == {u: r.reason for u, r in out.items()}


def _ramp(start: float) -> str:
    """GPU 1's ECC count rises 0 -> 2 and GPU 2 heats 60 -> 80 -> 96 C, 500 s on."""
    g = [x.uuid for x in GPUS]
    return json.dumps(
        {
            "start": start,
            "steps": [
                {"at": 0, "gpus": {g[1]: {"ecc_uncorrectable": 0}, g[2]: {"temp_c": 60}}},
                {"at": 500, "gpus": {g[1]: {"ecc_uncorrectable": 2}, g[2]: {"temp_c": 80}}},
                {"at": 510, "gpus": {g[2]: {"temp_c": 96}}},
            ],
        }
    )


def _cycle(node: LiveNode, config: Path, shift: float) -> dict[str, Any]:
    done = node.run(
        "monitor",
        "--once",
        "--json",
        "--db",
        str(config.parent / f"{shift}.db"),
        extra_env={"GPUSLURM_CONFIG": str(config), "GPUSLURM_NVML_REPLAY_CLOCK": str(shift)},
    )
    cycle: dict[str, Any] = json.loads(done.stdout.splitlines()[0])
    return cycle


def _problems(cycle: dict[str, Any]) -> list[tuple[str, str]]:
    """The cycle's GPU and health problems (no scheduler answers here: not those)."""
    return [(p["kind"], p["subject"]) for p in cycle["problems"] if p["kind"] in ("gpu-lost", "health")]


def test_the_cycles_health_policy_sees_ecc_rise_and_heat(live_node: MakeLiveNode, tmp_path: Path) -> None:
    bundle = scenario_copy(tmp_path, DGX, [])
    (bundle / "scenario.json").write_text(_ramp(time.time()))
    node = live_node(bundle)
    config = _config(tmp_path, "ramp", GPU_OUT)
    before = _cycle(node, config, 0)
    assert _out(config) == {} and _problems(before) == []
    _cycle(node, config, 505)  # ECC 2 (no event: it rose before this monitor registered), 80 C
    out = _out(config)
    assert {u: r.reason for u, r in out.items()} == {GPUS[1].uuid: "2 uncorrectable ECC errors (limit 0)"}
    _cycle(node, config, 515)  # the ramp goes on: 96 C
    assert _out(config)[GPUS[2].uuid].reason == "temperature 96 C over limit 85 C"


def _health(node: LiveNode, config: Path, *args: str) -> tuple[int, list[dict[str, Any]]]:
    done = node.run("health", "--json", *args, check=False, extra_env={"GPUSLURM_CONFIG": str(config)})
    assert done.returncode in (0, 1), done.stderr
    keys = ("verdict", "faults")
    report = [
        {k: g[k] for k in keys} | {f: g["facts"][f] for f in ("ecc_uncorrectable", "temperature_c", "lost")}
        for g in json.loads(done.stdout)["gpus"]
    ]
    return done.returncode, report


def test_health_live_and_replayed_agree_at_the_same_scenario_time(
    live_node: MakeLiveNode, tmp_path: Path
) -> None:
    bundle = scenario_copy(tmp_path, DGX, [])
    (bundle / "scenario.json").write_text(_ramp(time.time() - 520))  # every step has begun
    node = live_node(bundle)
    config = _config(tmp_path, "health", "")
    live = _health(node, config)
    replayed = _health(node, config, "--from", str(bundle))
    assert live == replayed
    code, report = live
    assert code == 1
    assert [g["verdict"] for g in report] == ["healthy", "unhealthy", "unhealthy"] + ["healthy"] * 5
    assert (report[1]["ecc_uncorrectable"], report[2]["temperature_c"]) == (2, 96)


def test_a_driver_without_events_falls_back_and_says_so_once(live_node: MakeLiveNode, tmp_path: Path) -> None:
    """The monitor on a driver without the event API: one line, then its cycles as usual; the
    health policy still reads the retained facts (an ECC count already there)."""
    bundle = scenario_copy(tmp_path, DGX, [{"at": 0, "gpus": {GPUS[6].uuid: {"ecc_uncorrectable": 5}}}])
    plain = live_node(bundle)
    node = LiveNode(
        plain.lib.without("nvmlEventSetCreate", "nvmlEventSetWait_v2"),
        plain.bundle,
        plain.nvml_json,
        plain.log,
        plain.config,
    )
    config = _config(tmp_path, "old", GPU_OUT)
    done = node.run(
        "monitor",
        "--interval",
        "0.2",
        "--once",
        "--db",
        str(config.parent / "m.db"),
        extra_env={"GPUSLURM_CONFIG": str(config)},
    )
    assert done.stderr.count("NVML events are not available") == 1, done.stderr
    assert "Xids come from the kernel log only" in done.stderr
    assert {u: r.reason for u, r in _out(config).items()} == {
        GPUS[6].uuid: "5 uncorrectable ECC errors (limit 0)"
    }


def test_a_gpu_lost_before_the_check_started_is_still_reported(
    live_node: MakeLiveNode, tmp_path: Path
) -> None:
    """NVML answers GPU_IS_LOST for GPU 3 from the start: the live node has no UUID for it, yet
    `health` reports it unhealthy by its index (exit 1) where `--from` names it, the monitor's
    policy sees it, and `health --act` drains rather than records a GPU it cannot name."""
    g3 = GPUS[3]
    bundle = scenario_copy(
        tmp_path, DGX, [{"at": 0, "gpus": {g3.uuid: {"lost": True}}}], start=time.time() - 60
    )
    node = live_node(bundle)
    config = _config(tmp_path, "lost", '[health.lost_gpu]\naction = "log"\n')
    live = node.run("health", "--json", check=False, extra_env={"GPUSLURM_CONFIG": str(config)})
    replayed = node.run(
        "health", "--json", "--from", str(bundle), check=False, extra_env={"GPUSLURM_CONFIG": str(config)}
    )
    assert (live.returncode, replayed.returncode) == (0, 0)  # action log: not unhealthy
    strict = _config(tmp_path, "strict", "")  # lost_gpu's default action: drain
    live = node.run("health", "--json", check=False, extra_env={"GPUSLURM_CONFIG": str(strict)})
    replayed = node.run(
        "health", "--json", "--from", str(bundle), check=False, extra_env={"GPUSLURM_CONFIG": str(strict)}
    )
    assert (live.returncode, replayed.returncode) == (1, 1), live.stderr
    rows = {r["index"]: r for r in json.loads(live.stdout)["gpus"]}
    assert (rows[3]["uuid"], rows[3]["verdict"], rows[3]["facts"]) == (None, "unhealthy", {"lost": True})
    assert [r["verdict"] for r in json.loads(replayed.stdout)["gpus"] if r["index"] == 3] == ["unhealthy"]
    # the monitor started after the fall: its policy names the GPU by its index
    done = node.run(
        "monitor", "--once", "--db", str(config.parent / "m.db"), extra_env={"GPUSLURM_CONFIG": str(config)}
    )
    assert "index:3: lost_gpu: GPU is lost (NVML answers GPU_IS_LOST" in done.stderr, done.stderr
    # `status` has no row for a GPU without a UUID: it names it among its problems
    shown = node.run("status", "--json", extra_env={"GPUSLURM_CONFIG": str(config)})
    problems = [(p["kind"], p["subject"]) for p in json.loads(shown.stdout)["problems"]]
    assert ("gpu-lost", "index:3") in problems, problems
    text = node.run("status", extra_env={"GPUSLURM_CONFIG": str(config), "NO_COLOR": "1"}).stdout
    assert "index:3" in text and "GPU_IS_LOST" in text, text
    # out of service already (by UUID, from before it was lost): `health` says "out", nothing to do
    from gpuslurm.state.out_of_service import take_out

    take_out(OutOfServiceStore(str(strict.parent / "state")), GPUS, g3, "Xid 79", "admin", now=1.0)
    again = node.run("health", "--json", check=False, extra_env={"GPUSLURM_CONFIG": str(strict)})
    assert again.returncode == 0
    assert [(r["uuid"], r["verdict"]) for r in json.loads(again.stdout)["gpus"] if r["index"] == 3] == [
        (g3.uuid, "out")
    ]
