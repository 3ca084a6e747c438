"""The report's time window from ``--last`` / ``--since`` / ``--until`` (pure: ``now`` is passed in)."""

from __future__ import annotations

from gpuslurm import times
from gpuslurm.errors import InputError
from gpuslurm.times import parse_time

DEFAULT_LAST_S = 86400.0
__all__ = ["DEFAULT_LAST_S", "parse_duration", "parse_time", "resolve_window"]


def parse_duration(text: str, option: str = "--last") -> float:
    """``90s``, ``15m``/``15min``, ``24h``, ``30d``, ``2w``, or sums like ``1d12h``; seconds > 0,
    at most the whole documented time range (see :mod:`gpuslurm.times`)."""
    return times.parse_duration(text, option)


def resolve_window(last: str | None, since: str | None, until: str | None, now: float) -> tuple[float, float]:
    """``(since, until)`` in Unix seconds; a window reaching past ``now`` ends at ``now``."""
    if last is not None and (since is not None or until is not None):
        raise InputError("--last cannot be combined with --since/--until", source="--last")
    if until is not None and since is None:
        raise InputError("--until needs --since (or use --last)", source="--until")
    if since is None:
        lo = now - (DEFAULT_LAST_S if last is None else parse_duration(last))
        hi = now
        if not times.in_range(lo):
            raise InputError(f"--last {last!r} reaches before {times.RANGE_TEXT}", source="--last")
    else:
        lo = parse_time(since, now, "--since")
        hi = now if until is None else parse_time(until, now, "--until")
    if lo >= now:
        raise InputError(f"the window starts in the future ({_fmt(lo)}; now is {_fmt(now)})",
                         source="--since")
    if hi <= lo:
        raise InputError(f"the window is backwards or empty: --since {_fmt(lo)} is not before "
                         f"--until {_fmt(hi)}", source="--since")
    return lo, min(hi, now)


def _fmt(ts: float) -> str:
    return times.show(ts)
