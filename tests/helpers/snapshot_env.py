"""What every snapshot case shares: where things are, the environment a case runs in, and what
is normalised in what it prints (tests/cli/test_snapshot.py says why)."""

from __future__ import annotations

import calendar
import contextlib
import json
import os
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from unittest import mock

TESTS = Path(__file__).resolve().parents[1]
HERE = TESTS / "cli" / "snapshot"  # golden.json
REPO = TESTS.parent
REAL = REPO.parent / "shared" / "fixtures" / "real"



_CLOCK = re.compile(r"\b(\d{4})-(\d\d)-(\d\d)[ T](\d\d):(\d\d)(?::(\d\d))?\b")
NEAR_NOW_S = 2 * 86400  # a time this close to the run's is the run's clock, not a recorded fact


def _now(epoch: float) -> bool:
    return abs(epoch - time.time()) < NEAR_NOW_S


def _clock(match: re.Match[str]) -> str:
    y, mo, d, h, mi, s = (int(g or 0) for g in match.groups())
    try:
        epoch = calendar.timegm((y, mo, d, h, mi, s, 0, 0, 0))
    except (OverflowError, ValueError):
        return match.group(0)
    return "<time>" if _now(epoch) else match.group(0)


def normalise(text: str, site: Path, world: Path) -> str:
    """Paths that differ between checkouts and runs become placeholders, times of the run's own
    clock <time> (see test_snapshot.py)."""
    for path, name in ((site, "<site>"), (world, "<bundles>"), (REAL, "<real>"), (REPO, "<repo>")):
        text = text.replace(str(path.resolve()), name).replace(str(path), name)
    return _CLOCK.sub(_clock, text)


def _scrub(doc: Any) -> Any:
    """JSON with the run's own clock (epoch seconds near now) as <time>."""
    if isinstance(doc, dict):
        return {k: _scrub(v) for k, v in doc.items()}
    if isinstance(doc, list):
        return [_scrub(v) for v in doc]
    if isinstance(doc, int | float) and not isinstance(doc, bool) and _now(doc):
        return "<time>"
    return doc


def stdout_record(text: str, as_json: bool) -> Any:
    """JSON as data (one document, or JSON lines), anything else as its lines."""
    if as_json and text.strip():
        try:
            return _scrub(json.loads(text))
        except ValueError:
            pass
        try:
            return [_scrub(json.loads(line)) for line in text.splitlines()]
        except ValueError:
            pass
    return text.splitlines()


def first_line(text: str) -> str:
    return text.splitlines()[0] if text.strip() else ""


# The environment every case runs in: nothing of the caller's but what a shell always has, and a
# fixed zone and terminal width (the tables fit the width; times print in local time).
BASE_ENV = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8", "TZ": "UTC", "COLUMNS": "100",
            "LINES": "40"}


@contextlib.contextmanager
def environ(env: dict[str, str], clear: bool = False) -> Iterator[None]:
    """``env`` as the whole environment (``clear``: as slurmd gives a hook, nothing else)."""
    with mock.patch.dict(os.environ, {**({} if clear else BASE_ENV), **env}, clear=True):
        time.tzset()
        yield
    time.tzset()


