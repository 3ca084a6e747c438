"""Choose where a command's node facts come from: live NVML or a capture bundle.

``--from SPEC`` (or the ``GPUSLURM_CAPTURE`` environment variable) names a bundle directory or a
capture shipped with gpuslurm (``builtin:dgx-h100`` or just ``dgx-h100``). Without either, NVML
is read; it is imported only then, so replaying works on machines without a driver.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

from gpuslurm.errors import CaptureError, HardwareError
from gpuslurm.hw.bundle import read_bundle
from gpuslurm.hw.model import Node

BUILTIN_DIR = Path(__file__).parent / "builtin"
BUILTIN_PREFIX = "builtin:"
ENV_VAR = "GPUSLURM_CAPTURE"
NO_NVML_HINT = "no NVML here; use --from DIR or --from dgx-h100 to replay a capture"


def builtin_names() -> list[str]:
    """Names of the captures shipped with gpuslurm, sorted."""
    if not BUILTIN_DIR.is_dir():
        return []
    return sorted(p.name for p in BUILTIN_DIR.iterdir()
                  if p.is_dir() and not p.name.startswith((".", "_")))


def resolve_source(spec: str | None) -> Path | None:
    """The bundle directory ``spec`` names, or None for live NVML.

    An existing path wins over a builtin of the same name; ``builtin:NAME`` is never a path.
    """
    label = "--from"
    if spec is None:
        spec = os.environ.get(ENV_VAR) or None
        if spec is None:
            return None
        label = ENV_VAR
    names = builtin_names()
    known = f"builtin captures: {', '.join(names) or '(none installed)'}"
    if spec.startswith(BUILTIN_PREFIX):
        name = spec[len(BUILTIN_PREFIX):]
        if name not in names:
            raise CaptureError(f"no builtin capture {name!r}; {known}", f"{label} {spec}")
        return BUILTIN_DIR / name
    path = Path(spec).expanduser()
    if path.is_dir():
        return path
    if path.exists():
        raise CaptureError("is a file; a capture bundle is a directory", f"{label} {spec}")
    if spec in names:
        return BUILTIN_DIR / spec
    raise CaptureError(f"neither a capture directory nor a builtin capture; {known}", f"{label} {spec}")


def load_node(spec: str | None) -> Node:
    """The node described by ``spec`` (see resolve_source), or the live one from NVML."""
    path = resolve_source(spec)
    if path is not None:
        node = read_bundle(path)
        if path.parent == BUILTIN_DIR:  # say "builtin:dgx-h100", not a site-packages path
            node = dataclasses.replace(node, source=f"builtin:{path.name}")
        return node
    from gpuslurm.hw.nvml import read_node  # lazy: replay must work where NVML is absent

    try:
        return read_node()
    except HardwareError as exc:
        raise HardwareError(f"{exc}; {NO_NVML_HINT}") from exc
