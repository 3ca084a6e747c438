"""How violations read: short, the same words everywhere (pure)."""

from __future__ import annotations

from gpuslurm.samples import ProcSample


def span(seconds: float) -> str:
    """A duration as an admin reads it: ``45 s``, ``18 min``, ``2 h 5 min``."""
    s = max(0, round(seconds))
    if s < 120:
        return f"{s} s"
    m = s // 60
    if m < 120:
        return f"{m} min"
    return f"{m // 60} h {m % 60} min" if m % 60 else f"{m // 60} h"


def pct(value: float) -> str:
    """A percentage: whole numbers unless that would hide the difference from a threshold."""
    return f"{value:.0f} %" if value >= 10 or value == int(value) else f"{value:.1f} %"


def tenths(value: float) -> str:
    """GPU-hours (or any amount) to one decimal place, halves rounded up, the same figure wherever
    it is printed: binary noise (142.24999… from one sum, 142.25000… from another) is dropped first,
    so one amount never prints as both 142.2 and 142.3."""
    import math

    whole = math.floor(round(value, 6) * 10 + 0.5)
    return f"{whole / 10:.1f}"


def name_proc(proc: ProcSample) -> str:
    """``python (PID 12345, job 812)``."""
    job = f", job {proc.job_id}" if proc.job_id is not None else ""
    return f"{proc.name or 'process'} (PID {proc.pid}{job})"
