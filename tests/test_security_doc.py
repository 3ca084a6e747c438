"""docs/security.md names a test for every defence, and every test it names exists.

A name is ``tests/<path>.py`` (the file must exist), ``tests/<path>.py::test_x`` or a following
``::test_y`` (the function must be defined in the last file named before it in that section).
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "security.md"
NAME = re.compile(r"(tests/[\w/]+\.py)?(?:::(test_\w+))?")


def _sections() -> dict[str, str]:
    text = DOC.read_text()
    defences = text.split("\n## Defences\n", 1)[1].split("\n## ", 1)[0]
    parts = re.split(r"^### (.+)$", defences, flags=re.M)
    return {title.strip(): body for title, body in zip(parts[1::2], parts[2::2], strict=True)}


def _named(body: str) -> list[tuple[str, str | None]]:
    out: list[tuple[str, str | None]] = []
    current: str | None = None
    for m in re.finditer(r"`((?:tests/[\w/]+\.py)?(?:::test_\w+)?)`", body):
        path, func = NAME.fullmatch(m.group(1)).groups()  # type: ignore[union-attr]
        if path is None and func is None:
            continue
        current = path or current
        assert current is not None, f"{m.group(1)} names no file before it"
        out.append((current, func))
    return out


def test_every_defence_names_a_test() -> None:
    sections = _sections()
    assert len(sections) >= 10
    missing = [title for title, body in sections.items() if not _named(body)]
    assert not missing, f"defences without a named test: {missing}"


def test_every_named_test_exists() -> None:
    wrong = []
    for title, body in _sections().items():
        for path, func in _named(body):
            file = ROOT / path
            if not file.is_file():
                wrong.append(f"{title}: {path} does not exist")
            elif func is not None and not re.search(rf"^def {func}\(", file.read_text(), re.M):
                wrong.append(f"{title}: {path}::{func} is not defined")
    assert not wrong, "\n".join(wrong)


def test_the_checker_sees_a_missing_test() -> None:
    body = "- Tests: `tests/test_times.py::test_no_such_test_here`, `::test_nor_this`."
    assert _named(body) == [("tests/test_times.py", "test_no_such_test_here"),
                            ("tests/test_times.py", "test_nor_this")]
