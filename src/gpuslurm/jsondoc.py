"""Every ``--json`` output is one object naming its shape: ``schema`` first, ``node`` for a node.

``schema`` is ``gpuslurm.<name>.v<N>``; N grows only when a field is removed, renamed or changes
type (new fields are added without a new version). The JSON Schema of each shape is
``gpuslurm/schemas/<name>.json`` in the package (``schema_path``); tests/cli/test_json_schemas.py
checks each command's real output against it. An output about one node names it ``node`` (Slurm's
NodeName, the bundle's node for a replayed capture); outputs about many nodes (the fair-share
report, hogs from the shared violations directory) carry ``node`` in each row instead.
"""

from __future__ import annotations

import os

TYPE_CHECKING = False  # mypy takes any name TYPE_CHECKING as true; only typing's costs an import
if TYPE_CHECKING:
    from typing import Any

# name -> version; one line per --json output (tests/cli/test_json_schemas.py finds each command's)
VERSIONS = {
    "discover": 1,  # gpuslurm discover --json
    "topo": 1,  # gpuslurm topo --json
    "mig-show": 1,  # gpuslurm mig show --json
    "gpu-list": 1,  # gpuslurm gpu list --json
    "health": 1,  # gpuslurm health --json
    "status": 1,  # gpuslurm status --json
    "monitor-cycle": 1,  # gpuslurm monitor --json, one object per line
    "placement": 1,  # gpuslurm placement --json
    "pick": 1,  # gpuslurm pick --format json
    "hogs": 1,  # gpuslurm hogs --json
    "throttle-list": 1,  # gpuslurm throttle list --json
    "fairshare-report": 1,  # gpuslurm fairshare-report --format json
    "jobstats": 1,  # gpuslurm jobstats JOBID --json
}


def schema_id(name: str) -> str:
    """The ``schema`` value of the output ``name``: ``gpuslurm.<name>.v<N>``."""
    return f"gpuslurm.{name}.v{VERSIONS[name]}"


def document(name: str, body: dict[str, Any], node: str | None = None) -> dict[str, Any]:
    """``body`` as the output ``name``: ``schema`` first, then ``node`` when given, then ``body``."""
    head: dict[str, Any] = {"schema": schema_id(name)}
    if node is not None:
        head["node"] = node
    return head | {k: v for k, v in body.items() if k not in head}


def schema_path(name: str) -> str:
    """The JSON Schema file of the output ``name``, shipped in the package."""
    if name not in VERSIONS:
        raise KeyError(name)
    return os.path.join(os.path.dirname(__file__), "schemas", f"{name}.json")
