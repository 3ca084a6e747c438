"""Read and write ``mig-minors``, the driver's table of MIG capability device minors.

The NVIDIA driver publishes ``/proc/driver/nvidia-caps/mig-minors``; each line names a capability
and the minor of its ``/dev/nvidia-caps/nvidia-cap<minor>`` file::

    config 1
    monitor 2
    gpu0/gi0/access 3
    gpu0/gi0/ci0/access 4

The ``gpuN`` there is the GPU's device minor number (the N of ``/dev/nvidiaN``), not its NVML
index. Slurm 22.05's AutoDetect=nvml looks the entry up by NVML index instead, so it picks the
wrong capability files on machines where minor ≠ index; gpuslurm keys by minor.
"""

from __future__ import annotations

import re
from pathlib import Path

from gpuslurm.errors import CaptureError
from gpuslurm.ranges import MAX_GPUS, bounded_int

MINOR_MAX = (1 << 20) - 1  # Linux minor numbers are 20 bits

MigKey = tuple[int, int, int | None]  # (GPU minor, GI id, CI id or None for the GI itself)

_LINE_RE = re.compile(r"^gpu(?P<gpu>\d+)/gi(?P<gi>\d+)(?:/ci(?P<ci>\d+))?/access\s+(?P<minor>\d+)$")
_GLOBAL_RE = re.compile(r"^(?:config|monitor)\s+\d+$")

# The driver's fixed layout: 15 GPU instances per GPU, 8 compute instances per GPU instance.
GI_PER_GPU = 15
CI_PER_GI = 8
FIRST_MINOR = 3


def parse_mig_minors(text: str, source: str | Path) -> dict[MigKey, int]:
    """Map (GPU minor, GI, CI or None) to the capability minor."""
    out: dict[MigKey, int] = {}
    for lineno, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or _GLOBAL_RE.match(line):
            continue
        m = _LINE_RE.match(line)
        if m is None:
            raise CaptureError(f"line {lineno} is not a MIG capability entry: {line[:60]!r}", source)
        ci = m.group("ci")
        try:
            key = (bounded_int(m.group("gpu"), MAX_GPUS), bounded_int(m.group("gi"), MAX_GPUS),
                   None if ci is None else bounded_int(ci, MAX_GPUS))
            minor = bounded_int(m.group("minor"), MINOR_MAX)
        except ValueError as exc:
            raise CaptureError(f"line {lineno}: {exc}", source) from None
        if key in out:
            raise CaptureError(f"line {lineno} repeats {line.split()[0]}", source)
        out[key] = minor
    return out


def mig_minors_text(gpu_count: int) -> str:
    """The file the driver writes for GPU minors ``0..gpu_count-1`` (for authoring bundles)."""
    lines = ["config 1", "monitor 2"]
    minor = FIRST_MINOR
    for gpu in range(gpu_count):
        for gi in range(GI_PER_GPU):
            lines.append(f"gpu{gpu}/gi{gi}/access {minor}")
            minor += 1
            for ci in range(CI_PER_GI):
                lines.append(f"gpu{gpu}/gi{gi}/ci{ci}/access {minor}")
                minor += 1
    return "\n".join(lines) + "\n"
