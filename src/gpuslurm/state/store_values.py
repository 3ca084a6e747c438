"""Every value read back from the monitor's store, checked before anything uses it.

SQLite keeps whatever a row was given: its column types are only preferences, so a ``REAL``
column can hold text or a blob, a ``TEXT`` column a blob, and a number may be infinite. The
monitor writes none of these, but a store is a file: damaged, edited or planted, its rows reach
the report, ``hogs``, ``pick``, the epilog and the monitor's own restart. A value of the wrong
kind becomes :class:`StoreError` naming the table and column (one line, exit 2), never a
TypeError deep inside a report.
"""

from __future__ import annotations

import math
from typing import NoReturn

from gpuslurm.errors import InputError
from gpuslurm.times import TIME_MAX, TIME_MIN

MAX_ID = 2**62  # SQLite rowids, pids, uids: far beyond any real one, and still an exact float
MAX_PCT = 100.0 + 1e-6  # utilisation; a mean of stored percentages may round just above 100


class StoreError(InputError):
    """The store cannot be used: not SQLite, damaged, not gpuslurm's, or from a newer gpuslurm."""


class Checked:
    """Checks for the values of one store (``source`` names it in the error; ``unit`` is what holds
    a value there: a store's row, a Prometheus series)."""

    def __init__(self, source: str, unit: str = "row") -> None:
        self.source = source
        self.unit = unit

    def bad(self, where: str, value: object, wanted: str) -> NoReturn:
        shown = repr(value)
        shown = shown if len(shown) <= 40 else shown[:40] + "…"
        raise StoreError(f"damaged {self.unit}: {where} holds {type(value).__name__} {shown}, not {wanted}",
                         source=self.source)

    def text(self, value: object, where: str) -> str:
        if not isinstance(value, str):
            self.bad(where, value, "text")
        return value

    def opt_text(self, value: object, where: str) -> str | None:
        return None if value is None else self.text(value, where)

    def number(self, value: object, where: str, lo: float = -math.inf, hi: float = math.inf) -> float:
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) \
                or not lo <= value <= hi:
            self.bad(where, value, f"a number in {lo:g}..{hi:g}" if math.isfinite(lo) else "a number")
        return float(value)

    def opt_number(self, value: object, where: str, lo: float = -math.inf,
                   hi: float = math.inf) -> float | None:
        return None if value is None else self.number(value, where, lo, hi)

    def time(self, value: object, where: str) -> float:
        return self.number(value, where, TIME_MIN, TIME_MAX)

    def opt_time(self, value: object, where: str) -> float | None:
        return None if value is None else self.time(value, where)

    def whole(self, value: object, where: str, lo: int = 0, hi: int = MAX_ID) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
            self.bad(where, value, f"a whole number in {lo}..{hi}")
        return value

    def opt_whole(self, value: object, where: str, lo: int = 0, hi: int = MAX_ID) -> int | None:
        return None if value is None else self.whole(value, where, lo, hi)

    def pct(self, value: object, where: str) -> float:
        return self.number(value, where, 0.0, MAX_PCT)

    def opt_pct(self, value: object, where: str) -> float | None:
        return None if value is None else self.pct(value, where)
