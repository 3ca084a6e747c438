"""Integer range lists as Slurm, the kernel and nvidia-smi write them: ``0-2,5,7-8`` (pure).

Every parse takes a ``limit``: the number of things the list can name (CPUs, GPUs, device files).
Each number is checked against it *before* anything is expanded, so ``0-99999999999`` is an error
in microseconds instead of a 3 GB list.
"""

from __future__ import annotations

from gpuslurm.tuples import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Iterable

# What a list can name. Linux's NR_CPUS stops at 8192 today; GPU indices and device-file minors
# (nvidia-caps included) stay far below these.
MAX_CPUS = 1 << 16
MAX_GPUS = 1 << 12
MAX_NAMES = 1 << 16  # host names or device files one list may expand to
MAX_HOST_NUMBER = 10**9  # the number inside a host name (gpu[0001-0004])


def format_ranges(ids: Iterable[int]) -> str:
    """``[0, 1, 2, 5, 7, 8]`` → ``"0-2,5,7-8"`` (Slurm and nvidia-smi both read this form)."""
    values = sorted(set(ids))
    parts: list[str] = []
    i = 0
    while i < len(values):
        j = i
        while j + 1 < len(values) and values[j + 1] == values[j] + 1:
            j += 1
        parts.append(str(values[i]) if i == j else f"{values[i]}-{values[j]}")
        i = j + 1
    return ",".join(parts)


def range_bounds(text: str, limit: int, most: int | None = None) -> tuple[tuple[int, int, int], ...]:
    """``"0-2,05"`` → ``((0, 2, 0), (5, 5, 2))``: each item's first, last and zero-padded width.

    Raises ValueError for anything but ASCII numbers and ``a-b`` ranges, a backwards range, a
    number that is not below ``limit``, or items that together name more than ``most`` values
    (default ``limit``).
    Nothing is expanded.
    """
    out: list[tuple[int, int, int]] = []
    total = 0
    most = limit if most is None else most
    digits = len(str(limit))
    for part in text.strip().split(","):
        part = part.strip()
        if not part:
            raise ValueError(f"empty item in {text!r}")
        lo, sep, hi = part.partition("-")
        if not _is_number(lo) or (sep and not _is_number(hi)):
            raise ValueError(f"not a number or range: {part!r}")
        if len(lo) > digits or len(hi) > digits or int(hi or lo) >= limit:
            raise ValueError(f"{part!r} is beyond the {limit} this list can name")
        first, last = int(lo), int(hi or lo)
        if last < first:
            raise ValueError(f"backwards range: {part!r}")
        total += last - first + 1
        if total > most:
            raise ValueError(f"{text!r} names more than {most} values")
        # A zero-padded first number fixes the width, as in Slurm's host lists.
        out.append((first, last, len(lo) if lo.startswith("0") and len(lo) > 1 else 0))
    return tuple(out)


def parse_ranges(text: str, limit: int) -> tuple[int, ...]:
    """``"0-2,5"`` → ``(0, 1, 2, 5)``, each below ``limit``. Raises ValueError on anything else."""
    out: set[int] = set()
    for first, last, _ in range_bounds(text, limit):
        out.update(range(first, last + 1))
    return tuple(sorted(out))


def _is_number(text: str) -> bool:
    return text.isascii() and text.isdigit()  # str.isdigit alone accepts '²' and Thai digits


def bounded_int(text: str, most: int) -> int:
    """ASCII digits naming a number from 0 to ``most``; ValueError otherwise (before any ``int()``
    of a 5000-digit string, which Python itself refuses with an error of its own)."""
    if not _is_number(text) or len(text) > len(str(most)) or int(text) > most:
        raise ValueError(f"{text[:40]!r} is not a whole number from 0 to {most}")
    return int(text)
