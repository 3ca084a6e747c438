"""docs/health.md's table of Xids is the code's: class, recovery and default action per Xid."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuslurm.config import XidCheck
from gpuslurm.policy import xid

DOC = Path(__file__).resolve().parents[2] / "docs" / "health.md"
HEADER = "| Xid | what | cause (NVIDIA's catalog) | recovery | default |"
OTHER = 10**6  # a code no table will hold


def _doc() -> str:
    if not DOC.is_file():
        pytest.skip("docs/health.md is not in this checkout (sdist)")
    return DOC.read_text()


def _rows(text: str) -> dict[str, tuple[str, ...]]:
    """The table's rows by their first cell: ``{"79": (what, cause, recovery, default)}``."""
    assert HEADER in text, f"docs/health.md has no table headed {HEADER}"
    body = text.split(HEADER, 1)[1].split("\n\n", 1)[0].strip().splitlines()[1:]  # past | --- |
    rows = {}
    for line in body:
        cells = tuple(c.strip() for c in line.strip().strip("|").split("|"))
        assert len(cells) == 5, line
        assert cells[0] not in rows, f"Xid {cells[0]} is in the table twice"
        rows[cells[0]] = cells[1:]
    return rows


def _default(code: int) -> str:
    """What the shipped ``[health.xid]`` does about ``code``, in the table's words."""
    cfg = XidCheck()
    if xid.classify(code).kind == xid.RECORD:
        return "never a fault"
    return cfg.action if xid.is_fault(code, cfg.ignore) else "ignored"


def _want() -> dict[str, tuple[str, ...]]:
    want = {str(c): (i.what, i.kind, i.recovery, _default(c)) for c, i in xid.XID_TABLE.items()}
    other = xid.classify(OTHER)
    want["any other"] = (other.what, other.kind, other.recovery, _default(OTHER))
    return want


def test_the_docs_table_is_the_xid_table_and_the_default_config() -> None:
    assert _rows(_doc()) == _want()


def test_no_application_xid_acts_by_default() -> None:
    rows = _rows(_doc())
    acting = [code for code, (_, kind, _, default) in rows.items()
              if kind == xid.APPLICATION and default != "ignored"]
    assert acting == []
    for code in (13, 31, 43, 45):  # the ones a user's own program raises at will
        assert rows[str(code)][1:] == (xid.APPLICATION, xid.NONE, "ignored")


def test_the_checker_sees_a_row_that_differs() -> None:
    row = "| 79 | GPU has fallen off the bus | hardware | reboot | drain |"
    text = _doc()
    assert row in text
    assert _rows(text.replace(row, row.replace("reboot", "reset"))) != _want()
    assert _rows(text.replace(row + "\n", "")) != _want()
