"""Compute processes through the real pynvml on every process-list layout a driver has written.

R535 drivers before 535.98 write 32-byte entries behind ``_v3`` (``usedGpuCcProtectedMemory``,
added without a version bump), 535.98 dropped ``_v3``, 535.104 restored it with 24-byte entries
and added the versioned detail list, and R545 and later keep that (``conftest.driver_lacks``).
nvidia-ml-py reads every ``_v3`` list with a 24-byte stride, so gpuslurm reads process lists
itself (``NvmlLibrary.running_processes``). The library serves the layout and the entry points
of the driver version it is given.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tests.helpers.nvml_replay import MakeLiveNode

from gpuslurm.hw.replay.bundle import read_bundle

L40S = Path(__file__).parents[3] / "src" / "gpuslurm" / "hw" / "builtin" / "l40s-4x"
SAMPLE = """
import json
from gpuslurm.hw.live.nvml_sampler import NvmlSampler
r = NvmlSampler().read()
print(json.dumps(sorted([p.gpu_uuid, p.pid, p.mem_mib] for p in r.processes)))
"""
HEALTH = """
import json
from gpuslurm.hw.live.nvml_health import NvmlHealthReader
from gpuslurm.hw.live.nvml import read_node
h = NvmlHealthReader().read(read_node(links=False).gpus)
print(json.dumps(sorted([u, p.pid, p.used_mib] for u, g in h.items() for p in g.processes or ())))
"""
PYNVML = """
import json, pynvml as n
n.nvmlInit()
print(json.dumps([[p.pid, p.usedGpuMemory] for p in
                  n.nvmlDeviceGetComputeRunningProcesses_v3(n.nvmlDeviceGetHandleByIndex(0))]))
"""
PROCS = {0: [(4242, 1000), (4343, 2000), (4444, 3000)], 2: [(5151, 512)]}
DRIVERS = [
    pytest.param("530.41.03", id="r530-v3-24-bytes"),
    pytest.param("535.54.03", id="r535-early-v3-32-bytes"),
    pytest.param("535.98", id="r535-98-v2-only"),
    pytest.param("535.161.08", id="r535-late-v3-24-bytes"),
    pytest.param("545.29.06", id="r545-v3-24-bytes"),
    pytest.param("590.48.01", id="r590-v3-24-bytes"),
]


def _want(reader_mib: type) -> list[list[object]]:
    model = read_bundle(L40S)
    return sorted([model.gpus[g].uuid, pid, reader_mib(mib)] for g, ps in PROCS.items() for pid, mib in ps)


@pytest.mark.parametrize("driver", DRIVERS)
def test_sampler_reads_every_process(driver: str, live_node: MakeLiveNode) -> None:
    node = live_node(L40S, driver_version=driver, processes=PROCS)
    assert json.loads(node.python(SAMPLE)) == _want(float)


@pytest.mark.parametrize("driver", DRIVERS)
def test_health_reads_every_process(driver: str, live_node: MakeLiveNode) -> None:
    node = live_node(L40S, driver_version=driver, processes=PROCS)
    assert json.loads(node.python(HEALTH)) == _want(int)


def test_pynvml_itself_misreads_the_r535_layout(live_node: MakeLiveNode) -> None:
    """Why gpuslurm does not use nvidia-ml-py's process queries: on 535.54 they misread entries."""
    node = live_node(L40S, driver_version="535.54.03", processes=PROCS)
    got = json.loads(node.python(PYNVML))
    assert [pid for pid, _ in got] != [4242, 4343, 4444]
    node = live_node(L40S, driver_version="590.48.01", processes=PROCS)
    assert json.loads(node.python(PYNVML)) == [[4242, 1000 << 20], [4343, 2000 << 20], [4444, 3000 << 20]]


WRONG_LAYOUT = """
import json
from gpuslurm.hw.live import nvml_lib
# the deliberate mistake: always nvidia-ml-py's 24-byte struct behind _v3
nvml_lib.NvmlLibrary._processes_abi = lambda self: ("_v3", nvml_lib._ProcessInfo)
from gpuslurm.hw.live.nvml_sampler import NvmlSampler
r = NvmlSampler().read()
print(json.dumps(sorted([p.gpu_uuid, p.pid, p.mem_mib] for p in r.processes)))
"""


def test_reading_the_wrong_layout_is_caught(live_node: MakeLiveNode) -> None:
    """The tests above can fail: a backend reading R535's list with the 24-byte stride misreads it."""
    node = live_node(L40S, driver_version="535.54.03", processes=PROCS)
    assert json.loads(node.python(WRONG_LAYOUT)) != _want(float)


def test_pynvml_itself_finds_no_v3_on_535_98(live_node: MakeLiveNode) -> None:
    """nvidia-ml-py's unversioned process query is _v3 only: on 535.98 (no _v3 until 535.104) it
    raises an exception that is not even an NVMLError (gpuslurm reads _v2 there, and would call
    it not supported)."""
    node = live_node(L40S, driver_version="535.98", processes=PROCS)
    probe = node.python("import pynvml as n\nn.nvmlInit()\ntry:\n"
                        " n.nvmlDeviceGetComputeRunningProcesses(n.nvmlDeviceGetHandleByIndex(0))\n"
                        "except Exception as e:\n print(type(e).__name__, isinstance(e, n.NVMLError))\n")
    assert probe.strip() == "NVMLLibraryMismatchError False"
    probe = node.python("from gpuslurm.errors import NotSupported\n"
                        "from gpuslurm.hw.live.nvml_lib import NvmlLibrary\n"
                        "lib = NvmlLibrary()\nh = lib.call('nvmlDeviceGetHandleByIndex', 0)\ntry:\n"
                        " lib.call('nvmlDeviceGetComputeRunningProcesses', h)\nexcept NotSupported as e:\n"
                        " print('not supported')\n")
    assert probe.strip() == "not supported"
