"""Admission under load: per-user GPU limits from the cluster's load, with back-off (pure).

The seeds throttle by load: above 70 % a user's quota is 10 %, above 30 % it is 50 %. In Slurm
the actuator is a per-user association limit, ``GrpTRES=gres/gpu=N``: a job over it stays PENDING
(reason ``AssocGrpGRES``) instead of being refused. The mapping (docs/throttle.md):

- load = GPUs allocated / GPUs configured, over the cluster, from slurmctld;
- tier = the strictest whose threshold the load exceeds: :data:`TIERS`; none below 30 %;
- a tier's limit is N = max(1, ceil(quota × configured GPUs)): 10 % of 8 GPUs is 1, 50 % is 4;
- it applies to the users above their fair share, an equal split of the configured GPUs among
  the users holding GPUs now (8 GPUs, 2 such users: above 4), and, once limited, a user stays
  limited until the load eases below every tier (a limit does not chase the user's own usage);
- tightening is immediate; easing (to a lighter tier, or none) waits until the load has stayed
  below the current tier's threshold for the back-off, which doubles (up to ``backoff_max_s``)
  each time the load rises again within one back-off of an easing (a flap) and returns to
  ``backoff_s`` once an easing has held that long;
- with the GPUs' utilisation U (0..1, the node monitors' mean), a proportional controller holds
  U in the band (60-80 %) by moving the tier's N (:func:`band_limit`): below the band the
  cluster has work to spare and N rises by ``gain`` × (low − U) / low; above it N falls by
  ``gain`` × (U − high) / (1 − high); N stays within 1 and the cluster's GPUs. Without a
  utilisation (None) or with gain 0 the tiers act alone.

:func:`step` is the whole decision: the state in, the new state and the changes out, each with
the figures that caused it. What limits exist in Slurm, and which were set by someone else, is
the caller's to check (never lift a limit this did not set).
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from gpuslurm.tuples import NamedTuple

# (load above which, per-user quota as a share of the cluster's GPUs), strictest last
TIERS: tuple[tuple[float, float], ...] = ((0.30, 0.50), (0.70, 0.10))
NO_TIER = -1


class AdmissionConfig(NamedTuple):
    tiers: tuple[tuple[float, float], ...] = TIERS
    backoff_s: float = 300.0
    backoff_max_s: float = 3600.0
    exempt: frozenset[str] = frozenset({"root"})  # never limited
    band: tuple[float, float] = (0.6, 0.8)  # the utilisation band held
    gain: float = 0.5  # 0: no band controller


def check_band(low: float, high: float) -> None:
    """ValueError unless 0 <= low <= high <= 1."""
    if not 0 <= low <= high <= 1:
        raise ValueError(f"the utilisation band must be 0 <= low <= high <= 1, not {low}..{high}")


def band_limit(limit: int, total_gpus: int, utilisation: float | None, cfg: AdmissionConfig) -> int:
    """The tier's ``limit`` moved to hold ``utilisation`` in ``cfg.band`` (see the module doc)."""
    if utilisation is None or cfg.gain == 0:
        return limit
    low, high = cfg.band
    factor = 1.0
    if utilisation < low:
        factor = 1 + cfg.gain * (low - utilisation) / low
    elif utilisation > high and high < 1:
        factor = 1 - cfg.gain * (utilisation - high) / (1 - high)
    return min(max(total_gpus, 1), max(1, round(limit * factor)))


class AdmissionState(NamedTuple):
    """What :func:`step` remembers between readings (kept in a private file by the caller)."""

    tier: int = NO_TIER  # index into the tiers, NO_TIER for none
    low_since: float | None = None  # since when the load is below the current tier
    backoff_s: float | None = None  # the current back-off; None: the config's base
    eased_at: float | None = None  # the last easing, until it has held for one back-off
    limits: tuple[tuple[str, int], ...] = ()  # (user, N) this set, sorted by user


class Change(NamedTuple):
    """One limit to set (``limit`` N) or lift (``limit`` None), and why, in words with figures."""

    user: str
    limit: int | None
    why: str


