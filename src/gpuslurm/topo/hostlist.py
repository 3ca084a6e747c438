"""Slurm's bracketed list syntax (pure): host lists and device-file lists.

``NodeName=gpu[01-04,07]`` and ``File=/dev/nvidia[0-3]`` use the same notation: comma-separated
items, each with optional ``[a-b,c]`` ranges; a zero-padded lower bound fixes the number width.
Raises ValueError on unbalanced brackets or bad numbers.
"""

from __future__ import annotations


def expand_hostlist(expr: str) -> tuple[str, ...]:
    """Expand ``gpu[01-03],login1`` or ``/dev/nvidia[0-1],/dev/x`` into names, in order."""
    paths: list[str] = []
    for item in _split_top_level(expr):
        paths.extend(_expand_brackets(item))
    return tuple(paths)


def _split_top_level(expr: str) -> list[str]:
    items, depth, start = [], 0, 0
    for i, ch in enumerate(expr):
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
            if depth < 0:
                raise ValueError(f"unbalanced ']' in {expr!r}")
        elif ch == "," and depth == 0:
            items.append(expr[start:i])
            start = i + 1
    if depth:
        raise ValueError(f"unbalanced '[' in {expr!r}")
    items.append(expr[start:])
    return [s for s in items if s]


def _expand_brackets(item: str) -> list[str]:
    open_at = item.find("[")
    if open_at < 0:
        return [item]
    close_at = item.index("]", open_at)
    head, body, tail = item[:open_at], item[open_at + 1:close_at], item[close_at + 1:]
    out: list[str] = []
    for part in body.split(","):
        lo, sep, hi = part.partition("-")
        # Like Slurm's hostlists, a zero-padded lower bound fixes the width of every number.
        width = len(lo) if lo.startswith("0") and len(lo) > 1 else 0
        for n in range(int(lo), int(hi if sep else lo) + 1):
            out.extend(head + str(n).zfill(width) + rest for rest in _expand_brackets(tail))
    return out
