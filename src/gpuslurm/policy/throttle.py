"""Throttle state, pure: who is throttled, how and until when; what ``sync`` makes of violations.

A throttle applies to a user name (the name slurmctld resolves the submitting uid to). Times are
whole Unix seconds. Nothing here reads a file or the clock: ``now`` is always passed in.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable, Mapping
from datetime import datetime, timedelta
from typing import Any, NamedTuple

from gpuslurm import times
from gpuslurm.errors import InputError
from gpuslurm.samples import Violation

MODES = ("reject", "cap", "priority")
_STRICTNESS = {"priority": 0, "cap": 1, "reject": 2}
MAX_NICE = 2147483645  # Slurm's largest nice (NICE_OFFSET - 3)
MAX_SECONDS = 366 * 86400  # a throttle is a timeout, not a ban
MAX_TEXT = 200  # reason and contact: one short line in sbatch's error output
VIOLATION_VERSION = 1

# POSIX-portable names plus what sssd/AD produce (user@domain, trailing $); never a tab, space,
# '#' or newline, which would break the throttle file's lines.
_USER = re.compile(r"[A-Za-z0-9_.][A-Za-z0-9_.@$-]{0,254}")
FUTURE_SLACK_S = 86400  # a violation "last seen" later than this after now is not believed
MAX_LINE = 4096  # a throttle file line longer than this is junk (job_submit.lua's rule too)
MAX_DIGITS = 12  # until, value, created: TIME_MAX has 12 digits (the plugin's rule too)


class Throttle(NamedTuple):
    """One user's throttle: what happens to their GPU submissions until ``until``."""

    user: str
    until: int  # Unix seconds; the throttle is over at this instant
    mode: str = "reject"  # reject | cap | priority
    value: int = 0  # cap: most GPUs allowed; priority: nice added; reject: 0
    created: int = 0
    contact: str = ""  # whom to ask; empty: the plugin's default wording
    reason: str = ""

    def active(self, now: float) -> bool:
        return self.until > now


class SyncPolicy(NamedTuple):
    """Which violations throttle their user, for how long after the violation was last seen."""

    kinds: tuple[str, ...] = ("rogue",)
    duration_s: float = 7200  # [throttle] sync_minutes × 60: fractions allowed
    mode: str = "reject"
    value: int = 0
    contact: str = ""


def check_user(name: str) -> str:
    """``name`` if it can be a user name in the throttle file; InputError otherwise."""
    if not _USER.fullmatch(name):
        raise InputError(f"not a valid user name: {name!r}", source="user")
    return name


def clean_text(text: str, limit: int = MAX_TEXT) -> str:
    """One line of printable text: control characters (tabs, newlines) become spaces."""
    flat = "".join(ch if ch.isprintable() else " " for ch in text)
    flat = " ".join(flat.split())
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


def check_mode(mode: str, value: int | None, *, cap_default: int, nice_default: int) -> int:
    """The ``value`` a throttle of ``mode`` stores (cap GPUs, nice, or 0); InputError if invalid."""
    if mode not in MODES:
        raise InputError(f"unknown mode {mode!r}: use one of {', '.join(MODES)}", source="mode")
    if mode == "reject":
        if value not in (None, 0):
            raise InputError("a value (--cap/--nice) only goes with mode cap or priority", source="mode")
        return 0
    if mode == "cap":
        v = cap_default if value is None else value
        if not 1 <= v <= 1_000_000:
            raise InputError(f"cap must be a whole number of GPUs of at least 1, not {v}", source="cap")
        return v
    v = nice_default if value is None else value
    if not 1 <= v <= MAX_NICE:
        raise InputError(f"nice must be between 1 and {MAX_NICE}, not {v}", source="nice")
    return v


