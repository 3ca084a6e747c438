"""A bundle's ``health.json`` (pure): per-GPU health facts keyed by GPU UUID::

    {"GPU-…": {"lost": false, "xid": [79], "temperature_c": 95, "ecc_uncorrectable": 0,
               "retired_pages_pending": false, "remap_pending": false, "remap_failed": false,
               "memory_used_mib": 0, "processes": [{"pid": 4242, "user": "alice", "used_mib": 900}],
               "clock_events": ["hw_thermal"]}}

Every key is optional; a GPU or key the file does not mention is unknown, and unknown facts never
fail a check. An unknown key is an error, so a typo cannot silently turn a check off.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from gpuslurm.errors import CaptureError
from gpuslurm.hw.model.health import CLOCK_EVENTS, GpuHealth, GpuProcess
from gpuslurm.tuples import TYPE_CHECKING  # typing is not imported on the hooks' path

if TYPE_CHECKING:
    from typing import Any

_BOOL_KEYS = ("lost", "retired_pages_pending", "remap_pending", "remap_failed")
_INT_KEYS = ("temperature_c", "ecc_uncorrectable", "memory_used_mib")


def parse_scenario(text: str, source: str, uuids: Sequence[str]) -> dict[str, GpuHealth]:
    """Parse a ``health.json`` text (pure); every entry is validated, wanted or not."""
    try:
        doc = json.loads(text)
    except ValueError as exc:
        raise CaptureError(f"not valid JSON: {exc}", source=source) from None
    if not isinstance(doc, dict):
        raise CaptureError("must be a JSON object keyed by GPU UUID", source=source)
    parsed = {key.lower(): _entry(key, value, source) for key, value in doc.items()}
    return {u: parsed[u.lower()]._replace(uuid=u) if u.lower() in parsed else GpuHealth(u)
            for u in uuids}


def _entry(uuid: str, value: Any, source: str) -> GpuHealth:
    name = uuid if uuid.isascii() and uuid.isprintable() else repr(uuid)  # a key may hold anything
    if not isinstance(value, dict):
        raise CaptureError(f"{name}: must be an object", source=source)
    fields: dict[str, Any] = {}
    for key, item in value.items():
        where = f"{name}: {key!r}"
        if key in _BOOL_KEYS:
            if not isinstance(item, bool):
                raise CaptureError(f"{where} must be true or false", source=source)
            fields[key] = item
        elif key in _INT_KEYS:
            fields[key] = _int(item, where, source)
        elif key == "xid":
            if not isinstance(item, list):
                raise CaptureError(f"{where} must be a list of Xid codes", source=source)
            fields[key] = tuple(_int(x, where, source) for x in item)
        elif key == "clock_events":
            if not isinstance(item, list) or any(x not in CLOCK_EVENTS for x in item):
                raise CaptureError(f"{where} must be a list of {', '.join(CLOCK_EVENTS)}", source=source)
            fields[key] = tuple(sorted(set(item), key=list(CLOCK_EVENTS).index))
        elif key == "processes":
            if not isinstance(item, list):
                raise CaptureError(f"{where} must be a list of processes", source=source)
            fields[key] = tuple(_process(p, where, source) for p in item)
        else:
            raise CaptureError(f"{name}: unknown key {key!r}", source=source)
    return GpuHealth(uuid, **fields)


def _process(item: Any, where: str, source: str) -> GpuProcess:
    if not isinstance(item, dict) or "pid" not in item:
        raise CaptureError(f"{where}: each process must be an object with a pid", source=source)
    if extra := set(item) - {"pid", "user", "used_mib"}:
        raise CaptureError(f"{where}: unknown process key {sorted(extra)[0]!r}", source=source)
    user = item.get("user")
    if user is not None and not isinstance(user, str):
        raise CaptureError(f"{where}: a process user must be a string", source=source)
    used = item.get("used_mib")
    return GpuProcess(_int(item["pid"], where, source), user,
                      None if used is None else _int(used, where, source))


def _int(item: Any, where: str, source: str) -> int:
    if not isinstance(item, int) or isinstance(item, bool) or item < 0:
        raise CaptureError(f"{where} must be a whole number, not {item!r}", source=source)
    return item
