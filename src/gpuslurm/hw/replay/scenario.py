"""The replay scenario at work: which step is in force, what NVML would report then, the faults
it lays over ``health.json``'s facts, and the monitor's sampler that re-reads the file.

The file's format and its parser: :mod:`gpuslurm.hw.formats.scenario`.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from gpuslurm.errors import CaptureError
from gpuslurm.hw.formats.scenario import Scenario, Step, decode, parse_scenario
from gpuslurm.hw.model.node import Node
from gpuslurm.safedir import read_regular
from gpuslurm.samples import GpuSample, Reading

if TYPE_CHECKING:
    from gpuslurm.hw.model.health import GpuHealth

ENV_VAR = "GPUSLURM_SCENARIO"
FILE_NAME = "scenario.json"
MAX_BYTES = 4 << 20
_UNSET = GpuSample(0.0, "")


def scenario_path(bundle: Path | None, environ: dict[str, str] | None = None) -> Path | None:
    """The scenario file to replay, or None when there is none."""
    env = os.environ if environ is None else environ
    named = env.get(ENV_VAR)
    if named:
        path = Path(named)
        if path.is_dir():
            path = path / FILE_NAME
        if not path.is_file():
            raise CaptureError("no such scenario file", source=f"{ENV_VAR}={named}")
        return path
    if bundle is not None and (bundle / FILE_NAME).is_file():
        return bundle / FILE_NAME
    return None


def load_scenario(path: Path, node: Node) -> tuple[Scenario, float]:
    """Read and parse ``path``; the scenario and the Unix time its steps count from."""
    try:
        data = read_regular(str(path), MAX_BYTES)
        mtime = os.stat(path).st_mtime
    except OSError as exc:
        raise CaptureError(f"cannot read: {exc.strerror}", source=path) from None
    scenario = parse_scenario(decode(data, str(path)), str(path), node)
    return scenario, scenario.start if scenario.start is not None else mtime


def step_at(scenario: Scenario, start: float, now: float) -> Step | None:
    """The step in force at ``now``, or None before the first one begins."""
    current = None
    for step in scenario.steps:
        if start + step.at > now:
            break
        current = step
    return current


def health_at(scenario: Scenario, start: float, now: float,
              facts: Mapping[str, GpuHealth]) -> dict[str, GpuHealth]:
    """``facts`` (by GPU UUID, e.g. ``health.json``'s) with the scenario's faults at ``now``: every
    Xid logged so far, the ECC count in force, the step's temperature, a GPU off the bus (then
    nothing else is known, as NVML answers GPU_IS_LOST to everything)."""
    step = step_at(scenario, start, now)
    past = [s for s in scenario.steps if start + s.at <= now]
    out: dict[str, GpuHealth] = {}
    for uuid, fact in facts.items():
        key = uuid.lower()
        if fact.lost or (step is not None and key in step.lost):
            out[uuid] = type(fact)(fact.uuid, lost=True)
            continue
        xids = [code for s in past for gpu, _, code in s.xids if gpu.lower() == key]
        ecc = fact.ecc_uncorrectable
        if ecc is None and any(gpu.lower() == key for s in scenario.steps for gpu, _ in s.ecc):
            ecc = 0  # ECC is on: nothing counted before the step that says so
        for s in past:
            ecc = next((n for gpu, n in s.ecc if gpu.lower() == key), ecc)
        temp = fact.temperature_c
        sample = step.gpus.get(key) if step is not None else None
        if sample is not None and sample.temp_c is not None:
            temp = math.floor(sample.temp_c + 0.5)  # as the library rounds it (lround)
        out[uuid] = fact._replace(xid=tuple(dict.fromkeys((*fact.xid, *xids))), ecc_uncorrectable=ecc,
                                  temperature_c=temp)
    return out


def readings(node: Node, step: Step | None, now: float = 0.0, captured: Reading | None = None) -> Reading:
    """What NVML would report for ``node`` in ``step``, stamped ``now``.

    ``captured`` is the state the bundle's capture recorded (:mod:`gpuslurm.hw.formats.smi_state`): with
    no step in force (None) it is the node's state; a step sets what it names and leaves the rest
    as captured (utilisation, temperature, power; the processes until a step lists its own, and
    memory used while they are the capture's). Without either: idle, no processes.
    """
    gpus = step.gpus if step is not None else {}
    was = {(d.mig_uuid or d.gpu_uuid).lower(): d for d in (captured.devices if captured else ())}
    lost = {g.uuid for g in node.gpus if step is not None and g.uuid.lower() in step.lost}
    listed = step is not None and step.procs is not None
    if step is not None and step.procs is not None:
        procs = step.procs
    else:
        procs = captured.processes if captured is not None else ()
    procs = tuple(p for p in procs if p.gpu_uuid not in lost)
    # NVML has no utilisation, whole or per process, on a GPU in MIG mode (nvidia-smi: N/A)
    mig_mode = {g.uuid for g in node.gpus if g.mig_mode}
    procs = tuple(p._replace(sm_util_pct=None) if p.gpu_uuid in mig_mode else p for p in procs)
    used: dict[str, float] = {}
    for p in procs:
        key = (p.mig_uuid or p.gpu_uuid).lower()
        used[key] = used.get(key, 0.0) + (p.mem_mib or 0.0)
        if p.mig_uuid:
            used[p.gpu_uuid.lower()] = used.get(p.gpu_uuid.lower(), 0.0) + (p.mem_mib or 0.0)
    devices: list[GpuSample] = []
    problems: list[tuple[str, str, str]] = []
    for g in node.gpus:
        if g.uuid in lost:
            problems.append(("gpu-lost", g.uuid, "the scenario says the GPU fell off the bus"))
            continue
        st = _over(gpus.get(g.uuid.lower(), _UNSET), was.get(g.uuid.lower()), listed)
        devices.append(GpuSample(
            now, g.uuid, None,
            None if g.mig_mode else st.util_pct if st.util_pct is not None else 0.0,
            st.mem_used_mib if st.mem_used_mib is not None else used.get(g.uuid.lower(), 0.0),
            float(g.memory_mib), st.power_w, st.temp_c))
        for m in g.mig_devices if g.mig_mode else ():
            if not m.uuid:
                continue
            ms = _over(gpus.get(m.uuid.lower(), _UNSET), was.get(m.uuid.lower()), listed)
            devices.append(GpuSample(
                now, g.uuid, m.uuid, ms.util_pct,  # NVML gives no utilisation for a MIG device
                ms.mem_used_mib if ms.mem_used_mib is not None else used.get(m.uuid.lower(), 0.0),
                float(m.memory_mib)))
    return Reading(tuple(devices), procs, tuple(problems))


def _over(step: GpuSample, captured: GpuSample | None, listed: bool) -> GpuSample:
    """A step's values over the captured ones; memory used stays the capture's only while the
    processes are (a step that lists processes makes it theirs)."""
    if captured is None:
        return step
    return step._replace(
        util_pct=step.util_pct if step.util_pct is not None else captured.util_pct,
        mem_used_mib=step.mem_used_mib if step.mem_used_mib is not None or listed else captured.mem_used_mib,
        power_w=step.power_w if step.power_w is not None else captured.power_w,
        temp_c=step.temp_c if step.temp_c is not None else captured.temp_c)


class ScenarioSampler:
    """The replay counterpart of :class:`gpuslurm.hw.live.nvml_sampler.NvmlSampler`."""

    def __init__(self, node: Node, path: Path | None, captured: Reading | None = None) -> None:
        self.node = node
        self.path = path
        self.captured = captured  # the bundle's recorded state, which the scenario moves on from
        self._stamp: tuple[int, int, int] | None = None
        self._scenario: Scenario | None = None
        self._start = 0.0
        if path is not None:
            self._load()  # a bad scenario stops the monitor before it starts

    def _load(self) -> str | None:
        """(Re)read the file if it changed; the problem text when a rewrite is broken."""
        assert self.path is not None
        try:
            st = os.stat(self.path)
        except OSError as exc:
            if self._scenario is None:
                raise CaptureError(f"cannot read: {exc.strerror}", source=self.path) from None
            return f"cannot read: {exc.strerror}; the previous scenario goes on"
        stamp = (st.st_mtime_ns, st.st_size, st.st_ino)
        if stamp == self._stamp:
            return None
        try:
            data = read_regular(str(self.path), MAX_BYTES)
            scenario = parse_scenario(decode(data, str(self.path)), str(self.path), self.node)
        except (OSError, CaptureError) as exc:
            if self._scenario is None:
                if isinstance(exc, CaptureError):
                    raise
                raise CaptureError(f"cannot read: {exc.strerror}", source=self.path) from None
            self._stamp = stamp  # report a broken rewrite once, not every cycle
            return f"{exc}; the previous scenario goes on"
        self._stamp, self._scenario = stamp, scenario
        self._start = scenario.start if scenario.start is not None else st.st_mtime
        return None

    def read(self, now: float) -> Reading:
        problem = self._load() if self.path is not None else None
        step = step_at(self._scenario, self._start, now) if self._scenario is not None else None
        reading = readings(self.node, step, now, self.captured)
        if problem is not None:
            reading = reading._replace(problems=(*reading.problems,
                                                 ("scenario-error", str(self.path), problem)))
        return reading

    def close(self) -> None:
        pass