def make_throttle(user: str, until: int, mode: str, value: int, *, created: int, contact: str = "",
                  reason: str = "") -> Throttle:
    """A validated Throttle (the user name is checked, texts flattened to one line)."""
    check_mode(mode, value if mode != "reject" else None, cap_default=1, nice_default=1)
    times.check_time(until, "until")
    return Throttle(check_user(user), int(until), mode, int(value), int(created), clean_text(contact),
                    clean_text(reason))


def parse_duration(text: str) -> int:
    """Seconds in ``90s``, ``30m``, ``2h``, ``1d``, ``1w`` or combinations (``1h30m``); at most
    366 days (:func:`gpuslurm.times.parse_duration`, the one duration parser)."""
    seconds = round(times.parse_duration(text, "--for", max_s=MAX_SECONDS, max_words="366 days"))
    if seconds < 1:
        raise InputError(f"duration {text!r} is shorter than a second", source="--for")
    return seconds


def parse_until(text: str, now: float) -> int:
    """Unix seconds for ``--until``: ISO date/time (local unless it has an offset), ``HH:MM``
    (its next occurrence) or ``@EPOCH``. Must be in the future and within 366 days."""
    raw = text.strip()
    if re.fullmatch(r"\d{1,2}:\d{2}(:\d{2})?", raw):
        parts = [int(p) for p in raw.split(":")]
        try:
            base = datetime.fromtimestamp(now)
            t = base.replace(hour=parts[0], minute=parts[1], second=parts[2] if len(parts) > 2 else 0,
                             microsecond=0)
        except (ValueError, OverflowError, OSError):
            raise InputError(f"not a time: {text!r} (use e.g. 2030-01-31T18:00, 18:00 or @1900000000)",
                             source="--until") from None
        if t.timestamp() <= now:
            t += timedelta(days=1)
        when = t.timestamp()
    else:
        when = times.parse_instant(raw, "--until", "2030-01-31T18:00, 18:00 or @1900000000")
    if when <= now:
        raise InputError(f"{text!r} is not in the future", source="--until")
    if when - now > MAX_SECONDS:
        raise InputError(f"{text!r} is more than 366 days away", source="--until")
    return int(when)


def active_throttles(throttles: Iterable[Throttle], now: float) -> tuple[Throttle, ...]:
    """The throttles not yet expired, one per user (the last one given wins), sorted by user."""
    by_user = {t.user: t for t in throttles if t.active(now)}
    return tuple(by_user[u] for u in sorted(by_user))


def add_throttle(throttles: Iterable[Throttle], new: Throttle, now: float) -> tuple[Throttle, ...]:
    """The state with ``new`` replacing any throttle of the same user (an explicit ``add`` wins)."""
    return active_throttles([*(t for t in throttles if t.user != new.user), new], now)


def remove_throttle(throttles: Iterable[Throttle], user: str,
                    now: float) -> tuple[tuple[Throttle, ...], bool]:
    """The state without ``user``'s throttle, and whether there was an active one."""
    current = active_throttles(throttles, now)
    kept = tuple(t for t in current if t.user != user)
    return kept, len(kept) != len(current)


def stricter(old: Throttle, new: Throttle) -> Throttle:
    """Combine two throttles of one user: the later end, the stricter mode, the lower cap.

    ``sync`` uses it so that an automatic throttle never shortens or softens one an admin set.
    """
    until = max(old.until, new.until)
    rank_old, rank_new = _STRICTNESS[old.mode], _STRICTNESS[new.mode]
    if rank_new > rank_old:
        base = new
    elif rank_new < rank_old:
        base = old
    else:
        value = min(old.value, new.value) if old.mode == "cap" else max(old.value, new.value)
        base = old._replace(value=value)
    return base._replace(until=until, created=min(old.created, new.created) or new.created,
                         contact=base.contact or old.contact or new.contact,
                         reason=base.reason or old.reason or new.reason)


