"""/proc is read only through :mod:`gpuslurm.hw.live.procfs`: no other module in src/ names a /proc path.

Neither ruff's banned-api nor import-linter sees a string path, so this test reads every module's
syntax tree for string literals (f-strings' literal parts too) that are /proc paths. Docstrings
and comments may mention /proc; they read nothing.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src" / "gpuslurm"
DOOR = Path("hw/live/procfs.py")
# Modules that may still read /proc themselves, each with its reason: none now (pick's read moved
# to hw/live/procfs.owner_uid with its use case). A new /proc read goes through hw/live/procfs.py.
ALLOWED: set[Path] = set()
PROC_PATH = re.compile(r"^/proc(?:/|$)")


def _docstrings(tree: ast.AST) -> set[int]:
    """ids of the docstring nodes of the module, its classes and functions."""
    found: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
                    and isinstance(body[0].value.value, str):
                found.add(id(body[0].value))
    return found


def proc_paths(source: str) -> list[tuple[int, str]]:
    """(line, text) of each string literal in ``source`` that is a /proc path (an f-string's is
    its first literal part); docstrings and comments are not code."""
    tree = ast.parse(source)
    skip = _docstrings(tree)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.JoinedStr):
            first = node.values[0] if node.values else None
            if isinstance(first, ast.Constant) and isinstance(first.value, str) \
                    and PROC_PATH.match(first.value):
                found.append((node.lineno, first.value))
            for part in node.values:  # the literal parts were seen here: not again below
                skip.add(id(part))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skip \
                and PROC_PATH.match(node.value):
            found.append((node.lineno, node.value))
    return sorted(found)


def _modules() -> list[Path]:
    return sorted(p.relative_to(SRC) for p in SRC.rglob("*.py"))


def test_no_module_but_procfs_names_a_proc_path() -> None:
    offenders = {str(rel): proc_paths((SRC / rel).read_text()) for rel in _modules()
                 if rel != DOOR and rel not in ALLOWED}
    assert {k: v for k, v in offenders.items() if v} == {}


def test_the_allowlist_is_only_what_still_reads_proc() -> None:
    """An allowed module that no longer names /proc leaves the list (so it cannot come back)."""
    assert all(proc_paths((SRC / rel).read_text()) for rel in ALLOWED)
    assert proc_paths((SRC / DOOR).read_text())  # the door itself does


@pytest.mark.parametrize(("source", "expected"), [
    ('open(f"/proc/{pid}/cgroup")', [(1, "/proc/")]),
    ('PATH = "/proc/devices"', [(1, "/proc/devices")]),
    ('root = Path("/proc")', [(1, "/proc")]),
    ('"""Reads /proc/devices."""\n', []),  # a docstring
    ('x = 1  # /proc/devices\n', []),  # a comment
    ('def f():\n    """From ``/proc/PID/status``."""\n', []),
    ('raise E("add it (/proc/driver/nvidia-caps/mig-minors)")', []),  # a message, not a path
    ('p = "/procedure"', []),
    ('p = f"{root}/proc/{pid}"', []),  # below a root the caller gives: not /proc itself
])
def test_what_counts_as_a_proc_path(source: str, expected: list[tuple[int, str]]) -> None:
    assert proc_paths(source) == expected
