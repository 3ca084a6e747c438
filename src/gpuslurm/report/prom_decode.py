"""Prometheus' answers as the report's values: labels, numbers, selectors and checked means."""

from __future__ import annotations

import json
import math
import re
import time
from collections.abc import Iterator
from typing import Any

from gpuslurm.report.prom_client import Key
from gpuslurm.state.store_values import MAX_PCT, Checked

Matrix = dict[Key, dict[int, float]]  # series → bucket index → value


def label(key: Key, name: str) -> str:
    for k, v in key:
        if k == name:
            return v
    return ""


def device(key: Key) -> str:
    return label(key, "mig_uuid") or label(key, "gpu_uuid")


def proc_order(key: Key) -> tuple[str, str, int, str]:
    pid = label(key, "pid")
    number = int(pid) if pid.isascii() and pid.isdigit() and len(pid) <= 10 else 0
    return (label(key, "node"), device(key), number, label(key, "job_id"))


def value(item: dict[str, Any], nan: bool = False) -> float | None:
    value = item.get("value")
    return as_float(value[1], nan) if isinstance(value, list) and len(value) == 2 else None


def as_float(text: object, nan: bool = False) -> float | None:
    """A JSON value as a number; NaN as None unless ``nan`` (where a NaN is a damaged sample to
    refuse, not a gap)."""
    if not isinstance(text, (str, int, float)):  # what float() takes of JSON's values
        return None
    try:
        value = float(text)
    except ValueError:
        return None
    return None if math.isnan(value) and not nan else value


def sample_times(item: dict[str, Any]) -> Iterator[float]:
    """The finite sample times of a range vector's series (anything else in a forged answer: none)."""
    values = item.get("values")
    for pair in values if isinstance(values, list) else ():
        t = as_float(pair[0]) if isinstance(pair, list) and len(pair) == 2 else None
        if t is not None and math.isfinite(t):
            yield t


def ms(seconds: float) -> int:
    return max(1, round(seconds * 1000))


def seen(count: float, device_samples: float | None) -> float:
    """As SQLite: a process's samples over its device's samples in the bucket."""
    if not count:
        return 0.0
    return 1.0 if not device_samples else min(count / device_samples, 1.0)


def checked(check: Checked, means: dict[int, float], name: str, key: Key) -> dict[int, float]:
    """``means`` (a series' mean utilisation ratio per bucket) in percent, refused as SQLite's store
    refuses its rows when one is not a percentage: one validation for both sources."""
    out = {b: v * 100.0 for b, v in means.items()}
    if all(0.0 <= v <= MAX_PCT for v in out.values()):  # the common case, without a call per value
        return out
    where = f"{name}{{{','.join(f'{k}={json.dumps(v)}' for k, v in key)}}} (a bucket's mean, in %)"
    return {b: check.pct(v, where[:300]) for b, v in out.items()}


def selector(*matchers: str) -> str:
    return "{" + ",".join(m for m in matchers if m) + "}"


def node_matcher(nodes: list[str]) -> str:
    """``node=~"a|b"`` for these nodes (their names escaped for RE2, then for PromQL's string)."""
    alternatives = "|".join(re.sub(r"([\\.+*?()|\[\]{}^$])", r"\\\1", n) for n in nodes)
    return "node=~" + json.dumps(alternatives)


def iso(ts: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S %Z", time.localtime(ts))