def tier_for(load: float, tiers: tuple[tuple[float, float], ...]) -> int:
    """The index of the strictest tier whose threshold ``load`` exceeds, or NO_TIER."""
    found = NO_TIER
    for i, (above, _quota) in enumerate(tiers):
        if load > above:
            found = i
    return found


def tier_limit(tier: int, total_gpus: int, tiers: tuple[tuple[float, float], ...]) -> int | None:
    """GPUs per limited user in ``tier`` (None for no tier)."""
    if tier == NO_TIER:
        return None
    return max(1, math.ceil(tiers[tier][1] * total_gpus - 1e-9))


def step(state: AdmissionState, *, load: float, usage: Mapping[str, int], total_gpus: int, now: float,
         cfg: AdmissionConfig, utilisation: float | None = None,
         ) -> tuple[AdmissionState, tuple[Change, ...], tuple[str, ...]]:
    """One reading: ``load`` (allocated share, 0..1), ``usage`` (user → GPUs held now),
    ``utilisation`` (the GPUs' mean utilisation, 0..1, or None when not read).

    Returns the new state, the limit changes to make, and log lines for tier changes.
    """
    backoff = state.backoff_s if state.backoff_s is not None else cfg.backoff_s
    eased_at = state.eased_at
    if eased_at is not None and now - eased_at >= backoff:  # the last easing held: calm again
        backoff, eased_at = cfg.backoff_s, None
    target = tier_for(load, cfg.tiers)
    tier, low_since = state.tier, state.low_since
    notes: list[str] = []
    figures = f"load {load:.0%} of {total_gpus} GPUs" + (
        "" if utilisation is None else f", utilisation {utilisation:.0%}")
    if target > tier:
        if eased_at is not None:  # rising again within one back-off of an easing: a flap
            backoff = min(backoff * 2, cfg.backoff_max_s)
            notes.append(f"flap: {figures} rose again {now - eased_at:.0f}s after easing; "
                         f"back-off now {backoff:.0f}s")
            eased_at = None
        notes.append(f"tighten to {_name(target, cfg)}: {figures} > {cfg.tiers[target][0]:.0%}")
        tier, low_since = target, None
    elif target < tier:
        low_since = now if low_since is None else low_since
        if now - low_since >= backoff:
            notes.append(f"ease to {_name(target, cfg)}: {figures}, below {cfg.tiers[tier][0]:.0%} "
                         f"for {now - low_since:.0f}s (back-off {backoff:.0f}s)")
            tier, low_since, eased_at = target, None, now
    else:
        low_since = None
    limit = tier_limit(tier, total_gpus, cfg.tiers)
    if limit is not None:
        limit = band_limit(limit, total_gpus, utilisation, cfg)
    held = dict(state.limits)
    fair = total_gpus / max(1, sum(1 for n in usage.values() if n > 0))
    wanted: dict[str, int] = {}
    if limit is not None:
        for user in sorted(set(held) | set(usage)):
            if user in cfg.exempt:
                continue
            if user in held or usage.get(user, 0) > fair:
                wanted[user] = limit
    changes = []
    for user in sorted(set(held) | set(wanted)):
        if wanted.get(user) == held.get(user):
            continue
        if user in wanted:
            why = (f"{_name(tier, cfg)}, {figures}: {user} holds {usage.get(user, 0)} GPUs, fair share "
                   f"{fair:.1f}" if user not in held else f"{_name(tier, cfg)}, {figures}")
            changes.append(Change(user, wanted[user], why))
        else:
            changes.append(Change(user, None, f"eased to {_name(tier, cfg)}, {figures}"))
    new = AdmissionState(tier, low_since, backoff, eased_at, tuple(sorted(wanted.items())))
    return new, tuple(changes), tuple(notes)


def _name(tier: int, cfg: AdmissionConfig) -> str:
    if tier == NO_TIER:
        return "no limit"
    return f"tier {cfg.tiers[tier][1]:.0%} per user"
