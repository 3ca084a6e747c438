"""Which NVML calls gpuslurm makes and skips, counted at the real pynvml's door to the replay library.

These were call-count tests on the stand-in (tests/helpers/fakes/fake_pynvml.py: tests/hw/test_nvml.py's
lifecycle and NVSwitch/MIG checks, tests/hw/test_nvml_light.py, the sampler's timestamps and
not-supported memo in tests/watch/test_nvml_sampling.py); here the counts are what crossed the C
ABI (tests/helpers/nvml_calls.py). Names are the library's symbols, so ``_v2``/``_v3`` suffixes show.
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path
from typing import Any

from tests.helpers.nvml_calls import COUNTING
from tests.helpers.nvml_replay import LiveNode, MakeLiveNode, scenario_bundle

BUILTIN = Path(__file__).parents[3] / "src" / "gpuslurm" / "hw" / "builtin"
LINK_CALLS = ("nvmlDeviceGetNvLink", "nvmlDeviceGetTopologyCommonAncestor")


def _run(node: LiveNode, code: str) -> Any:
    return json.loads(node.python(COUNTING + code))


LIFECYCLE = """
import json
from gpuslurm.hw.live.nvml import NvmlBackend
def n(name):
    return len(called(name))
b = NvmlBackend()
out = {"before": n("nvmlInitWithFlags")}
b.read_node("n1")
b.read_node("n1")
out["two_reads"] = [n("nvmlInitWithFlags"), n("nvmlShutdown")]
b.close()
b.close()
out["closed_twice"] = n("nvmlShutdown")
b.read_node("n1")
out["read_again"] = n("nvmlInitWithFlags")
b.close()
print(json.dumps(out))
"""


def test_init_is_lazy_and_happens_once(live_node: MakeLiveNode) -> None:
    got = _run(live_node(BUILTIN / "l40s-4x"), LIFECYCLE)
    assert got == {"before": 0, "two_reads": [1, 0], "closed_twice": 1, "read_again": 2}


FAILED_INIT = """
import json
from gpuslurm.errors import HardwareError
from gpuslurm.hw.live.nvml import NvmlBackend
try:
    NvmlBackend().read_node("n1")
except HardwareError as exc:
    print(json.dumps({"error": str(exc), "calls": [c[0] for c in CALLS]}))
"""


def test_nothing_is_asked_of_a_library_that_did_not_start(live_node: MakeLiveNode, tmp_path: Path) -> None:
    node = live_node(BUILTIN / "l40s-4x")
    bad = tmp_path / "bad.nvml.json"
    bad.write_text('{"format": "gpuslurm-nvml", "version": 1}')  # no "replay": nvmlInit fails
    got = _run(LiveNode(node.lib, node.bundle, bad, node.log, node.config), FAILED_INIT)
    assert got["error"] == "NVML nvmlInit failed: Unknown Error"
    # nvidia-ml-py asks for the error's text; nothing else is asked
    assert got["calls"][0] == "nvmlInitWithFlags" and set(got["calls"][1:]) <= {"nvmlErrorString"}
    assert "no \"replay\" section" in node.log.read_text()


READ = """
import json
from gpuslurm.hw.live.nvml import NvmlBackend
from gpuslurm.hw.formats.nvml_json import node_to_dict
b = NvmlBackend()
node = b.read_node("n1")
calls = list(CALLS)
links = None if node.links is None else [[str(c) for c in r] for r in node.links]
print(json.dumps({"calls": calls, "links": links,
                  "cuda": node.cuda_version, "gpus": len(node.gpus), "lookups": list(LOOKUPS),
                  "handles": [handle(i) for i in range(len(node.gpus))]}))
