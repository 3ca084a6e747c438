"""Compute processes through the real pynvml: the _v3 struct in both driver layouts.

R535 added ``usedGpuCcProtectedMemory`` to the struct behind ``_v3`` without a version bump, so
an array's stride depends on the driver. The library writes the layout of the bundle's driver.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
from tests.nvml.conftest import LiveNode

from gpuslurm.hw.bundle import read_bundle
from gpuslurm.hw.nvml_replay import dump_replay

L40S = Path(__file__).parents[2] / "src" / "gpuslurm" / "hw" / "builtin" / "l40s-4x"
SAMPLE = """
import json
from gpuslurm.hw.nvml_sampler import NvmlSampler
r = NvmlSampler().read()
print(json.dumps(sorted([p.gpu_uuid, p.pid, p.mem_mib] for p in r.processes)))
"""
PROCS = {0: [(4242, 1000), (4343, 2000), (4444, 3000)], 2: [(5151, 512)]}


@pytest.mark.parametrize("driver_major", [
    530,
    pytest.param(535, marks=pytest.mark.xfail(
        strict=True, reason="nvidia-ml-py aliases c_nvmlProcessInfo_v3_t to the 24-byte v2 struct: "
                            "on R535+ layouts every process after the first is misread")),
])
def test_compute_processes(driver_major: int, live_node: Callable[[Path], LiveNode]) -> None:
    node = live_node(L40S)
    model = read_bundle(L40S)
    node.nvml_json.write_text(dump_replay(model, driver_major=driver_major, processes=PROCS))
    got = json.loads(node.python(SAMPLE))
    want = sorted([model.gpus[g].uuid, pid, float(mib)] for g, ps in PROCS.items() for pid, mib in ps)
    assert got == want
