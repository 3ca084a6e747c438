"""The fair-share report from a source (``sqlite:PATH`` or ``prometheus:URL``): the path each takes.

From Prometheus, ``--by user`` and ``--by account`` come from its per-user sums
(:mod:`gpuslurm.report.prom_users`: points per user, not per device), unless the window needs the
per-device path or the caller wants the per-device series (charts).
"""

from __future__ import annotations

from collections.abc import Callable

from gpuslurm.errors import InputError
from gpuslurm.report.compute import Policy, Report, compute, physical_gpus
from gpuslurm.report.data import ReportData
from gpuslurm.report.query import load_sqlite


def fairshare(source: str, since: float, until: float, step_s: float, by: str,
              policy_for: Callable[[int], Policy], series: bool = False) -> tuple[Report, ReportData | None]:
    """The report ``by`` user, account, job or process; ``policy_for(physical GPUs)`` judges it.
    ``series``: the per-device data too (returned, else None where the report did not need it)."""
    kind, sep, where = source.partition(":")
    if not sep or not where:
        raise InputError(f"bad source {source!r}: use sqlite:PATH or prometheus:URL", source="--source")
    if kind == "prometheus" and not series:
        # urllib.request: ~0.1 s, only for this source
        from gpuslurm.report.prom_users import load_user_buckets
        from gpuslurm.report.user_report import BY_USERS, compute_users

        if by in BY_USERS:
            users = load_user_buckets(where, since, until, step_s)
            if users is not None:
                return compute_users(users, by, policy_for(users.gpus)), None
    data = load(source, since, until, step_s)
    return compute(data, by, policy_for(physical_gpus(data))), data


def load(source: str, since: float, until: float, step_s: float) -> ReportData:
    """The window's per-device series from ``sqlite:PATH`` or ``prometheus:URL``."""
    kind, sep, where = source.partition(":")
    if not sep or not where:
        raise InputError(f"bad source {source!r}: use sqlite:PATH or prometheus:URL", source="--source")
    if kind == "sqlite":
        return load_sqlite(where, since, until, step_s)
    if kind == "prometheus":
        from gpuslurm.report.prometheus import load_prometheus

        return load_prometheus(where, since, until, step_s)
    raise InputError(f"unknown source kind {kind!r}: use sqlite:PATH or prometheus:URL", source="--source")
