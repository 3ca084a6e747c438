"""Slurm's bracketed list syntax, expanded by ClusterShell's NodeSet, bounded first.

``NodeName=gpu[01-04,07]``, squeue's ``nodes`` and ``File=/dev/nvidia[0-3]`` share one notation:
comma-separated items, each with ``[a-b,c]`` groups; a zero-padded first number fixes the width.
NodeSet expands every element it is given, so the number of names is counted here from the
brackets (nothing expanded) and refused above ``MAX_NAMES`` before NodeSet sees the text.
ClusterShell is imported only when a list has brackets: the hooks never pay for it.
Raises ValueError for anything malformed.
"""

from __future__ import annotations

from gpuslurm.ranges import MAX_HOST_NUMBER, MAX_NAMES, range_bounds

MAX_DIGITS = 18  # the longest number in a host or file name


def expand_hostlist(expr: str, limit: int = MAX_NAMES) -> tuple[str, ...]:
    """``gpu[01-03],login1`` or ``/dev/nvidia[0-1],/dev/x`` → the names, items in written order."""
    items = _split_top_level(expr)
    total = sum(_count(item, limit) for item in items)
    if total > limit:
        raise ValueError(f"{expr!r} names more than {limit} hosts or files")
    names: list[str] = []
    for item in items:
        if "[" not in item:
            names.append(item)
            continue
        from ClusterShell.NodeSet import NodeSet, NodeSetException  # only for bracketed lists

        try:
            names.extend(NodeSet(item))
        except (NodeSetException, AssertionError, ValueError, OverflowError) as exc:
            # ClusterShell checks some of its input with assert (e.g. "range too large")
            raise ValueError(f"bad list {item!r}: {exc or type(exc).__name__}") from None
    return tuple(names)


def _count(item: str, limit: int) -> int:
    """How many names ``item`` expands to, from its bracket groups alone."""
    count = 1
    rest = item
    digits = max((len(run) for run in "".join(c if c.isdigit() else " " for c in item).split()), default=0)
    if digits > MAX_DIGITS:  # NodeSet reads digits beside a bracket as one range: 10**40 names
        raise ValueError(f"a number of more than {MAX_DIGITS} digits in {item!r}")
    while "[" in rest:
        head, _, rest = rest.partition("[")
        body, sep, rest = rest.partition("]")
        if not sep or "[" in body:
            raise ValueError(f"unbalanced '[' in {item!r}")
        if "]" in head:
            raise ValueError(f"unbalanced ']' in {item!r}")
        count *= sum(last - first + 1 for first, last, _ in range_bounds(body, MAX_HOST_NUMBER, limit))
        if count > limit:
            raise ValueError(f"{item!r} names more than {limit} hosts or files")
    if "]" in rest:
        raise ValueError(f"unbalanced ']' in {item!r}")
    return count


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
            items.append(expr[start:i].strip())
            start = i + 1
    if depth:
        raise ValueError(f"unbalanced '[' in {expr!r}")
    items.append(expr[start:].strip())
    return [s for s in items if s]
