"""The report's time window from ``--last`` / ``--since`` / ``--until`` (pure: ``now`` is passed in)."""

from __future__ import annotations

import re
from datetime import datetime

from gpuslurm.errors import InputError

DEFAULT_LAST_S = 86400.0
_UNITS = {"s": 1, "sec": 1, "m": 60, "min": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
_PART = re.compile(r"(\d+(?:\.\d+)?)\s*(sec|min|s|m|h|d|w)")


def parse_duration(text: str, option: str = "--last") -> float:
    """``90s``, ``15m``/``15min``, ``24h``, ``30d``, ``2w``, or sums like ``1d12h``; seconds > 0."""
    s = text.strip().lower()
    pos, total = 0, 0.0
    for m in _PART.finditer(s):
        if m.start() != pos and s[pos:m.start()].strip():
            break
        total += float(m.group(1)) * _UNITS[m.group(2)]
        pos = m.end()
    if not s or pos != len(s) or total <= 0:
        raise InputError(f"bad duration {text!r}: use a number and a unit, e.g. 90m, 24h, 30d", source=option)
    return total


def parse_time(text: str, now: float, option: str) -> float:
    """``now``, ``-2h`` (ago), ``@1714557600`` (Unix seconds), or ISO 8601 (local time unless it says)."""
    s = text.strip()
    if s == "now":
        return now
    if s.startswith("-"):
        return now - parse_duration(s[1:], option)
    if s.startswith("@"):
        try:
            value = float(s[1:])
        except ValueError:
            value = float("nan")
        if not 0 <= value < 1e11:  # also NaN and infinities: datetime cannot show them
            raise InputError(f"bad Unix time {text!r}", source=option)
        return value
    try:
        return datetime.fromisoformat(s).timestamp()  # naive: local time
    except ValueError:
        raise InputError(f"bad time {text!r}: use e.g. 2024-05-01T08:00, @1714550400, -2h or now",
                         source=option) from None


def resolve_window(last: str | None, since: str | None, until: str | None, now: float) -> tuple[float, float]:
    """``(since, until)`` in Unix seconds; a window reaching past ``now`` ends at ``now``."""
    if last is not None and (since is not None or until is not None):
        raise InputError("--last cannot be combined with --since/--until", source="--last")
    if until is not None and since is None:
        raise InputError("--until needs --since (or use --last)", source="--until")
    if since is None:
        lo, hi = now - (DEFAULT_LAST_S if last is None else parse_duration(last)), now
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
    return datetime.fromtimestamp(ts).strftime("%Y-%m-%d %H:%M:%S")
