"""NvmlSampler against a stand-in pynvml that also answers the live-sampling calls.

What the replay library serves through the real pynvml is tested there (tests/hw/nvml:
test_scenario.py reads GPUs, MIG devices, processes and a lost GPU live vs replayed,
test_processes.py every process-list layout, test_calls.py the timestamps the sampler asks for
and that a query the driver lacks is asked once). What stays here only a stand-in can express:
a sample out of range (the library serves none), and calls failing with an injected error or no
driver at all.
"""

from __future__ import annotations

from typing import Any

from tests.helpers.fakes import fake_pynvml as fp
from tests.helpers.fakes.fake_pynvml import SamplingNvml

from gpuslurm.hw.live.nvml_sampler import NvmlSampler
from gpuslurm.samples import GpuSample, ProcessReading


def _two_gpus(**kw: Any) -> SamplingNvml:
    gpus = fp.dgx_h100()[:2]
    return SamplingNvml(gpus=[dict(g) for g in gpus], **kw)


def test_a_pass_reads_every_gpu_and_process() -> None:
    nvml = _two_gpus(activity={
        0: {"util": 97, "used_mib": 6000, "power_mw": 312500, "temp": 64,
            "procs": [(100, 5000, None), (101, None, None)],
            "samples": [(100, 10, 40), (100, 20, 85), (101, 15, 255)]},
        1: {"util": 0, "used_mib": 0, "power_mw": 70000, "temp": 30}})
    sampler = NvmlSampler(nvml)
    r = sampler.read()
    assert r.devices == (GpuSample(0.0, fp.uuid(0), None, 97.0, 6000.0, 81559.0, 312.5, 64.0),
                         GpuSample(0.0, fp.uuid(1), None, 0.0, 0.0, 81559.0, 70.0, 30.0))
    # the newest sample per PID; an out-of-range value (255) is "unknown", not 255 %
    assert r.processes == (ProcessReading(100, fp.uuid(0), None, 5000.0, 85.0),
                           ProcessReading(101, fp.uuid(0), None, None, None))
    assert r.problems == ()


def test_a_lost_gpu_and_a_failing_call_cost_only_their_gpu() -> None:
    quiet = {"util": 5, "power_mw": 1, "temp": 1}
    nvml = _two_gpus(activity={0: quiet, 1: dict(quiet)})
    sampler = NvmlSampler(nvml)
    assert len(sampler.read().devices) == 2
    nvml.gpus[1]["lost"] = True
    r = sampler.read()
    assert [d.gpu_uuid for d in r.devices] == [fp.uuid(0)]
    assert [(k, s) for k, s, _ in r.problems] == [("gpu-lost", fp.uuid(1))]
    nvml.gpus[1]["lost"] = False
    nvml.errors["nvmlDeviceGetTemperature"] = fp.NVML_ERROR_UNKNOWN
    r = sampler.read()
    assert r.devices == () and {k for k, _, _ in r.problems} == {"nvml-error"}


def test_no_driver_is_an_error_for_the_monitor_to_record() -> None:
    import pytest

    from gpuslurm.errors import HardwareError

    with pytest.raises(HardwareError, match="NVML is not available"):
        NvmlSampler(_two_gpus(init_error=fp.NVML_ERROR_DRIVER_NOT_LOADED)).read()
