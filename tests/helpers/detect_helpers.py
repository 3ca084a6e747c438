"""Builders for detector tests: cycles of a small node, and a [detect] config from TOML."""

from __future__ import annotations

from collections.abc import Callable, Iterable

from gpuslurm.config import DetectConfig, parse_config
from gpuslurm.policy.detect import Detector
from gpuslurm.samples import Allocation, Cycle, GpuSample, ProcSample, ScanProblem, Violation

GPUS = tuple(f"GPU-{i:04d}" for i in range(4))
UID = {"alice": 1001, "bob": 1002, "carol": 1003, "dcgm": 990}


def detect_cfg(toml: str = "") -> DetectConfig:
    """A [detect] config; the text is a TOML document (so the parser is exercised too)."""
    return parse_config(toml, "test.toml").detect


def gpu(uuid: str, util: float | None, mig: str | None = None, ts: float = 0.0) -> GpuSample:
    return GpuSample(ts, uuid, mig, util, 1000.0, 80000.0, 100.0, 40.0)


def proc(pid: int, gpu_uuid: str, job: str | None = None, user: str | None = "alice",
         util: float | None = None, mig: str | None = None, name: str = "python") -> ProcSample:
    uid = UID.get(user) if user else None
    return ProcSample(0.0, gpu_uuid, pid, mig, name, uid, user, job, 500.0, util, None)


def alloc(job: str, user: str, *uuids: str, start: float = 0.0, account: str | None = None) -> Allocation:
    return Allocation(job, user, UID[user], uuids, start, account)


def cycle(ts: float, gpus: Iterable[GpuSample] | dict[str, float | None], procs: Iterable[ProcSample] = (),
          allocs: Iterable[Allocation] = (), problems: Iterable[ScanProblem] = ()) -> Cycle:
    if isinstance(gpus, dict):
        gpus = [gpu(u, x, ts=ts) for u, x in gpus.items()]
    return Cycle(ts, "node1", tuple(gpus), tuple(procs), tuple(allocs), tuple(problems))


def utils(default: float | None = 0.0, **by_index: float | None) -> dict[str, float | None]:
    """Utilisation of GPUS: ``utils(0.0, g1=90)`` → GPU-0001 at 90 %, the others at 0 %."""
    out = dict.fromkeys(GPUS, default)
    for key, value in by_index.items():
        out[GPUS[int(key[1:])]] = value
    return out


def run(det: Detector, times: Iterable[float], make: Callable[[float], Cycle]) -> list[tuple[Violation, ...]]:
    """Feed one cycle per time; the violations after each."""
    return [det.feed(make(t)) for t in times]


def kinds(found: Iterable[Violation]) -> list[tuple[str, str | None, str | None]]:
    return [(v.kind, v.job_id, v.gpu_uuid) for v in found]
