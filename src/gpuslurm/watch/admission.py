"""One round of ``gpuslurm throttle auto``, for any scheduler: read the load, decide, apply.

The decision is :func:`gpuslurm.policy.admission.step` (pure). The scheduler's side is an
:class:`Admission` adapter: :class:`gpuslurm.slurm.admission.SlurmAdmission` (GrpTRES in slurmdbd)
or :class:`gpuslurm.pbs.admission.PbsAdmission` (the server's ``max_run_res.ngpus``). The state
between rounds (which limits this set) is a private file of root's, read back with every value
checked (docs/security.md).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Protocol

from gpuslurm.errors import GpuslurmError, InputError
from gpuslurm.policy.admission import NO_TIER, TIERS, AdmissionConfig, AdmissionState, step
from gpuslurm.policy.throttle import check_user
from gpuslurm.safedir import read_private_file, write_private_file
from gpuslurm.times import in_range

UTILISATION_METRIC = "gpuslurm_gpu_utilization_ratio"


class Admission(Protocol):
    """A scheduler's load, per-user GPU limits and how to set them."""

    limit_key: str  # what a user's GPU limit is called there: gres/gpu, max_run_res.ngpus

    def read_load(self) -> tuple[int, dict[str, int]]:
        """(GPUs configured, user → GPUs held)."""
        ...

    def read_limits(self) -> dict[str, tuple[int | None, ...]]:
        """User → the GPU limit of each of their entries (None: none)."""
        ...

    def read_utilisation(self, now: float) -> float | None:
        ...

    def set_limit(self, user: str, limit: int | None) -> None:
        ...

    def limit_text(self, limit: int) -> str:
        """The limit as the scheduler spells it, for the log."""
        ...

    def cannot_limit(self, user: str, existing: dict[str, tuple[int | None, ...]]) -> str | None:
        """Why ``user`` cannot be limited at all (e.g. no association), or None."""
        ...


def prometheus_utilisation(source: str | None, now: float, timeout: float) -> float | None:
    """The GPUs' mean utilisation over the last 5 minutes (0..1) from the node monitors' exporters,
    or None without a source; InputError when Prometheus has none."""
    if source is None:
        return None
    from gpuslurm.report.prometheus import PrometheusClient  # urllib.request: only for this source

    client = PrometheusClient(source, timeout_s=timeout)
    items = client.instant(f"avg(avg_over_time({UTILISATION_METRIC}[5m]))", now)
    value = items[0].get("value") if items else None
    try:
        util = float(value[1]) if isinstance(value, list) and len(value) == 2 else None
    except (TypeError, ValueError):
        util = None
    if util is None or not 0 <= util <= 1:
        raise InputError(f"no utilisation in Prometheus ({UTILISATION_METRIC}): are the node "
                         "monitors scraped?", source=f"prometheus:{source}")
    return util


# --- one round of `gpuslurm throttle auto` --------------------------------------------------

STATE_FILE = "admission.json"
MAX_STATE_BYTES = 1 << 20
MAX_LIMIT = 1 << 24  # GPUs per user: far above any cluster


def load_state(directory: str, tiers: tuple[tuple[float, float], ...] = TIERS) -> AdmissionState:
    """The state a previous round saved in ``directory`` (root's, private), or a fresh one.

    The file is reached and checked like every root path (:mod:`gpuslurm.safedir`); a missing or
    malformed one is a fresh start, which forgets the limits this set (they are then left alone,
    never lifted: docs/throttle.md). Malformed includes any value :func:`save_state` never writes:
    a tier that is not one of ``tiers``, a time or back-off that is not finite and in range (a NaN
    would hold a limit forever), a limit that is not a whole number of GPUs.
    """
    data = read_private_file(directory, STATE_FILE, MAX_STATE_BYTES)
    if data is None:
        return AdmissionState()
    try:
        doc = json.loads(data)
        tier = doc["tier"]
        if type(tier) is not int or not NO_TIER <= tier < len(tiers):
            raise ValueError(f"not a tier: {tier!r}")
        limits = tuple((check_user(_text(u)), _gpus(n)) for u, n in doc["limits"])
        low_since, eased_at = (_opt_time(doc[k]) for k in ("low_since", "eased_at"))
        backoff = _opt_time(doc["backoff_s"])
        if backoff is not None and backoff <= 0:
            raise ValueError(f"not a back-off: {backoff!r}")
        return AdmissionState(tier, low_since, backoff, eased_at, limits)
    except (ValueError, TypeError, KeyError, InputError, RecursionError):
        return AdmissionState()


def _text(value: object) -> str:
    if type(value) is not str:
        raise TypeError(f"not a user name: {value!r}")
    return value


def _gpus(value: object) -> int:
    if type(value) is not int or not 0 < value <= MAX_LIMIT:
        raise ValueError(f"not a GPU limit: {value!r}")
    return value


def _opt_time(value: object) -> float | None:
    """None, or a number of seconds in the range of :mod:`gpuslurm.times` (never NaN or infinite)."""
    if value is None:
        return None
    if type(value) not in (int, float) or not in_range(value):
        raise ValueError(f"not a time: {value!r}")
    return float(value)  # type: ignore[arg-type]


def save_state(directory: str, state: AdmissionState) -> None:
    doc = {"tier": state.tier, "low_since": state.low_since, "backoff_s": state.backoff_s,
           "eased_at": state.eased_at, "limits": [list(x) for x in state.limits]}
    write_private_file(directory, STATE_FILE, json.dumps(doc).encode() + b"\n")


def auto_round(adm: Admission, state: AdmissionState, cfg: AdmissionConfig, now: float, *,
               dry_run: bool, log: Callable[[str], None]) -> AdmissionState:
    """Read the load, decide (:func:`gpuslurm.policy.admission.step`), apply; the new state.

    A limit is set only on a user whose associations carry no GPU limit of someone else's, and
    lifted only while it is still the one this set; otherwise the user is left alone and forgotten.
    """
    total, usage = adm.read_load()
    load = sum(usage.values()) / total if total else 0.0
    try:
        utilisation = adm.read_utilisation(now)
    except GpuslurmError as exc:  # the tiers still work on allocation alone
        log(f"utilisation not read, the band controller waits: {exc}")
        utilisation = None
    new, changes, notes = step(state, load=load, usage=usage, total_gpus=total, now=now, cfg=cfg,
                               utilisation=utilisation)
    for note in notes:
        log(note)
    if not changes:
        return new
    existing = adm.read_limits()
    applied = dict(state.limits)
    verb = "would " if dry_run else ""
    for change in changes:
        ours = applied.get(change.user)
        foreign = sorted({v for v in existing.get(change.user, ()) if v is not None and v != ours})
        if foreign:
            log(f"leave {change.user} alone: {adm.limit_key}={','.join(map(str, foreign))} was not set "
                "by gpuslurm")
            applied.pop(change.user, None)
            continue
        if (why := adm.cannot_limit(change.user, existing)) is not None:
            log(f"cannot limit {change.user}: {why}")
            continue
        what = adm.limit_text(change.limit) if change.limit is not None else "lift the GPU limit"
        try:
            if not dry_run:
                adm.set_limit(change.user, change.limit)
        except GpuslurmError as exc:
            log(f"failed to set {what} for {change.user}: {exc}")
            continue
        log(f"{verb}{'set ' + what if change.limit is not None else what} for {change.user}: {change.why}")
        if change.limit is None:
            applied.pop(change.user, None)
        else:
            applied[change.user] = change.limit
    if dry_run:
        return new._replace(limits=state.limits)  # nothing was changed in Slurm
    return new._replace(limits=tuple(sorted(applied.items())))
