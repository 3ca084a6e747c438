"""Times and durations from people and from files, bounded (pure: ``now`` is always passed in).

Every instant gpuslurm accepts — an option (``--since``, ``--until``), a stored throttle's end, a
violation record's start — lies in :data:`TIME_MIN` .. :data:`TIME_MAX`: from 1970-01-01 to
9999-01-01 UTC. Inside that range ``datetime`` can show it in any time zone, it fits a 64-bit
``time_t`` and Lua's ``os.date``, and a double holds it to the second. Durations are at most
:data:`MAX_DURATION_S` (the whole range) unless the caller bounds them more tightly.
"""

from __future__ import annotations

import math
import re
from datetime import datetime

from gpuslurm.errors import InputError

TIME_MIN = 0  # 1970-01-01T00:00:00Z
TIME_MAX = 253370764800  # 9999-01-01T00:00:00Z
MAX_DURATION_S = TIME_MAX - TIME_MIN
MAX_TEXT = 64  # no time or duration a person types is longer; a regex never sees more

_UNITS = {"s": 1, "sec": 1, "m": 60, "min": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
_PART = re.compile(r"(\d{1,30}(?:\.\d{1,9})?)\s*(sec|min|s|m|h|d|w)")
RANGE_TEXT = "1970-01-01 to 9999-01-01 UTC"


def in_range(ts: object) -> bool:
    """Whether ``ts`` is a finite number of Unix seconds inside the documented range."""
    if isinstance(ts, bool) or not isinstance(ts, (int, float)):
        return False
    return math.isfinite(ts) and TIME_MIN <= ts <= TIME_MAX


def check_time(ts: float, source: str, text: str | None = None) -> float:
    """``ts`` if :func:`in_range`; InputError naming ``text`` (or the value) otherwise."""
    if not in_range(ts):
        shown = repr(text) if text is not None else repr(ts)
        raise InputError(f"time {shown} is outside {RANGE_TEXT}", source=source)
    return ts


def parse_duration(text: str, option: str, *, max_s: float = MAX_DURATION_S,
                   max_words: str | None = None) -> float:
    """``90s``, ``15m``/``15min``, ``24h``, ``30d``, ``2w``, or sums like ``1d12h``: seconds, more
    than 0 and at most ``max_s`` (``max_words`` says that bound in the error)."""
    s = text.strip().lower()
    pos, total = 0, 0.0
    if len(s) <= MAX_TEXT:
        for m in _PART.finditer(s):
            if m.start() != pos and s[pos:m.start()].strip():
                break
            total += float(m.group(1)) * _UNITS[m.group(2)]
            pos = m.end()
    if not s or len(s) > MAX_TEXT or pos != len(s) or total <= 0:
        raise InputError(f"bad duration {_short(text)}: use a number and a unit, e.g. 90m, 24h, 30d",
                         source=option)
    if not total <= max_s:
        bound = max_words or f"{int(max_s)} seconds"
        raise InputError(f"duration {_short(text)} is longer than {bound}", source=option)
    return total


def parse_instant(text: str, option: str, example: str = "2030-01-31T18:00 or @1900000000") -> float:
    """``@EPOCH`` (Unix seconds) or ISO 8601 (local time unless it has an offset), in range."""
    s = text.strip()
    value = math.nan
    if len(s) <= MAX_TEXT:
        try:
            value = float(s[1:]) if s.startswith("@") else datetime.fromisoformat(s).timestamp()
        except (ValueError, OverflowError, OSError):
            value = math.nan
    if math.isnan(value):
        raise InputError(f"bad time {_short(text)}: use e.g. {example}", source=option)
    return check_time(value, option, text)


def parse_time(text: str, now: float, option: str) -> float:
    """``now``, ``-2h`` (that long before ``now``), ``@1714557600`` or ISO 8601; in range."""
    s = text.strip()
    if s == "now":
        return check_time(now, option, text)
    if s.startswith("-"):
        return check_time(now - parse_duration(s[1:], option), option, text)
    return parse_instant(s, option, "2024-05-01T08:00, @1714550400, -2h or now")


def show(ts: float, fmt: str = "%Y-%m-%d %H:%M:%S") -> str:
    """``ts`` as local time; a value out of range is shown as its number, never an exception."""
    if not in_range(ts):
        return f"@{ts!r}"
    try:
        return datetime.fromtimestamp(ts).astimezone().strftime(fmt)
    except (ValueError, OverflowError, OSError):
        return f"@{ts!r}"


def _short(text: str) -> str:
    return repr(text if len(text) <= MAX_TEXT else text[:MAX_TEXT] + "…")
