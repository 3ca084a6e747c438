"""Integer range lists as Slurm, the kernel and nvidia-smi write them: ``0-2,5,7-8`` (pure)."""

from __future__ import annotations

from collections.abc import Iterable


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


def parse_ranges(text: str) -> tuple[int, ...]:
    """``"0-2,5"`` → ``(0, 1, 2, 5)``. Raises ValueError on anything else."""
    out: set[int] = set()
    for part in text.strip().split(","):
        part = part.strip()
        if not part:
            raise ValueError(f"empty item in {text!r}")
        lo, sep, hi = part.partition("-")
        if not lo.isdigit() or (sep and not hi.isdigit()):
            raise ValueError(f"not a number or range: {part!r}")
        start, end = int(lo), int(hi) if sep else int(lo)
        if end < start:
            raise ValueError(f"backwards range: {part!r}")
        out.update(range(start, end + 1))
    return tuple(sorted(out))
