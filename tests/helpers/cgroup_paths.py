"""A real process moved into a real cgroup made for the test (root only), for any test directory
(tests/watch)."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def in_cgroup(root: Path, relative: str, pid: int) -> Iterator[Path]:
    """Create ``root/relative`` (only the missing parts), move ``pid`` in; undo it all after."""
    made: list[Path] = []
    path = root
    for part in relative.strip("/").split("/"):
        path = path / part
        if not path.exists():
            path.mkdir()
            made.append(path)
    (path / "cgroup.procs").write_text(f"{pid}\n")
    try:
        yield path
    finally:
        # the process must leave (or die) before rmdir; move it back to the root first
        with contextlib.suppress(OSError):
            (root / "cgroup.procs").write_text(f"{pid}\n")
        for p in reversed(made):
            for _ in range(50):
                try:
                    p.rmdir()
                    break
                except OSError:
                    time.sleep(0.05)
