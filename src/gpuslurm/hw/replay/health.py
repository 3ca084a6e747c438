"""A replayed node's health facts: the bundle's ``health.json`` with its replay scenario's
timed faults laid over them (:func:`gpuslurm.hw.replay.scenario.health_at`).

No ``health.json`` means nothing is known.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

from gpuslurm.errors import CaptureError
from gpuslurm.hw.formats.health_json import parse_scenario
from gpuslurm.hw.model.health import GpuHealth
from gpuslurm.safedir import read_regular
from gpuslurm.tuples import TYPE_CHECKING  # typing is not imported on the hooks' path

if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

    from gpuslurm.hw.model.node import Node

SCENARIO_FILE = "health.json"
MAX_SCENARIO_BYTES = 1 << 20


def bundle_health(bundle: str, uuids: Sequence[str], node_of: Callable[[], Node], *,
                  captured: bool = False) -> dict[str, GpuHealth]:
    """Health of the GPUs ``uuids`` of the bundle ``bundle`` (``node_of``: its node, read when needed).

    ``captured``: a GPU's temperature that ``health.json`` does not give is the one the bundle's
    ``nvidia-smi -q -x`` recorded, as the replay NVML library serves it.
    """
    facts = read_scenario(os.path.join(bundle, SCENARIO_FILE), uuids)
    if captured:
        facts = _captured_temperatures(bundle, node_of, facts)
    return _timed(bundle, node_of, facts)


def _captured_temperatures(bundle: str, node_of: Callable[[], Node],
                           facts: dict[str, GpuHealth]) -> dict[str, GpuHealth]:
    import math  # not at the top: the hooks' warm path imports this module (test_placement_cache)
    from pathlib import Path

    from gpuslurm.hw.replay.bundle import read_captured_state

    node = _nodes.get(bundle) or _nodes.setdefault(bundle, node_of())
    state = read_captured_state(Path(bundle), node)
    temps = {d.gpu_uuid: d.temp_c for d in state.devices if d.mig_uuid is None} if state else {}
    out = {}
    for uuid, fact in facts.items():
        temp = temps.get(uuid)
        if fact.temperature_c is None and not fact.lost and temp is not None:
            fact = fact._replace(temperature_c=math.floor(temp + 0.5))  # NVML's whole degrees
        out[uuid] = fact
    return out


def _timed(bundle: str, node_of: Callable[[], Node], facts: dict[str, GpuHealth]) -> dict[str, GpuHealth]:
    """``facts`` with the replay scenario's timed faults now (Xids, ECC, temperature, lost GPUs),
    when the bundle has a scenario (:func:`gpuslurm.hw.replay.scenario.health_at`)."""
    if not os.environ.get("GPUSLURM_SCENARIO") and not os.path.isfile(os.path.join(bundle, "scenario.json")):
        return facts  # the hooks' usual case: nothing heavy imported (tests/hooks/test_cache.py)
    from pathlib import Path

    from gpuslurm.hw.replay.scenario import health_at, load_scenario, scenario_path

    path = scenario_path(Path(bundle))
    if path is None:
        return facts
    import time

    try:
        st = os.stat(path)
    except OSError as exc:
        raise CaptureError(f"cannot read: {exc.strerror}", source=path) from None
    # the monitor reads health every cycle: parse the bundle once, the scenario when it changes
    stamp = (str(path), st.st_mtime_ns, st.st_size, st.st_ino)
    cached = _scenarios.get(bundle)
    if cached is None or cached[0] != stamp:
        node = _nodes.get(bundle) or _nodes.setdefault(bundle, node_of())
        cached = _scenarios[bundle] = (stamp, *load_scenario(path, node))
    return health_at(cached[1], cached[2], time.time(), facts)


_nodes: dict[str, Any] = {}  # bundle path -> Node
_scenarios: dict[str, tuple[tuple[str, int, int, int], Any, float]] = {}  # bundle -> (stamp, Scenario, start)


def read_scenario(path: str | os.PathLike[str], uuids: Sequence[str]) -> dict[str, GpuHealth]:
    """Facts for ``uuids`` from a ``health.json`` scenario; all unknown when the file is absent."""
    try:
        data = read_regular(os.fspath(path), MAX_SCENARIO_BYTES)  # a FIFO here hung the prolog
    except FileNotFoundError:
        return {u: GpuHealth(u) for u in uuids}
    except OSError as exc:
        raise CaptureError(f"cannot read: {exc.strerror}", source=path) from None
    return parse_scenario(data.decode("utf-8", "replace"), os.fspath(path), uuids)
