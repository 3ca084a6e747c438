"""The live health reader through the real pynvml, and the prolog's gate on what it read.

These ran on the stand-in pynvml (tests/hooks/test_health_policy.py); the replay library serves the
facts from a bundle's health.json instead: a hot GPU with uncorrectable ECC errors and a leftover
process, a pending row remap on a GPU that does not report ECC, a lost GPU, and a model whose GPU
at an index has another UUID.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from tests.helpers.nvml_replay import MakeLiveNode

from gpuslurm.hw.replay.bundle import read_bundle

BUILTIN = Path(__file__).parents[3] / "src" / "gpuslurm" / "hw" / "builtin"
FACTS: list[dict[str, Any]] = [
    {"temperature_c": 91, "ecc_uncorrectable": 2, "processes": [{"pid": 1, "used_mib": 512}]},
    {"remap_pending": True, "remap_failed": False},
    {"lost": True},
]
READ = """
import json
from pathlib import Path
from gpuslurm.config import parse_config
from gpuslurm.hw.replay.bundle import read_bundle
from gpuslurm.hw.live.nvml_health import NvmlHealthReader
from gpuslurm.policy.health import gate_faults
gpus = read_bundle(Path(BUNDLE)).gpus
model = [g for g in gpus[:3]] if not WRONG else [gpus[7]._replace(index=1, minor=1, bus_id=gpus[1].bus_id)]
got = NvmlHealthReader().read(model)
cfg = parse_config("").health
out = {u: {**h._asdict(), "faults": [f.check for f in gate_faults(h, cfg)]} for u, h in got.items()}
print(json.dumps(out))
"""


def _node(live_node: MakeLiveNode, tmp_path: Path) -> Any:
    bundle = tmp_path / "dgx-h100"
    shutil.copytree(BUILTIN / "dgx-h100", bundle)
    gpus = read_bundle(bundle).gpus
    (bundle / "health.json").write_text(json.dumps({g.uuid: f for g, f in zip(gpus, FACTS, strict=False)}))
    return live_node(bundle), gpus


def _read(node: Any, wrong: bool) -> dict[str, dict[str, Any]]:
    code = READ.replace("BUNDLE", repr(str(node.bundle))).replace("WRONG", repr(wrong))
    return json.loads(node.python(code))  # type: ignore[no-any-return]


def test_live_reader_and_gate(live_node: MakeLiveNode, tmp_path: Path) -> None:
    node, gpus = _node(live_node, tmp_path)
    got = _read(node, False)
    hot, remapping, lost = (got[g.uuid] for g in gpus[:3])
    assert (hot["temperature_c"], hot["ecc_uncorrectable"]) == (91, 2)
    assert hot["processes"] == [[1, "root", 512]]  # pid 1 is init, root's
    assert hot["faults"] == ["ecc", "temperature", "leftover_processes"]
    assert remapping["remap_pending"] is True and remapping["faults"] == ["row_remap"]
    assert remapping["ecc_uncorrectable"] is None  # not supported: unknown, not a fault
    assert lost["lost"] is True and lost["faults"] == ["lost_gpu"]


def test_live_reader_refuses_a_renumbered_gpu(live_node: MakeLiveNode, tmp_path: Path) -> None:
    node, gpus = _node(live_node, tmp_path)
    got = _read(node, True)[gpus[7].uuid]
    assert got["error"] is not None and "not " + gpus[7].uuid in got["error"]
    assert got["faults"] == ["lost_gpu"]
