"""The replay NVML library on input it cannot serve, and ``capture`` on a replayed node."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
from tests.helpers.nvml_replay import NODE_DUMP, LiveNode, MakeLiveNode

from gpuslurm.hw.replay.bundle import read_bundle

DGX = Path(__file__).parents[3] / "src" / "gpuslurm" / "hw" / "builtin" / "dgx-h100"


def _good(live_node: MakeLiveNode) -> tuple[LiveNode, dict[str, object]]:
    """The DGX served by the library built with AddressSanitizer and UBSan."""
    plain = live_node(DGX)
    node = LiveNode(plain.lib.sanitized(), plain.bundle, plain.nvml_json, plain.log, plain.config)
    return node, json.loads(node.nvml_json.read_text())


BAD: list[tuple[str, Callable[[dict], object], str]] = [
    ("not JSON", lambda d: "{", "not valid JSON"),
    ("other format", lambda d: {**d, "format": "x"}, "not a gpuslurm NVML dump"),
    ("no replay section", lambda d: {k: v for k, v in d.items() if k != "replay"}, "no \"replay\" section"),
    ("uuid a number", lambda d: {**d, "gpus": [{**d["gpus"][0], "uuid": 7}, *d["gpus"][1:]]}, "bad uuid"),
    ("huge name", lambda d: {**d, "gpus": [{**d["gpus"][0], "name": "x" * 5000}, *d["gpus"][1:]]},
     "bad name"),
    ("CPU out of range", lambda d: {**d, "gpus": [{**d["gpus"][0], "cpu_affinity": [1 << 40]},
                                                  *d["gpus"][1:]]}, "cpu_affinity"),
    ("index not position", lambda d: {**d, "gpus": [{**d["gpus"][0], "index": 3}, *d["gpus"][1:]]},
     "not its position"),
    ("lists of unequal length", lambda d: {**d, "gpus": d["gpus"][:2]}, "equal length"),
    ("driver version not a version", lambda d: {**d, "driver_version": "beta"}, "not <major>.<minor>"),
    ("steps out of order", lambda d: _replay(d, steps=[{"at": 10}, {"at": 5}]), "time order"),
    ("step without a time", lambda d: _replay(d, steps=[{"devices": []}]), "needs \"at\""),
    ("process on no GPU", lambda d: _replay(d, processes=[{"gpu": 99, "mig": -1, "pid": 5}]), "process 0"),
    ("process on a MIG device that is not there",
     lambda d: _replay(d, processes=[{"gpu": 0, "mig": 3, "pid": 5}]), "has no MIG device 3"),
    ("health flag not a boolean", lambda d: _health(d, {"lost": 1}), "not true or false"),
    ("temperature out of range", lambda d: _health(d, {"temperature_c": 1e9}), "health number"),
    ("half of the row remapping", lambda d: _health(d, {"remap_pending": True}), "go together"),
    ("privileged not a boolean", lambda d: _replay(d, privileged="yes"), "privileged"),
]


def _replay(d: dict, **changes: object) -> dict:
    return {**d, "replay": {**d["replay"], **changes}}


def _health(d: dict, facts: dict) -> dict:
    gpus = [dict(g) for g in d["replay"]["gpus"]]
    gpus[0]["health"] = facts
    return _replay(d, gpus=gpus)


@pytest.mark.parametrize(("case", "mutate", "message"), BAD, ids=[b[0] for b in BAD])
def test_bad_input_fails_init_with_a_logged_reason(case: str, mutate: Callable[[dict], object], message: str,
                                                  live_node: MakeLiveNode) -> None:
    node, data = _good(live_node)
    bad = mutate(data)
    node.nvml_json.write_text(bad if isinstance(bad, str) else json.dumps(bad))
    done = node.run("discover", check=False)
    assert done.returncode not in (0,) and done.returncode > 0, "a crash (signal) or a success"
    assert "nvmlInit failed" in done.stderr or "NVML" in done.stderr
    assert message in node.log.read_text()


def test_missing_file_fails_init(live_node: MakeLiveNode) -> None:
    node, _ = _good(live_node)
    node.nvml_json.unlink()
    done = node.run("discover", check=False)
    assert done.returncode > 0
    assert "cannot open" in node.log.read_text()


def test_capture_round_trip(live_node: MakeLiveNode, tmp_path: Path) -> None:
    """``gpuslurm capture`` on the replayed node writes a bundle that reads back as the live model."""
    node = live_node(Path(__file__).parents[3] / "src" / "gpuslurm" / "hw" / "builtin" / "l40s-4x")
    out = tmp_path / "captured"
    done = node.run("capture", str(out), check=False)
    if done.returncode:
        pytest.skip(f"capture needs nvidia-smi on this machine: {done.stderr.strip()[:200]}")
    live = json.loads(node.python(NODE_DUMP))
    back = read_bundle(out)
    from gpuslurm.hw.formats.nvml_json import node_to_dict
    again = node_to_dict(back)
    assert again["gpus"] == live["gpus"]
    assert again["links"] == live["links"]


def test_a_clock_shift_that_is_not_a_number_fails_init(live_node: MakeLiveNode) -> None:
    node, _ = _good(live_node)
    done = node.run("discover", check=False, extra_env={"GPUSLURM_NVML_REPLAY_CLOCK": "soon"})
    assert done.returncode > 0
    assert "GPUSLURM_NVML_REPLAY_CLOCK=soon is not a number" in node.log.read_text()


REINIT = """
import pynvml as n
n.nvmlInit()
first = n.nvmlDeviceGetCount()
n.nvmlShutdown()
open({path!r}, "w").write("{{")
try:
    n.nvmlInit()
except n.NVMLError as e:
    print(first, "refused", e.value)
"""


def test_init_again_after_shutdown_reads_the_file_again(live_node: MakeLiveNode) -> None:
    node, _ = _good(live_node)
    assert node.python(REINIT.format(path=str(node.nvml_json))).split() == ["8", "refused", "999"]
    assert "not valid JSON" in node.log.read_text()
