"""Per-GPU health facts for the hooks' health gate and the monitor: from NVML, or replayed.

A live node's come from NVML (:mod:`gpuslurm.hw.live.nvml_health`); a replayed node's
(``--from``/``GPUSLURM_CAPTURE``) from ``health.json`` beside the bundle's other files
(:mod:`gpuslurm.hw.formats.health_json`), with the bundle's replay scenario's timed faults over
them (:mod:`gpuslurm.hw.replay.health`). The facts themselves: :mod:`gpuslurm.hw.model.health`.
"""

from __future__ import annotations

from collections.abc import Sequence

from gpuslurm.hw.live.nvml_health import NvmlHealthReader
from gpuslurm.hw.model.health import GpuHealth
from gpuslurm.tuples import TYPE_CHECKING  # typing is not imported on the hooks' path

if TYPE_CHECKING:
    from gpuslurm.hw.model.node import Gpu
    from gpuslurm.hw.source import HardwareSource


def read_health(gpus: Sequence[Gpu], source: HardwareSource, *,
                captured: bool = False) -> dict[str, GpuHealth]:
    """Health of ``gpus`` (physical GPUs) keyed by UUID, from ``source``'s bundle or NVML.

    ``captured``: a GPU's temperature that ``health.json`` does not give is the one the bundle's
    ``nvidia-smi -q -x`` recorded, as the replay NVML library serves it (the commands and the
    monitor; the hooks read ``health.json`` alone and stay free of the XML parser).
    """
    bundle = source.bundle
    if bundle is None:
        return NvmlHealthReader().read(gpus)
    from gpuslurm.hw.replay.health import bundle_health  # the replay side only when replaying

    return bundle_health(bundle, [g.uuid for g in gpus], lambda: source.node(links=False),
                         captured=captured)
