"""Strict JSON value checks for gpuslurm's own cache files (the hooks' node identities, pick's
parsed bundles): exactly the type written, else ValueError, which the caller turns into "parse
the bundle again". No typing import: pick's start-up path reads these."""

from __future__ import annotations

from gpuslurm.tuples import TYPE_CHECKING

if TYPE_CHECKING:
    from typing import Any


def as_list(value: Any) -> list[Any]:
    if type(value) is not list:
        raise ValueError(f"not an array: {value!r}")
    return value


def as_int(value: Any) -> int:
    if type(value) is not int:
        raise ValueError(f"not an integer: {value!r}")
    return value


def opt_int(value: Any) -> int | None:
    return None if value is None else as_int(value)


def opt_bool(value: Any) -> bool | None:
    if value is not None and type(value) is not bool:
        raise ValueError(f"not true, false or null: {value!r}")
    return value


def as_text(value: Any) -> str:
    if type(value) is not str:
        raise ValueError(f"not a string: {value!r}")
    return value


def opt_text(value: Any) -> str | None:
    return None if value is None else as_text(value)
