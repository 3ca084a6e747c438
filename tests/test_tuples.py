"""gpuslurm.tuples.NamedTuple behaves as typing.NamedTuple does, and pick's start-up path avoids typing."""

from __future__ import annotations

import copy
import inspect
import keyword
import pickle
import subprocess
import sys
import typing
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpuslurm.tuples import NamedTuple

_names = st.from_regex(r"[a-z][a-z0-9_]{0,6}", fullmatch=True).filter(lambda n: not keyword.iskeyword(n))


def _make(base: object, fields: list[str], n_defaults: int, doc: bool = True) -> type:
    lines = ["class Thing(Base):", '    """A thing."""' if doc else "    pass"]
    for i, f in enumerate(fields):
        default = f" = {i!r}" if i >= len(fields) - n_defaults else ""
        lines.append(f"    {f}: int | None{default}")
    lines += ["    @property", "    def total(self) -> int:", "        return len(self)",
              "    def __str__(self) -> str:", "        return 'thing'"]
    ns: dict[str, object] = {"Base": base, "__name__": "tests.things"}
    exec("from __future__ import annotations\n" + "\n".join(lines), ns)
    return ns["Thing"]  # type: ignore[return-value]


def _params(cls: type) -> list[tuple[str, object]]:
    """Names and defaults of a class's constructor (typing's carries ForwardRef annotations)."""
    return [(p.name, p.default) for p in inspect.signature(cls).parameters.values()]


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
    # keywords, _make, _replace's refusal, pickling and copying, matching, the signature
    kw = dict(zip(fields, values, strict=False))
    assert tuple(ours(**kw)) == tuple(theirs(**kw)) == tuple(a)
    assert ours._make(tuple(b)) == a and type(ours._make(tuple(b))) is ours  # type: ignore[attr-defined]
    for wrong in ((*b, 0), tuple(b)[:-1]):
        with pytest.raises(TypeError, match="Expected"):
            ours._make(wrong)  # type: ignore[attr-defined]
    with pytest.raises(ValueError, match="unexpected field names"):
        a._replace(not_a_field=1)
    if values:
        with pytest.raises(TypeError):
            ours(*values, **{fields[0]: 0})  # the first field twice
    assert ours.__match_args__ == theirs.__match_args__  # type: ignore[attr-defined]
    assert _params(ours) == _params(theirs)
    assert copy.copy(a) == a and copy.deepcopy(a) == a and type(copy.deepcopy(a)) is ours
    assert a.__getnewargs__() == b.__getnewargs__() and a.__reduce_ex__(2)[1][1:] == b.__reduce_ex__(2)[1][1:]
    assert ours.__mro__ == (ours, tuple, object) and ours.__slots__ == ()  # type: ignore[attr-defined]
    # our own wording for the generated docs; a class without a docstring is named by its fields
    assert ours.__new__.__doc__ and all(f in ours.__new__.__doc__ for f in fields)
    bare = [_make(base, fields, 0, doc=False) for base in (NamedTuple, typing.NamedTuple)]
    assert bare[0].__doc__ == bare[1].__doc__
    docs = [ours.__dict__[f].__doc__ for f in fields]
    assert docs == [f"Field {i} of the tuple." for i, _ in enumerate(fields)]


def test_a_named_tuple_pickles_by_its_module_and_name() -> None:
    """Pickle finds the class as ``module.qualname``, as for typing.NamedTuple's classes."""
    from gpuslurm.hw.model.node import Cpu, Gpu

    gpu = Gpu("GPU-1", 0, 0, "00000000:01:00.0", "NVIDIA H100", 81559, cpu_affinity=(1, 2))
    for value in (gpu, Cpu(1, 2, 3), Cpu(os_id=1, core=2, socket=3, numa_node=0)):
        assert pickle.loads(pickle.dumps(value)) == value
        assert type(pickle.loads(pickle.dumps(value))) is type(value)
    assert repr(Cpu(1, 2, 3)) == "Cpu(os_id=1, core=2, socket=3, numa_node=None)"


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
    with pytest.raises(ValueError, match="underscore"):
        class Hidden(NamedTuple):
            _a: int
    with pytest.raises(ValueError, match="underscore"):
        class TheirHidden(typing.NamedTuple):
            _a: int


def test_many_fields_and_none() -> None:
    """Field counts past the precompiled ones (and zero) make the same classes."""
    for n in (0, 1, 12, 13, 30):
        fields = [f"f{i}" for i in range(n)]
        ours, theirs = _make(NamedTuple, fields, n // 2), _make(typing.NamedTuple, fields, n // 2)
        values = list(range(100, 100 + n - n // 2))
        assert repr(ours(*values)) == repr(theirs(*values))
        assert ours(*values)._asdict() == theirs(*values)._asdict()
        assert _params(ours) == _params(theirs)


@pytest.mark.parametrize("site_config", [False, True], ids=["no-site-config", "site-config"])
def test_pick_loads_neither_typing_nor_the_bundle_parsers(tmp_path: Path, site_config: bool) -> None:
    """With the parsed bundle cached, ``gpuslurm pick`` imports none of typing, dataclasses,
    pathlib or the XML parser (what it costs: benchmarks/README.md, bench_pick.py).

    The site config is the test's own, never the host's /etc/gpuslurm/gpuslurm.toml: absent (the
    default path pointed into tmp_path), or a file named by $GPUSLURM_CONFIG, whose parse (tomllib)
    may bring typing and nothing else on the list."""
    absent = tmp_path / "etc" / "gpuslurm.toml"
    code = ("import sys, io, re\n"
            "import gpuslurm.configfile\n"
            f"gpuslurm.configfile.DEFAULT_PATH = {str(absent)!r}\n"
            "from gpuslurm.cli.fast import main\n"
            "sys.argv = ['gpuslurm', 'pick', '4', '--from', 'dgx-h100', '--format', 'json']\n"
            "out, sys.stdout = sys.stdout, io.StringIO()\n"
            "rc = main()\n"
            "sys.stdout = out\n"
            "print(rc, sorted(m for m in ('typing', 'dataclasses', 'pathlib', 'xml', 'inspect') "
            "if m in sys.modules))\n")
    env = {"XDG_CACHE_HOME": str(tmp_path), "PATH": "/usr/bin:/bin"}
    if site_config:
        config = tmp_path / "gpuslurm.toml"
        config.write_text("[monitor]\ninterval_s = 5\n")
        env["GPUSLURM_CONFIG"] = str(config)
    first = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    second = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    assert first.stdout.startswith("0 ") and "pathlib" in first.stdout  # the first run parses
    allowed = ["0 []\n", "0 ['typing']\n"] if site_config else ["0 []\n"]  # 3.14's tomllib spares typing
    assert second.stdout in allowed
