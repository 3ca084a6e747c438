"""Hostile nvml.json: one field of a full dump (MIG, health, processes, a scenario with timed events)
replaced by
anything. The library (built with AddressSanitizer and UBSan, so a memory error aborts) must
refuse it at nvmlInit with a logged reason or serve it; neither it nor gpuslurm reading every
GPU, sample and health fact through it, nor a reader of its events, may crash or raise anything
but gpuslurm's own errors."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tests.helpers.nvml_replay import LiveNode, MakeLiveNode, scenario_bundle

from gpuslurm.hw.replay.bundle import read_bundle

A100 = Path(__file__).parents[3] / "src" / "gpuslurm" / "hw" / "builtin" / "a100-mig"
READ_ALL = """
from gpuslurm.errors import GpuslurmError
from gpuslurm.hw.live.nvml_health import NvmlHealthReader
from gpuslurm.hw.live.nvml import NvmlBackend
from gpuslurm.hw.live.nvml_sampler import NvmlSampler
try:
    node = NvmlBackend().read_node("n")
    NvmlSampler().read()
    NvmlHealthReader().read(node.gpus)
    print("served")
except GpuslurmError as exc:
    print("refused:", exc)
    raise SystemExit(0)
# the event API too: register what each GPU supports, move the clock past the events, wait
import os, pynvml as n
try:
    s = n.nvmlEventSetCreate()
    for i in range(n.nvmlDeviceGetCount()):
        try:
            h = n.nvmlDeviceGetHandleByIndex(i)
            n.nvmlDeviceRegisterEvents(h, n.nvmlDeviceGetSupportedEventTypes(h), s)
        except n.NVMLError:
            pass
    os.environ["GPUSLURM_NVML_REPLAY_CLOCK"] = "100000"
    seen = []
    for _ in range(40):
        try:
            d = n.nvmlEventSetWait_v2(s, 10)
            seen.append((d.eventType, d.eventData, d.gpuInstanceId))
        except n.NVMLError as exc:
            if exc.value == n.NVML_ERROR_TIMEOUT:
                break
            seen.append(exc.value)
    n.nvmlEventSetFree(s)
    print("events", sorted(seen, key=repr))
except n.NVMLError as exc:
    print("event API:", exc)
"""


def _paths(value: Any, here: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    if isinstance(value, dict):
        return [here] + [p for k, v in value.items() for p in _paths(v, (*here, k))]
    if isinstance(value, list):
        return [here] + [p for i, v in enumerate(value) for p in _paths(v, (*here, i))]
    return [here]


def _replace(doc: Any, path: tuple[Any, ...], new: Any) -> Any:
    if not path:
        return new
    copy = dict(doc) if isinstance(doc, dict) else list(doc)
    copy[path[0]] = _replace(doc[path[0]], path[1:], new)
    return copy


ANY = st.recursive(
    st.none() | st.booleans() | st.integers(-(1 << 70), 1 << 70) | st.floats(allow_nan=False)
    | st.text(max_size=300) | st.sampled_from(["switch", "3g.40gb", "9c.1g.5gb", "535.54.03", "x" * 5000]),
    lambda inner: st.lists(inner, max_size=80) | st.dictionaries(st.text(max_size=20), inner, max_size=5),
    max_leaves=100)


def test_any_one_field_is_refused_or_served(live_node: MakeLiveNode, tmp_path: Path) -> None:
    plain = live_node(_with_faults(scenario_bundle(tmp_path, A100)), processes={1: [(1, 100)]},
                      reserved_mib={1: 300})
    node = LiveNode(plain.lib.sanitized(), plain.bundle, plain.nvml_json, plain.log, plain.config)
    doc = json.loads(node.nvml_json.read_text())
    # the parts the library reads (the rest of the model is gpuslurm's own, read in Python)
    paths = [p for p in _paths(doc) if not p or p[0] in ("replay", "gpus", "driver_version", "cuda_version",
                                                          "format")]

    untouched = _read_all(node)
    assert untouched.returncode == 0 and untouched.stdout.startswith("served"), untouched.stderr[-3000:]
    mig = next(m for g in read_bundle(node.bundle).gpus for m in g.mig_devices if m.uuid)
    # Xids 31 and 94 on a MIG device (its GPU instance), 79, a double-bit ECC, and GPU 0 lost
    # (R535 answers the wait GPU_IS_LOST)
    want = [15, [2, 0, 0xFFFFFFFF], [8, 31, mig.gi_id], [8, 79, 0xFFFFFFFF], [8, 94, mig.gi_id]]
    assert untouched.stdout.splitlines()[1] == f"events {sorted(map(_tuple, want), key=repr)}"

    @settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
    @given(path=st.sampled_from(paths), new=ANY)
    def check(path: tuple[Any, ...], new: Any) -> None:
        node.nvml_json.write_text(json.dumps(_replace(doc, path, new)))
        if node.log.exists():
            node.log.unlink()
        done = _read_all(node)
        assert done.returncode == 0, f"{path}={new!r}: exit {done.returncode}\\n{done.stderr[-3000:]}"
        if done.stdout.startswith("refused: NVML nvmlInit failed"):
            assert node.log.read_text().strip(), "refused without a reason in the log"

    check()


def _tuple(x: Any) -> Any:
    return tuple(x) if isinstance(x, list) else x


def _with_faults(bundle: Path) -> Path:
    """The scenario gains a step of timed faults: Xids (one on a MIG device), an ECC rise, a GPU lost."""
    gpus = read_bundle(bundle).gpus
    mig = next(m.uuid for g in gpus for m in g.mig_devices if m.uuid)
    doc = json.loads((bundle / "scenario.json").read_text())
    faults = {mig: {"xid": [31, 94]}, gpus[0].uuid: {"xid": [79], "lost": True},
              gpus[1].uuid: {"ecc_uncorrectable": 7}}
    doc["steps"].append({"at": 5000, "gpus": faults})
    (bundle / "scenario.json").write_text(json.dumps(doc))
    return bundle


def _read_all(node: LiveNode) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", READ_ALL], capture_output=True, text=True, timeout=120,
                          check=False, env=node.env())
