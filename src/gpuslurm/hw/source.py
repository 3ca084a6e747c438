"""Where a node's facts come from: live NVML or a replayed capture bundle (:class:`HardwareSource`).

``--from SPEC`` (or the ``GPUSLURM_CAPTURE`` environment variable) names a bundle directory or a
capture shipped with gpuslurm (``builtin:dgx-h100`` or just ``dgx-h100``). Without either, NVML
is read; it is imported only then, so replaying works on machines without a driver.

Each entry point (a CLI command, the prolog, epilog and task prolog, PBS's hook events, the
monitor) turns its ``--from``/``GPUSLURM_CAPTURE`` and config into one :class:`HardwareSource`
with :func:`hardware_source` and passes that down; nothing below it resolves strings again.
"""

from __future__ import annotations

import os

from gpuslurm.errors import CaptureError, HardwareError
from gpuslurm.tuples import TYPE_CHECKING, NamedTuple  # typing is not imported on pick's path

if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import Any

    from gpuslurm.hw.model.node import Node

BUILTIN_PREFIX = "builtin:"
ENV_VAR = "GPUSLURM_CAPTURE"
NO_NVML_HINT = "no NVML here; use --from DIR or --from dgx-h100 to replay a capture"
_BUILTIN = os.path.join(os.path.dirname(os.path.abspath(__file__)), "builtin")


def __getattr__(name: str) -> Any:
    # BUILTIN_DIR (a Path) is made on first use: the hooks resolve bundles without pathlib.
    if name == "BUILTIN_DIR":
        from pathlib import Path

        return Path(_BUILTIN)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _builtin_root() -> str:
    # BUILTIN_DIR, when it was set on the module (a test pointing at its own captures)
    return str(globals().get("BUILTIN_DIR", _BUILTIN))


def builtin_names() -> list[str]:
    """Names of the captures shipped with gpuslurm, sorted."""
    root = _builtin_root()
    if not os.path.isdir(root):
        return []
    return sorted(name for name in os.listdir(root)
                  if not name.startswith((".", "_")) and os.path.isdir(os.path.join(root, name)))


def bundle_path(spec: str | None, environ: Mapping[str, str] | None = None) -> str | None:
    """The bundle directory ``spec`` names, or None for live NVML.

    ``spec`` None means ``GPUSLURM_CAPTURE`` of ``environ`` (default ``os.environ``). An existing
    path wins over a builtin of the same name; ``builtin:NAME`` is never a path.
    """
    label = "--from"
    if spec is None:
        spec = (os.environ if environ is None else environ).get(ENV_VAR) or None
        if spec is None:
            return None
        label = ENV_VAR
    names = builtin_names()
    known = f"builtin captures: {', '.join(names) or '(none installed)'}"
    if spec.startswith(BUILTIN_PREFIX):
        name = spec[len(BUILTIN_PREFIX):]
        if name not in names:
            raise CaptureError(f"no builtin capture {name!r}; {known}", f"{label} {spec}")
        return os.path.join(_builtin_root(), name)
    path = os.path.expanduser(spec)
    if os.path.isdir(path):
        return path
    if os.path.exists(path):
        raise CaptureError("is a file; a capture bundle is a directory", f"{label} {spec}")
    if spec in names:
        return os.path.join(_builtin_root(), spec)
    raise CaptureError(f"neither a capture directory nor a builtin capture; {known}", f"{label} {spec}")


def bundle_label(path: str) -> str:
    """How a bundle is named in ``Node.source``: ``builtin:dgx-h100``, else ``replay:<path>``."""
    parent, name = os.path.split(os.path.normpath(path))
    return f"builtin:{name}" if parent == os.path.normpath(_builtin_root()) else f"replay:{path}"


