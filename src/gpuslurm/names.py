"""Node names gpuslurm writes into files and commands: Slurm's hostname rules, checked once.

A name is letters, digits, ``-``, ``_`` and ``.`` (RFC 1123 labels, plus the underscore Slurm
accepts), starting with a letter or digit, at most 64 characters (HOST_NAME_MAX). Where a file
takes a host list (gres.conf ``NodeName=``), bracketed numeric ranges (``gpu[01-04,7]``) and
commas between names are allowed too. Nothing else: a space, ``=``, ``#`` or a newline in a name
would start a new key or line in gres.conf / slurm.conf.
"""

from __future__ import annotations

import re

from gpuslurm.errors import InputError

MAX_NAME = 64
MAX_LIST = 1024
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*\Z")
_RANGED = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9_.-]|\[[0-9]+(?:-[0-9]+)?(?:,[0-9]+(?:-[0-9]+)?)*\])*\Z")


def check_node_name(name: str, *, source: str = "node name", hostlist: bool = False) -> str:
    """``name`` if it is a Slurm node name (with ``hostlist``: a host-list expression); else InputError."""
    ok = isinstance(name, str) and name.isascii()
    if ok and hostlist:
        ok = 0 < len(name) <= MAX_LIST and all(
            _RANGED.match(part) and len(part) <= MAX_NAME for part in _split_top(name))
    elif ok:
        ok = 0 < len(name) <= MAX_NAME and _NAME.match(name) is not None
    if not ok:
        shown = repr(name) if len(repr(name)) <= 80 else repr(name)[:77] + "..."
        raise InputError(f"not a node name{' list' if hostlist else ''}: {shown} "
                         "(letters, digits, '-', '_', '.')", source=source)
    return name


def _split_top(text: str) -> list[str]:
    """``text`` split at commas outside brackets."""
    parts, depth, start = [], 0, 0
    for i, c in enumerate(text):
        depth += c == "["
        depth -= c == "]"
        if c == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    return parts