"""


def _names(calls: list[list[Any]]) -> list[str]:
    return [c[0] for c in calls]


def test_nvswitch_node_asks_no_pcie_ancestor_and_no_mig_count(live_node: MakeLiveNode) -> None:
    got = _run(live_node(BUILTIN / "dgx-h100"), READ)
    names = _names(got["calls"])
    assert got["links"] == [["X" if a == b else "NV18" for b in range(8)] for a in range(8)]
    assert "nvmlDeviceGetTopologyCommonAncestor" not in names  # NVLink everywhere
    assert "nvmlDeviceGetNumaNodeId" not in names  # sysfs says where a GPU is, not NVML
    assert names.count("nvmlDeviceGetNvLinkState") >= 8 * 18
    assert "nvmlDeviceGetMigMode" in names
    assert "nvmlDeviceGetMaxMigDeviceCount" not in names  # MIG capable, but disabled


def test_mig_gpu_is_not_asked_for_nvlinks(live_node: MakeLiveNode) -> None:
    got = _run(live_node(BUILTIN / "a100-mig"), READ)
    asked = {c[1][0] for c in got["calls"] if c[0] == "nvmlDeviceGetNvLinkState"}
    mig_gpu, plain_gpu = got["handles"]
    assert mig_gpu not in asked and plain_gpu in asked  # NVML answers no NVLink query in MIG mode
    assert [c[1][0] for c in got["calls"] if c[0] == "nvmlDeviceGetMaxMigDeviceCount"] == [mig_gpu]


OLD = ("nvmlSystemGetCudaDriverVersion_v2", "nvmlDeviceGetNvLinkRemoteDeviceType")


def test_old_driver_finds_the_switch_by_its_shared_remote(live_node: MakeLiveNode) -> None:
    node = live_node(BUILTIN / "dgx-h100")
    old = LiveNode(node.lib.without(*OLD), node.bundle, node.nvml_json, node.log, node.config)
    got = _run(old, READ)
    names = _names(got["calls"])
    assert got["cuda"] == "12.2"  # from nvmlSystemGetCudaDriverVersion (v1)
    assert "nvmlSystemGetCudaDriverVersion" in names
    assert "nvmlDeviceGetNvLinkRemotePciInfo_v2" in names
    assert "nvmlDeviceGetNvLinkRemoteDeviceType" in got["lookups"]  # FUNCTION_NOT_FOUND: not called
    assert not set(OLD) & set(names)
    # without remote device types the switch is a remote that many GPUs share
    assert got["links"] == [["X" if a == b else "NV18" for b in range(8)] for a in range(8)]


FULL_AND_LIGHT = """
import json
from pathlib import Path
from gpuslurm.hw.live.nvml import NvmlBackend
proc = Path(PROC)
out = {}
for name, links in (("full", True), ("light", False)):
    b = NvmlBackend(proc_root=proc)
    start = len(CALLS)
    out[name] = b.read_node("n1", links=links)
    b.close()
    out[name + "_calls"] = [c[0] for c in CALLS[start:]]
