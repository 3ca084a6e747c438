"""A driver without an entry point: the symbol is absent, pynvml reports FUNCTION_NOT_FOUND."""

from __future__ import annotations

import json
from pathlib import Path

from tests.helpers.nvml_replay import NODE_DUMP, LiveNode, MakeLiveNode, exported_symbols

from gpuslurm.hw.replay.bundle import read_bundle

L40S = Path(__file__).parents[3] / "src" / "gpuslurm" / "hw" / "builtin" / "l40s-4x"


def test_the_library_exports_the_versioned_names_pynvml_resolves() -> None:
    names = set(exported_symbols())
    assert {"nvmlInit_v2", "nvmlInitWithFlags", "nvmlDeviceGetCount_v2", "nvmlDeviceGetHandleByIndex_v2",
            "nvmlDeviceGetPciInfo_v3", "nvmlDeviceGetMemoryInfo", "nvmlDeviceGetMemoryInfo_v2",
            "nvmlDeviceGetComputeRunningProcesses_v3"} <= names


def test_old_driver_without_cuda_version_v2_falls_back(live_node: MakeLiveNode) -> None:
    node = live_node(L40S)
    old = LiveNode(node.lib.without("nvmlSystemGetCudaDriverVersion_v2", "nvmlDeviceGetMigMode"),
                   node.bundle, node.nvml_json, node.log, node.config)
    live = json.loads(old.python(NODE_DUMP))
    assert live["cuda_version"] == read_bundle(L40S).cuda_version
    assert [g["mig_mode"] for g in live["gpus"]] == [None] * 4  # FUNCTION_NOT_FOUND is "not supported"
    probe = old.python("import pynvml as n\nn.nvmlInit()\n"
                       "try:\n n.nvmlDeviceGetMigMode(n.nvmlDeviceGetHandleByIndex(0))\n"
                       "except n.NVMLError as e:\n print(e.value)\n")
    assert probe.strip() == "13"  # NVML_ERROR_FUNCTION_NOT_FOUND
