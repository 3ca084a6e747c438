"""Parse the values a placement request is made of: sizes, compute capabilities, percentages (pure).

Durations (``--timeout``, ``--poll``) go through :func:`gpuslurm.times.parse_duration`, the one
bounded duration parser.

Every parser raises ValueError with a message that names the text; the CLI adds the option.
"""

from __future__ import annotations

import re

from gpuslurm.tuples import NamedTuple

# Patterns, compiled on first use by re's own cache: most picks parse none of them, and each
# compile costs a measurable part of pick's start-up.
_SIZE_RE = r"(?i)^\s*(\d+(?:\.\d+)?)\s*([KMGT]i?B?|B)?\s*$"
_UNIT_MIB = {"": 1.0, "B": 1 / 2**20, "K": 1 / 1024, "M": 1.0, "G": 1024.0, "T": 1024.0**2}
_CC_RE = r"^\s*(\d{1,2})\.(\d{1,2})\s*$"


def parse_size_mib(text: str) -> float:
    """``6GiB`` / ``6G`` / ``512MiB`` / ``1.5T`` → MiB; a bare number is MiB. Binary units only.

    ``G`` and ``GB`` mean GiB, as nvidia-smi and Slurm's ``--mem`` use them.
    """
    m = re.match(_SIZE_RE, text)
    if m is None:
        raise ValueError(f"not a size: {text!r} (e.g. 6GiB, 512MiB, 40G)")
    unit = (m.group(2) or "").upper().rstrip("B").rstrip("I")
    if m.group(2) and m.group(2).upper() == "B":
        unit = "B"
    return float(m.group(1)) * _UNIT_MIB[unit]


def parse_cc(text: str) -> tuple[int, int]:
    """``8.0`` → ``(8, 0)``."""
    m = re.match(_CC_RE, text)
    if m is None:
        raise ValueError(f"not a compute capability: {text!r} (e.g. 8.0)")
    return int(m.group(1)), int(m.group(2))


def parse_percent(text: str) -> float:
    """``50`` or ``50%`` → 50.0, within 0..100."""
    t = text.strip().removesuffix("%")
    try:
        value = float(t)
    except ValueError:
        raise ValueError(f"not a percentage: {text!r}") from None
    if not 0 <= value <= 100:
        raise ValueError(f"not a percentage between 0 and 100: {text!r}")
    return value


class Request(NamedTuple):
    """What the caller asks for; None/False: no such constraint."""

    n: int  # how many devices (NamedTuple reserves "count")
    mem_mib: float | None = None  # free memory per device
    min_cc: tuple[int, int] | None = None
    type_text: str | None = None  # case-insensitive substring of the GPU name
    mig_profile: str | None = None  # pick MIG devices of this profile instead of whole GPUs
    exclusive: bool = False  # no process of anyone else on the device
    max_util: float | None = None  # percent
