"""``gpuslurm pick``'s decisions (pure, no I/O): the devices' state from what was read, and the
request checked against the node before the engine ranks anything.

The reading itself (NVML or a replayed scenario, /proc, the out-of-service record, the monitor's
store) is :mod:`gpuslurm.watch.pick`'s; this module only turns its values into
:class:`~gpuslurm.place.engine.DeviceState`. On pick's hot path: nothing heavy is imported here.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping

from gpuslurm.errors import InputError
from gpuslurm.place.engine import DeviceState, devices_of
from gpuslurm.tuples import TYPE_CHECKING  # not typing's: see gpuslurm.tuples

if TYPE_CHECKING:
    from gpuslurm.hw.model.node import Node
    from gpuslurm.place.request import Request
    from gpuslurm.samples import Reading
    from gpuslurm.state.out_of_service import OutOfService
    from gpuslurm.state.store import GpuStats

WINDOW_S = 60.0  # the load window read from the monitor's store


def reading_states(node: Node, reading: Reading, is_mine: Callable[[int], bool]) -> dict[str, DeviceState]:
    """Per device (lower-case UUID): load from one ``reading``, processes that are not ``is_mine``
    counted as foreign; a lost GPU, or one the reading does not mention, is not healthy."""
    foreign: dict[str, int] = {}
    for p in reading.processes:
        if is_mine(p.pid):
            continue
        for key in {p.gpu_uuid.lower(), (p.mig_uuid or p.gpu_uuid).lower()}:
            foreign[key] = foreign.get(key, 0) + 1
    states: dict[str, DeviceState] = {}
    for d in reading.devices:
        key = (d.mig_uuid or d.gpu_uuid).lower()
        states[key] = DeviceState(d.util_pct, d.mem_used_mib or 0.0, foreign.get(key, 0))
    for kind, subject, detail in reading.problems:
        if kind == "gpu-lost":
            states[subject.lower()] = DeviceState(healthy=False, problem=detail)
    for g in node.gpus:  # a GPU NVML did not report at all is not healthy
        if g.uuid.lower() not in states:
            states[g.uuid.lower()] = DeviceState(healthy=False, problem="no reading from the GPU")
    return states


def out_of_service_states(node: Node, states: Mapping[str, DeviceState],
                          out: Mapping[str, OutOfService]) -> dict[str, DeviceState]:
    """``states`` with the GPUs of the out-of-service record ``out``, and their MIG devices, unhealthy."""
    marked = dict(states)
    for g in node.gpus:
        if g.uuid in out:
            why = f"out of service: {out[g.uuid].reason}"
            for key in [g.uuid, *(m.uuid for m in g.mig_devices if m.uuid)]:
                marked[key.lower()] = DeviceState(healthy=False, problem=why)
    return marked


def window_uuids(node: Node) -> list[str]:
    """The devices whose load window the store is asked for: every GPU, then every MIG device."""
    return [g.uuid for g in node.gpus] + [m.uuid for g in node.gpus for m in g.mig_devices if m.uuid]


def with_window(states: Mapping[str, DeviceState], stats: Mapping[str, GpuStats]) -> dict[str, DeviceState]:
    """``states`` with each device's mean utilisation and peak memory over the store's window."""
    out = dict(states)
    for uuid, stat in stats.items():
        st = out.get(uuid.lower(), DeviceState())
        out[uuid.lower()] = st._replace(window_util_pct=stat.util_mean_pct, window_mem_mib=stat.mem_peak_mib)
    return out


def check_request(node: Node, req: Request, allowed: Iterable[str] | None) -> None:
    """Bad input the engine would only report as 'nothing satisfies': an InputError (exit 2)."""
    if req.mig_profile is not None:
        profiles = sorted({m.profile for g in node.gpus if g.mig_mode for m in g.mig_devices})
        if req.mig_profile not in profiles:
            raise InputError(f"no MIG device of profile {req.mig_profile!r} on {node.hostname} "
                             f"(profiles: {', '.join(profiles) or 'none, MIG is off'})", "--mig")
    total = len(devices_of(node, req.mig_profile, allowed))
    kind = f"{req.mig_profile} MIG devices" if req.mig_profile else "GPUs"
    if req.n > total:
        where = "the job holds" if allowed is not None else f"{node.hostname} has"
        extra = ("" if req.mig_profile or not any(g.mig_mode for g in node.gpus)
                 else "; GPUs in MIG mode count only with --mig")
        raise InputError(f"{req.n} {kind} wanted but {where} {total}{extra}")
