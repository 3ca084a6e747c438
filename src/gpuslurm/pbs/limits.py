"""PBS's own per-user GPU limit: the server's ``max_run_res.ngpus = [u:NAME=N]``.

This is PBS's native form of load-aware admission (the placement issue's ``throttle auto``): a user
over the limit keeps their jobs queued (the scheduler's comment says which limit), nothing is
refused. gpuslurm owns the whole value of ``max_run_res.ngpus`` when it sets it; an empty set of
limits unsets it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping

from gpuslurm.errors import InputError
from gpuslurm.policy.throttle import check_user
from gpuslurm.runner import run_command

MAX_LIMIT = 1_000_000
MAX_USERS = 10_000


def format_user_limits(limits: Mapping[str, int]) -> str:
    """``{"alice": 2, "bob": 0}`` → ``[u:alice=2],[u:bob=0]`` (sorted); InputError on a bad name or
    count. ``PBS_GENERIC`` is PBS's name for "every other user"."""
    if len(limits) > MAX_USERS:
        raise InputError(f"more than {MAX_USERS} users", source="max_run_res.ngpus")
    parts = []
    for user, count in sorted(limits.items()):
        if user != "PBS_GENERIC":
            check_user(user)
        if isinstance(count, bool) or not isinstance(count, int) or not 0 <= count <= MAX_LIMIT:
            raise InputError(f"{user}: a GPU limit must be 0..{MAX_LIMIT}, not {count!r}",
                             source="max_run_res.ngpus")
        parts.append(f"[u:{user}={count}]")
    return ",".join(parts)


def parse_user_limits(text: str) -> dict[str, int]:
    """``[u:alice=2], [u:PBS_GENERIC=4]`` → ``{"alice": 2, "PBS_GENERIC": 4}``; other kinds of entry
    (``[g:...]``, ``[p:...]``, ``[o:...]``) are left out. InputError when it is not such a list."""
    out: dict[str, int] = {}
    rest = text.strip()
    if len(rest) > 1 << 20:
        raise InputError("longer than 1 MiB", source="max_run_res.ngpus")
    while rest:
        if not rest.startswith("["):
            raise InputError(f"not a limit list: {rest[:40]!r}", source="max_run_res.ngpus")
        end = rest.find("]")
        if end < 0:
            raise InputError(f"unclosed entry: {rest[:40]!r}", source="max_run_res.ngpus")
        kind, colon, body = rest[1:end].partition(":")
        name, eq, value = body.rpartition("=")
        if not colon or not eq or not name or not (value.isascii() and value.isdigit() and len(value) <= 9):
            raise InputError(f"not [kind:name=N]: {rest[:end + 1][:40]!r}", source="max_run_res.ngpus")
        if kind.strip() == "u":
            out[name.strip()] = int(value)
        rest = rest[end + 1:].lstrip().removeprefix(",").lstrip()
    return out


def read_user_gpu_limits(qstat: str, *, timeout: float) -> dict[str, int]:
    """The server's per-user ngpus limits now (``qstat -B -f -F json``); {} when none is set."""
    result = run_command([qstat, "-B", "-f", "-F", "json"], timeout=timeout)
    try:
        doc = json.loads(result.stdout)
    except (ValueError, RecursionError):
        raise InputError("not valid JSON", source="qstat -B -f -F json") from None
    servers = doc.get("Server") if isinstance(doc, dict) else None
    if not isinstance(servers, dict):
        raise InputError("no 'Server' object", source="qstat -B -f -F json")
    for attrs in servers.values():
        limits = attrs.get("max_run_res", {}) if isinstance(attrs, dict) else {}
        value = limits.get("ngpus") if isinstance(limits, dict) else None
        if isinstance(value, str):
            return parse_user_limits(value)
    return {}


def set_user_gpu_limits(qmgr: str, limits: Mapping[str, int], *, timeout: float) -> str:
    """Make the server's ``max_run_res.ngpus`` exactly ``limits`` (unset when empty); the value set."""
    if not limits:
        run_command([qmgr, "-c", "unset server max_run_res.ngpus"], timeout=timeout)
        return ""
    value = format_user_limits(limits)
    run_command([qmgr, "-c", f'set server max_run_res.ngpus = "{value}"'], timeout=timeout)
    return value