print(json.dumps({
    "same": out["light"] == out["full"]._replace(links=None),
    "links": [out["full"].links is not None, out["light"].links is None],
    "full_calls": out["full_calls"], "light_calls": out["light_calls"],
    "minors": [[m.gi_minor, m.ci_minor] for g in out["light"].gpus for m in g.mig_devices],
}))
"""


def _full_and_light(node: LiveNode, proc: Path = Path("/proc")) -> Any:
    return _run(node, FULL_AND_LIGHT.replace("PROC", repr(str(proc))))


def _links(names: list[str]) -> list[str]:
    return [n for n in names if n.startswith(LINK_CALLS)]


def test_dgx_h100_light_read_skips_every_link_query(live_node: MakeLiveNode) -> None:
    got = _full_and_light(live_node(BUILTIN / "dgx-h100"))
    assert got["same"] and got["links"] == [True, True]
    assert len(_links(got["full_calls"])) > 8 * 18  # the full read asks NVLink state per link
    assert _links(got["light_calls"]) == []
    assert len(got["light_calls"]) * 4 < len(got["full_calls"])


def test_pcie_light_read_skips_the_common_ancestor(live_node: MakeLiveNode) -> None:
    got = _full_and_light(live_node(BUILTIN / "l40s-4x"))
    assert got["same"]
    assert "nvmlDeviceGetTopologyCommonAncestor" in got["full_calls"]
    assert _links(got["light_calls"]) == []


def test_mig_devices_and_their_minors_are_kept(live_node: MakeLiveNode, tmp_path: Path) -> None:
    bundle = BUILTIN / "a100-mig"
    proc = tmp_path / "proc"
    (proc / "driver" / "nvidia-caps").mkdir(parents=True)
    shutil.copy(bundle / "mig-minors", proc / "driver" / "nvidia-caps" / "mig-minors")
    got = _full_and_light(live_node(bundle), proc)
    assert got["same"] and _links(got["light_calls"]) == []
    assert got["minors"] and all(None not in pair for pair in got["minors"])


LOAD_NODE = """
import json
from gpuslurm.hw.source import load_node
start = len(CALLS)
light = load_node(None, links=False)
light_calls = [c[0] for c in CALLS[start:]]
full = load_node(None)
print(json.dumps({"light": light.links is None, "gpus": len(light.gpus), "full": full.links is not None,
                  "light_links": [n for n in light_calls if n.startswith(("nvmlDeviceGetNvLink",
                                  "nvmlDeviceGetTopologyCommonAncestor"))],
                  "light_calls": len(light_calls), "full_links": len(called("nvmlDeviceGetNvLink", start))}))
"""


def test_load_node_passes_links_false_to_nvml(live_node: MakeLiveNode) -> None:
    got = _run(live_node(BUILTIN / "dgx-h100"), LOAD_NODE)
    assert got["light"] and got["gpus"] == 8 and got["light_calls"] > 0 and got["light_links"] == []
    assert got["full"] and got["full_links"] > 0  # the default is still the full read


SAMPLER = """
import json, time
from gpuslurm.hw.live.nvml_sampler import NvmlSampler
s = NvmlSampler()
def stamps(since):
    # the first call per GPU of a pass (a second one fetches the samples the first one counted)
    out, seen = [], set()
    for name, args in CALLS[since:]:
        if name == "nvmlDeviceGetProcessUtilization" and args[0] not in seen:
            seen.add(args[0])
            out.append(args[3])
    return out
t0 = time.time()
a = len(CALLS)
first = s.read()
t1 = time.time()
b = len(CALLS)
s.read()
print(json.dumps({"t": [t0, t1], "pass1": stamps(a), "pass2": stamps(b),
                  "graphics": LOOKUPS.count("nvmlDeviceGetGraphicsRunningProcesses_v3"),
                  "procs": len(first.processes), "problems": [list(p[:2]) for p in first.problems]}))
"""


def test_sampler_asks_only_for_newer_samples_and_once_for_what_is_missing(
        live_node: MakeLiveNode, tmp_path: Path) -> None:
    node = live_node(scenario_bundle(tmp_path, BUILTIN / "l40s-4x"))
    # a driver without graphics process queries: FUNCTION_NOT_FOUND, remembered after one try
    lacking = LiveNode(node.lib.without("nvmlDeviceGetGraphicsRunningProcesses_v3",
                                        "nvmlDeviceGetGraphicsRunningProcesses_v2"),
                       node.bundle, node.nvml_json, node.log, node.config)
    before = time.time()
    got = _run(lacking, SAMPLER)
    assert got["procs"] == 2 and got["problems"] == []
    assert got["pass1"] == [0, 0, 0, 0]  # nothing seen yet: every sample
    # GPU 0's processes have samples (stamped a moment before the call): the second pass asks for
    # newer ones only; the other GPUs had none and still ask for everything
    newest = got["pass2"][0]
    assert before * 1e6 - 2000 <= newest <= got["t"][1] * 1e6 and got["pass2"][1:] == [0, 0, 0]
    assert got["graphics"] == 4  # once per GPU, in the first pass only
