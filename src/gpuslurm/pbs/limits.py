"""PBS's own per-user GPU limit: the server's ``max_run_res.ngpus = [u:NAME=N]``.

This is PBS's native form of load-aware admission (``gpuslurm throttle auto``,
:mod:`gpuslurm.pbs.admission`): a user over the limit keeps their jobs queued (the scheduler's
comment says which limit), nothing is refused. :func:`set_user_gpu_limits` owns the whole value;
``throttle auto`` changes one user's entry at a time and keeps every other entry (other users',
groups', projects', ``PBS_GENERIC``) as it was (:func:`with_user_limit`).
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


def parse_limit_entries(text: str) -> list[tuple[str, str, int]]:
    """``[u:alice=2], [g:staff=8]`` → ``[("u", "alice", 2), ("g", "staff", 8)]``, in order; InputError
    when it is not such a list, or an entry could not be written back inside qmgr's double quotes."""
    out: list[tuple[str, str, int]] = []
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
        if not colon or not eq or not name or not (value.isascii() and value.isdigit() and len(value) <= 9) \
                or not name.strip().isprintable() or '"' in name:
            raise InputError(f"not [kind:name=N]: {rest[:end + 1][:40]!r}", source="max_run_res.ngpus")
        out.append((kind.strip(), name.strip(), int(value)))
        rest = rest[end + 1:].lstrip().removeprefix(",").lstrip()
    return out


def parse_user_limits(text: str) -> dict[str, int]:
    """``[u:alice=2], [u:PBS_GENERIC=4]`` → ``{"alice": 2, "PBS_GENERIC": 4}``; other kinds of entry
    (``[g:...]``, ``[p:...]``, ``[o:...]``) are left out. InputError when it is not such a list."""
    return {name: n for kind, name, n in parse_limit_entries(text) if kind == "u"}


def with_user_limit(entries: list[tuple[str, str, int]], user: str,
                    limit: int | None) -> list[tuple[str, str, int]]:
    """``entries`` with ``user``'s own entry set to ``limit`` (None: removed); every other entry
    (other users, groups, projects, ``PBS_GENERIC``) kept as it was, in its place."""
    check_user(user)
    if limit is not None and (isinstance(limit, bool) or not 0 <= limit <= MAX_LIMIT):
        raise InputError(f"{user}: a GPU limit must be 0..{MAX_LIMIT}, not {limit!r}",
                         source="max_run_res.ngpus")
    kept = [e for e in entries if not (e[0] == "u" and e[1] == user)]
    if limit is None:
        return kept
    at = next((i for i, e in enumerate(entries) if e[0] == "u" and e[1] == user), len(kept))
    return [*kept[:at], ("u", user, limit), *kept[at:]]


def format_entries(entries: list[tuple[str, str, int]]) -> str:
    """The entries as qmgr takes them: ``[u:alice=2],[g:staff=8]``."""
    return ",".join(f"[{kind}:{name}={n}]" for kind, name, n in entries)


def read_gpu_limit_text(qstat: str, *, timeout: float) -> str:
    """The server's ``max_run_res.ngpus`` as it is ("" when unset): ``qstat -B -f -F json``."""
    result = run_command([qstat, "-B", "-f", "-F", "json"], timeout=timeout)
    try:
        doc = json.loads(result.stdout, object_pairs_hook=_joined)
    except (ValueError, RecursionError):
        raise InputError("not valid JSON", source="qstat -B -f -F json") from None
    servers = doc.get("Server") if isinstance(doc, dict) else None
    if not isinstance(servers, dict):
        raise InputError("no 'Server' object", source="qstat -B -f -F json")
    for attrs in servers.values():
        limits = attrs.get("max_run_res", {}) if isinstance(attrs, dict) else {}
        value = limits.get("ngpus") if isinstance(limits, dict) else None
        if isinstance(value, str):
            return value
    return ""


def _joined(pairs: list[tuple[str, object]]) -> dict[str, object]:
    """A JSON object whose repeated keys keep every value: qstat prints each entry of a limit list
    as its own ``"ngpus": "[u:...]"`` (seen with OpenPBS 23.06), and a plain dict keeps the last."""
    out: dict[str, object] = {}
    for key, value in pairs:
        before = out.get(key)
        out[key] = f"{before},{value}" if isinstance(before, str) and isinstance(value, str) else value
    return out


def set_gpu_limit_entries(qmgr: str, entries: list[tuple[str, str, int]], *, timeout: float) -> str:
    """Make the server's ``max_run_res.ngpus`` exactly ``entries`` (unset when empty); the value set.
    Every name was checked by :func:`parse_limit_entries` or :func:`with_user_limit`: none holds a
    double quote, so none can end the quoted value and reach qmgr as a command."""
    if not entries:
        run_command([qmgr, "-c", "unset server max_run_res.ngpus"], timeout=timeout)
        return ""
    value = format_entries(entries)
    if '"' in value or not value.isprintable():
        raise InputError(f"refusing to write {value[:60]!r}", source="max_run_res.ngpus")
    run_command([qmgr, "-c", f'set server max_run_res.ngpus = "{value}"'], timeout=timeout)
    return value


def read_user_gpu_limits(qstat: str, *, timeout: float) -> dict[str, int]:
    """The server's per-user ngpus limits now (``qstat -B -f -F json``); {} when none is set."""
    return parse_user_limits(read_gpu_limit_text(qstat, timeout=timeout))


def set_user_gpu_limits(qmgr: str, limits: Mapping[str, int], *, timeout: float) -> str:
    """Make the server's ``max_run_res.ngpus`` exactly ``limits`` (unset when empty); the value set."""
    if not limits:
        run_command([qmgr, "-c", "unset server max_run_res.ngpus"], timeout=timeout)
        return ""
    value = format_user_limits(limits)
    run_command([qmgr, "-c", f'set server max_run_res.ngpus = "{value}"'], timeout=timeout)
    return value