def throttles_from_violations(violations: Iterable[Violation], policy: SyncPolicy,
                              now: float) -> tuple[Throttle, ...]:
    """One throttle per user with a violation of a configured kind, lasting ``policy.duration_s``
    after the violation was last seen; those already over by ``now`` give nothing."""
    latest: dict[str, tuple[float, Violation]] = {}
    for v in violations:
        if v.kind not in policy.kinds or not v.user or not _USER.fullmatch(v.user):
            continue
        if implausible(v, now):
            continue  # the caller reports it (implausible() says why)
        end = v.start + max(v.duration_s, 0.0)
        if v.user not in latest or end > latest[v.user][0]:
            latest[v.user] = (end, v)
    out = []
    for user in sorted(latest):
        end, v = latest[user]
        until = int(end + policy.duration_s)
        if until <= now or not times.in_range(until):
            continue
        out.append(Throttle(user, until, policy.mode, policy.value, int(now), clean_text(policy.contact),
                            violation_reason(v)))
    return tuple(out)


def implausible(v: Violation, now: float) -> str | None:
    """Why ``v``'s times cannot be believed (outside the time range, or ending more than a day
    after ``now``), or None. ``sync`` skips such a record rather than throttle until then."""
    if not (times.in_range(v.start) and math.isfinite(v.duration_s) and v.duration_s >= 0
            and times.in_range(v.start + v.duration_s)):
        return f"start {v.start!r} / duration {v.duration_s!r} outside {times.RANGE_TEXT}"
    if v.start + v.duration_s > now + FUTURE_SLACK_S:
        return f"ends at {v.start + v.duration_s!r}, more than a day from now"
    return None


def apply_sync(throttles: Iterable[Throttle], proposed: Iterable[Throttle],
               now: float) -> tuple[tuple[Throttle, ...], tuple[Throttle, ...]]:
    """Merge ``proposed`` into the state; returns the new state and the throttles that changed."""
    state = {t.user: t for t in active_throttles(throttles, now)}
    changed = []
    for new in proposed:
        old = state.get(new.user)
        merged = new if old is None else stricter(old, new)
        if merged != old:
            state[new.user] = merged
            changed.append(merged)
    return active_throttles(state.values(), now), tuple(changed)


def violation_reason(v: Violation) -> str:
    """A short, user-facing reason for a throttle caused by ``v``."""
    what = {"rogue": "GPU process outside its job's GPUs", "idle": "idle GPU allocation",
            "over-share": "GPU use over fair share"}.get(v.kind, f"{v.kind} violation")
    parts = [what]
    if v.process or v.pid is not None:
        parts.append(f"process {v.process or '?'} (pid {v.pid if v.pid is not None else '?'})")
    if v.job_id:
        parts.append(f"job {v.job_id}")
    if v.gpu_uuid:
        parts.append(f"on {v.gpu_uuid}")
    parts.append(f"node {v.node}")
    return clean_text(", ".join(parts))


# --- violation records: one JSON object per line, one file per node ----------------------------

def violation_to_line(v: Violation) -> str:
    """``v`` as one line of the shared violations file (JSON, no newline inside)."""
    doc: dict[str, Any] = {"v": VIOLATION_VERSION, **v._asdict()}
    return json.dumps(doc, sort_keys=True, separators=(",", ":"), ensure_ascii=True)


def violation_from_line(line: str) -> Violation:
    """Parse one line written by ``violation_to_line``; ValueError says what is wrong.

    Unknown keys are ignored so that newer writers stay readable; a newer major version is not.
    """
    doc = json.loads(line)
    if not isinstance(doc, dict):
        raise ValueError("not a JSON object")
    if doc.get("v") != VIOLATION_VERSION:
        raise ValueError(f"unknown record version {doc.get('v')!r}")
    return Violation(
        kind=_get(doc, "kind", str), node=_get(doc, "node", str),
        user=_get(doc, "user", str, optional=True), job_id=_get(doc, "job_id", str, optional=True),
        pid=_get(doc, "pid", int, optional=True), process=_get(doc, "process", str, optional=True),
        gpu_uuid=_get(doc, "gpu_uuid", str, optional=True),
        start=_time(doc, "start"), duration_s=_time(doc, "duration_s"),
        evidence=_get(doc, "evidence", str, optional=True) or "",
        severity=_get(doc, "severity", str, optional=True) or "warning",
    )


