"""gpuslurm.tuples.NamedTuple behaves as typing.NamedTuple does, and pick's start-up path avoids typing."""

from __future__ import annotations

import keyword
import subprocess
import sys
import typing

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpuslurm.tuples import NamedTuple

_names = st.from_regex(r"[a-z][a-z0-9_]{0,6}", fullmatch=True).filter(lambda n: not keyword.iskeyword(n))


def _make(base: object, fields: list[str], n_defaults: int) -> type:
    lines = ["class Thing(Base):", '    """A thing."""']
    for i, f in enumerate(fields):
        default = f" = {i!r}" if i >= len(fields) - n_defaults else ""
        lines.append(f"    {f}: int | None{default}")
    lines += ["    @property", "    def total(self) -> int:", "        return len(self)",
              "    def __str__(self) -> str:", "        return 'thing'"]
    ns: dict[str, object] = {"Base": base, "__name__": "tests.things"}
    exec("from __future__ import annotations\n" + "\n".join(lines), ns)
    return ns["Thing"]  # type: ignore[return-value]


@given(st.lists(_names, min_size=1, max_size=8, unique=True), st.data())
def test_same_as_typing(fields: list[str], data: st.DataObject) -> None:
    n_defaults = data.draw(st.integers(0, len(fields)))
    ours, theirs = _make(NamedTuple, fields, n_defaults), _make(typing.NamedTuple, fields, n_defaults)
    assert ours._fields == theirs._fields == tuple(fields)  # type: ignore[attr-defined]
    assert ours._field_defaults == theirs._field_defaults  # type: ignore[attr-defined]
    assert ours.__doc__ == theirs.__doc__ == "A thing."
    assert (ours.__module__, ours.__qualname__) == (theirs.__module__, theirs.__qualname__)
    assert list(ours.__annotations__) == list(theirs.__annotations__)  # strings here, ForwardRefs there
    values = data.draw(st.lists(st.integers(), min_size=len(fields) - n_defaults, max_size=len(fields)))
    a, b = ours(*values), theirs(*values)
    assert tuple(a) == tuple(b) and repr(a) == repr(b) and str(a) == str(b) == "thing"
    assert a.total == b.total == len(fields)
    assert a._asdict() == b._asdict()
    assert tuple(a._replace(**{fields[0]: -1})) == tuple(b._replace(**{fields[0]: -1}))
    with pytest.raises(AttributeError):
        a.total = 3  # frozen like theirs
    with pytest.raises(TypeError):
        ours(*values, *range(len(fields) + 1))


def test_refused_as_typing_refuses() -> None:
    with pytest.raises(TypeError, match="non-default"):
        class Bad(NamedTuple):
            a: int = 0
            b: int  # type: ignore[misc]
    with pytest.raises(AttributeError, match="_replace"):
        class Worse(NamedTuple):
            a: int

            def _replace(self) -> None:  # type: ignore[override]
                pass


def test_pick_loads_neither_typing_nor_the_bundle_parsers(tmp_path: object) -> None:
    """With the parsed bundle cached, ``gpuslurm pick`` imports none of typing, dataclasses,
    pathlib or the XML parser (what it costs: benchmarks/README.md, bench_pick.py)."""
    code = ("import sys, io, re\n"
            "from gpuslurm.cli.fast import main\n"
            "sys.argv = ['gpuslurm', 'pick', '4', '--from', 'dgx-h100', '--format', 'json']\n"
            "out, sys.stdout = sys.stdout, io.StringIO()\n"
            "rc = main()\n"
            "sys.stdout = out\n"
            "print(rc, sorted(m for m in ('typing', 'dataclasses', 'pathlib', 'xml', 'inspect') "
            "if m in sys.modules))\n")
    env = {"XDG_CACHE_HOME": str(tmp_path), "PATH": "/usr/bin:/bin"}
    first = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    second = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    assert first.stdout.startswith("0 ") and "pathlib" in first.stdout  # the first run parses
    assert second.stdout == "0 []\n"