class HardwareSource(NamedTuple):
    """Where this process reads its node from: the capture bundle directory ``bundle`` (replay),
    or, when it is None, the live node through NVML (loaded from ``nvml_library``, "" = by name).

    Made once per entry point by :func:`hardware_source`; a value, so it is passed down freely.
    """

    bundle: str | None = None
    nvml_library: str = ""

    @property
    def replay(self) -> bool:
        return self.bundle is not None

    def describe(self) -> str:
        """What it is, for messages: ``replay of builtin:dgx-h100``, ``replay of /path``, ``NVML``."""
        if self.bundle is None:
            return "NVML"
        return f"replay of {bundle_label(self.bundle).removeprefix('replay:')}"

    def node(self, *, links: bool = True, cache_dir: str | None = None) -> Node:
        """The node: the bundle's (parsed, or from ``cache_dir``'s private cache, see
        :mod:`gpuslurm.hw.replay.bundlecache`), else NVML's (never cached).

        ``links=False``: the caller does not use the link matrix, so NVML is not asked for it (most
        of a live read's calls). ``Node.links`` is then None from every source, so code that needs
        links cannot come to rely on a bundle happening to carry them.
        """
        path = self.bundle
        if path is not None:
            if cache_dir is None:
                node = _read_bundle(path)
            else:
                from gpuslurm.hw.replay.bundlecache import cached_node

                node = cached_node(path, cache_dir, lambda: _read_bundle(path))
            return node if links else node._replace(links=None)
        from gpuslurm.hw.live.nvml import read_node  # lazy: replay must work where NVML is absent

        try:
            return read_node() if links else read_node(links=False)
        except HardwareError as exc:
            raise HardwareError(f"{exc}; {NO_NVML_HINT}") from exc

    def capabilities(self) -> dict[str, tuple[int, int]]:
        """:func:`load_capabilities` of this source."""
        return load_capabilities(self.bundle)


LIVE = HardwareSource()


def hardware_source(spec: str | None = None, *, nvml_library: str = "",
                    environ: Mapping[str, str] | None = None) -> HardwareSource:
    """The source ``spec`` names (``--from``: a bundle directory or builtin name); ``spec`` None
    means ``GPUSLURM_CAPTURE`` of ``environ`` (default ``os.environ``), and without it the live
    node, whose NVML is then loaded from ``nvml_library`` (``[paths] nvml_library``; "" = by name).
    A spec that names nothing is a CaptureError (exit code 2)."""
    path = bundle_path(spec, environ)
    if path is not None:
        return HardwareSource(path)
    if nvml_library:  # one NVML per process: chosen here, before any reader initialises it
        from gpuslurm.hw.live.nvml_lib import use_library

        use_library(nvml_library)
    return HardwareSource(None, nvml_library)


def load_node(spec: str | None, *, links: bool = True, cache_dir: str | None = None) -> Node:
    """``hardware_source(spec).node(...)``: a shorthand for scripts and tests; gpuslurm's own
    entry points make their :class:`HardwareSource` once and pass it down."""
    return hardware_source(spec).node(links=links, cache_dir=cache_dir)


def load_capabilities(bundle: str | None) -> dict[str, tuple[int, int]]:
    """Compute capability per GPU UUID: NVML's for the live node (``bundle`` None), else the
    bundle's ``nvml.json`` entries ({} without the file). What is missing falls back to the model
    table (:mod:`gpuslurm.hw.model.capability`); a malformed entry is a CaptureError."""
    if bundle is None:
        from gpuslurm.hw.live.nvml import compute_capabilities

        return compute_capabilities()
    path = os.path.join(bundle, "nvml.json")
    if not os.path.isfile(path):
        return {}
    from pathlib import Path

    from gpuslurm.hw.formats.nvml_json import read_capabilities

    return read_capabilities(Path(path))


def _read_bundle(path: str) -> Node:
    # Imported here: a live read never needs the capture parsers (smi XML, topo, lscpu).
    from pathlib import Path

    from gpuslurm.hw.replay.bundle import read_bundle

    node = read_bundle(Path(path))
    if (label := bundle_label(path)).startswith(BUILTIN_PREFIX):  # not a site-packages path
        node = node._replace(source=label)
    return node