def _get(doc: Mapping[str, Any], key: str, kind: type | tuple[type, ...], optional: bool = False) -> Any:
    value = doc.get(key)
    if value is None and optional:
        return None
    if not isinstance(value, kind) or isinstance(value, bool):
        raise ValueError(f"{key!r} missing or of the wrong type")
    return value


def _time(doc: Mapping[str, Any], key: str) -> float:
    """A stored time (or duration) in the documented range; ValueError says why not."""
    value = _get(doc, key, (int, float))
    try:
        number = float(value)
    except OverflowError:  # an integer of 400 digits
        number = math.inf
    if not times.in_range(number):
        raise ValueError(f"{key!r} {value!r:.40} outside {times.RANGE_TEXT}")
    return number


# --- the throttle file's lines (format: gpuslurm.slurm.throttle; read by job_submit.lua and the
# PBS throttle hook alike) ----------------------------------------------------------------------

class ThrottleFile(NamedTuple):
    """What a throttle file holds: its throttles (expired ones included) and its junk lines."""

    throttles: tuple[Throttle, ...]
    junk: tuple[tuple[int, str, str], ...] = ()  # (line number, text, why)
    exists: bool = True
    doubtful: tuple[str, ...] = ()  # users named by a junk line: none of their lines counts


def parse_throttle_file(text: str) -> ThrottleFile:
    """Parse the file's text with the plugin's rules; bad lines go to ``junk``, never raise.

    Every doubt lets the job through, as in the plugin: a junk line whose first field names a
    user makes that user ``doubtful``, and none of their lines counts.
    """
    throttles: list[Throttle] = []
    junk: list[tuple[int, str, str]] = []
    doubtful: set[str] = set()
    for number, raw in enumerate(text.split("\n"), start=1):
        line = raw[:-1] if raw.endswith("\r") else raw
        if not line.strip() or line.startswith("#"):
            continue
        t, why = _parse_line(line) if len(line.encode(errors="surrogateescape")) <= MAX_LINE \
            else (None, f"longer than {MAX_LINE} bytes")
        if t is None:
            junk.append((number, line[:200], why))
            user = line[:256].split("\t", 1)[0]
            if ("\t" in line[:256] and user and len(user.encode(errors="surrogateescape")) < 256
                    and not any(c in " \n\r\f\v" for c in user)):
                doubtful.add(user)
        else:
            throttles.append(t)
    kept = tuple(t for t in throttles if t.user not in doubtful)
    return ThrottleFile(kept, tuple(junk), doubtful=tuple(sorted(doubtful)))


def _parse_line(line: str) -> tuple[Throttle | None, str]:
    fields = line.split("\t")
    if len(fields) != 7:
        return None, f"{len(fields)} tab-separated fields, not 7"
    user, until, mode, value, created, contact, reason = fields
    # the plugin's Lua pattern: no ASCII whitespace anywhere ("#" first would be a comment)
    if not user or any(c in " \t\n\r\f\v" for c in user):
        return None, "not a user name"
    if mode not in MODES:
        return None, "unknown mode"
    if not all(f.isdigit() and f.isascii() and len(f) <= MAX_DIGITS for f in (until, value, created)):
        return None, f"until, value and created must be at most {MAX_DIGITS} digits"
    v = int(value)
    if (mode == "cap" and v < 1) or (mode == "priority" and v < 1):
        return None, f"a {mode} of 0"
    if not (times.in_range(int(until)) and times.in_range(int(created))):
        return None, f"a time outside {times.RANGE_TEXT}"
    return Throttle(user, int(until), mode, v, int(created), contact, reason), ""
