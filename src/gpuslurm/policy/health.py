"""The health gate: per-GPU facts and the ``[health]`` config in, a list of faults out (pure).

A fact that is ``None`` is unknown (the driver does not support the query, or a replay scenario
does not mention it) and never produces a fault; a GPU whose facts could not be read at all is
``lost``. Each check can be turned ``off``; the others report with the action configured for them.
"""

from __future__ import annotations

from collections.abc import Iterable

from gpuslurm.config import HealthConfig
from gpuslurm.policy.xid import describe, is_fault
from gpuslurm.tuples import TYPE_CHECKING, NamedTuple

# hw.model.health.SLOWDOWNS, the clock event reasons that mean a fault or its cooling slows the GPU
# (not policy or idleness); spelled here so the prolog need not load the readers to decide
SLOWDOWNS = ("hw_slowdown", "sw_thermal", "hw_thermal", "hw_power_brake")

if TYPE_CHECKING:  # the facts' types only: the prolog need not load the readers to decide
    from gpuslurm.hw.model.health import GpuHealth, GpuProcess


class Fault(NamedTuple):
    """One failed check on one GPU: ``check`` is the ``[health.<check>]`` section."""

    uuid: str
    check: str
    action: str  # "drain", "gpu_out" or "log"
    message: str


def gate_faults(health: GpuHealth, cfg: HealthConfig) -> list[Fault]:
    """Faults the prolog finds on a GPU about to be given to a job (every check but memory_released)."""
    faults: list[Fault] = []

    def add(check: str, action: str, message: str) -> None:
        if action != "off":
            faults.append(Fault(health.uuid, check, action, message))

    if health.lost or health.error is not None:
        why = f"GPU is lost ({health.error})" if health.error else "GPU is lost"
        add("lost_gpu", cfg.lost_gpu.action, why)
        return faults  # nothing else about a lost GPU is worth saying
    ignored = frozenset(cfg.xid.ignore)
    if bad := sorted({x for x in health.xid if is_fault(x, ignored)}):
        add("xid", cfg.xid.action, "; ".join(describe(x) for x in bad))
    if health.ecc_uncorrectable is not None and health.ecc_uncorrectable > cfg.ecc.max_uncorrectable:
        add("ecc", cfg.ecc.action, f"{health.ecc_uncorrectable} uncorrectable ECC errors "
                                   f"(limit {cfg.ecc.max_uncorrectable})")
    if health.remap_failed:
        add("row_remap", cfg.row_remap.action, "row remapping failed: GPU needs service")
    elif health.remap_pending:
        add("row_remap", cfg.row_remap.action, "row remap pending: GPU needs a reset")
    elif health.retired_pages_pending:
        add("row_remap", cfg.row_remap.action, "retired pages pending: GPU needs a reset")
    if health.temperature_c is not None and health.temperature_c > cfg.temperature.limit_c:
        add("temperature", cfg.temperature.action,
            f"temperature {health.temperature_c} C over limit {cfg.temperature.limit_c} C")
    if slowed := [e for e in health.clock_events or () if e in SLOWDOWNS]:
        add("throttle", cfg.throttle.action, "clocks slowed: " + ", ".join(slowed))
    if left := leftover_processes(health, cfg):
        add("leftover_processes", cfg.leftover_processes.action,
            f"{len(left)} leftover process(es): {_describe(left)}")
    return faults


def running_faults(health: GpuHealth, cfg: HealthConfig) -> list[Fault]:
    """Faults of a GPU in service while jobs may run on it (the monitor, ``gpuslurm health``): the
    prolog's checks but leftover processes, which are the running jobs' own."""
    return [f for f in gate_faults(health, cfg) if f.check != "leftover_processes"]


def released_faults(health: GpuHealth, cfg: HealthConfig) -> list[Fault]:
    """Faults the epilog finds on a GPU the job just gave back: processes or memory left behind."""
    faults: list[Fault] = []
    if health.lost or health.error is not None:
        if cfg.lost_gpu.action != "off":
            why = f"GPU is lost ({health.error})" if health.error else "GPU is lost"
            faults.append(Fault(health.uuid, "lost_gpu", cfg.lost_gpu.action, why))
        return faults
    if (left := leftover_processes(health, cfg)) and cfg.leftover_processes.action != "off":
        faults.append(Fault(health.uuid, "leftover_processes", cfg.leftover_processes.action,
                            f"{len(left)} process(es) left after the job: {_describe(left)}"))
    limit = cfg.memory_released.max_used_mib
    used = health.memory_used_mib
    if used is not None and used > limit and cfg.memory_released.action != "off":
        faults.append(Fault(health.uuid, "memory_released", cfg.memory_released.action,
                            f"{used} MiB still in use after the job (limit {limit} MiB)"))
    return faults


def leftover_processes(health: GpuHealth, cfg: HealthConfig) -> tuple[GpuProcess, ...]:
    """Processes on the GPU that count as leftovers (owners in ``ignore_users`` do not)."""
    if health.processes is None:
        return ()
    ignored = set(cfg.leftover_processes.ignore_users)
    return tuple(p for p in health.processes if p.user is None or p.user not in ignored)


def gpu_label(index: int, minor: int, uuid: str) -> str:
    """A GPU as an admin finds it: ``index 2 (/dev/nvidia0, <uuid>)``.

    The NVML index alone reads as /dev/nvidia<index>, a different board wherever minors differ
    from indices, so the device file is always named beside it.
    """
    return f"index {index} (/dev/nvidia{minor}, {uuid})"


def drain_reason(faults: Iterable[Fault], labels: dict[str, str]) -> str:
    """One line for ``scontrol update Reason=``: ``gpuslurm: GPU <label>: <fault>; …``.

    ``labels`` maps a UUID to its :func:`gpu_label`; an unknown GPU is named by its UUID alone.
    """
    parts = [f"GPU {labels.get(f.uuid, f'? ({f.uuid})')}: {f.message}" for f in faults]
    return "gpuslurm: " + "; ".join(parts)


def _describe(procs: tuple[GpuProcess, ...]) -> str:
    shown = [f"pid {p.pid}" + (f" ({p.user})" if p.user else "") for p in procs[:3]]
    more = f" and {len(procs) - 3} more" if len(procs) > 3 else ""
    return ", ".join(shown) + more


def gate_enabled(cfg: HealthConfig) -> bool:
    """Whether any prolog check is on (if none is, the prolog need not read health facts)."""
    return any(getattr(cfg, name).action != "off" for name in HealthConfig._fields
               if name != "memory_released")


def release_enabled(cfg: HealthConfig) -> bool:
    """Whether any epilog check is on."""
    return any(c.action != "off" for c in (cfg.lost_gpu, cfg.leftover_processes, cfg.memory_released))
