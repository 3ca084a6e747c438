"""``typing.NamedTuple``'s class syntax without importing :mod:`typing`, for the start-up path.

Importing :mod:`typing` costs about a third of an interpreter start (3.6 ms against 11 ms, see
benchmarks/README.md, bench_pick.py), and ``typing.NamedTuple`` compiles every field's annotation
string again when a class is made. ``gpuslurm pick`` runs in front of job steps and reaches the
node model, the placement engine and their value types, all NamedTuples; those modules take
``NamedTuple`` and ``TYPE_CHECKING`` from here. Type checkers see ``typing.NamedTuple`` itself;
at run time the class statement builds the class ``collections.namedtuple`` would build for
``typing`` (a ``tuple`` subclass with the same ``__new__`` signature, field accessors, ``_make``,
``_replace``, ``_asdict``, ``__repr__``, ``__getnewargs__``, ``__match_args__``, ``_fields`` and
``_field_defaults``; the class body's methods, properties and docstring kept; annotations stay
the strings ``from __future__ import annotations`` makes, not ForwardRefs), but about five times
faster: ``collections.namedtuple`` compiles source text for every class, and the hooks' and
pick's start-up makes some fifty of them. Not supported, and not used by gpuslurm: generic
NamedTuples and subclassing a NamedTuple class.
"""

from __future__ import annotations

from types import FunctionType

TYPE_CHECKING = False  # mypy takes any name TYPE_CHECKING as true; only typing's costs an import

if TYPE_CHECKING:
    from typing import NamedTuple as NamedTuple
else:
    try:
        from _collections import _tuplegetter  # the C field accessor collections.namedtuple uses
    except ImportError:  # pragma: no cover - an interpreter without it
        from operator import itemgetter

        def _tuplegetter(index, doc):
            return property(itemgetter(index), doc=doc)

    # what typing.NamedTuple refuses too: these would break the tuple's own machinery
    _PROHIBITED = frozenset({"__new__", "__init__", "__slots__", "__getnewargs__", "_fields",
                             "_field_defaults", "_make", "_replace", "_asdict", "_source"})
    _NOT_COPIED = frozenset({"__module__", "__qualname__", "__annotations__", "__dict__",
                             "__weakref__"})
    _tuple_new = tuple.__new__
    _NEW_GLOBALS = {"_tuple_new": _tuple_new, "__builtins__": {}}  # what __new__ sees, as namedtuple's
    # __new__ for 0-12 fields, compiled with this module (byte code in its .pyc); more are compiled
    # when first needed, as collections.namedtuple does for every class
    _NEW_TEMPLATES = (
        lambda _cls: _tuple_new(_cls, ()),
        lambda _cls, _0: _tuple_new(_cls, (_0,)),
        lambda _cls, _0, _1: _tuple_new(_cls, (_0, _1)),
        lambda _cls, _0, _1, _2: _tuple_new(_cls, (_0, _1, _2)),
        lambda _cls, _0, _1, _2, _3: _tuple_new(_cls, (_0, _1, _2, _3)),
        lambda _cls, _0, _1, _2, _3, _4: _tuple_new(_cls, (_0, _1, _2, _3, _4)),
        lambda _cls, _0, _1, _2, _3, _4, _5: _tuple_new(_cls, (_0, _1, _2, _3, _4, _5)),
        lambda _cls, _0, _1, _2, _3, _4, _5, _6: _tuple_new(_cls, (_0, _1, _2, _3, _4, _5, _6)),
        lambda _cls, _0, _1, _2, _3, _4, _5, _6, _7: _tuple_new(_cls, (_0, _1, _2, _3, _4, _5, _6, _7)),
        lambda _cls, _0, _1, _2, _3, _4, _5, _6, _7, _8:
            _tuple_new(_cls, (_0, _1, _2, _3, _4, _5, _6, _7, _8)),
        lambda _cls, _0, _1, _2, _3, _4, _5, _6, _7, _8, _9:
            _tuple_new(_cls, (_0, _1, _2, _3, _4, _5, _6, _7, _8, _9)),
        lambda _cls, _0, _1, _2, _3, _4, _5, _6, _7, _8, _9, _10:
            _tuple_new(_cls, (_0, _1, _2, _3, _4, _5, _6, _7, _8, _9, _10)),
        lambda _cls, _0, _1, _2, _3, _4, _5, _6, _7, _8, _9, _10, _11:
            _tuple_new(_cls, (_0, _1, _2, _3, _4, _5, _6, _7, _8, _9, _10, _11)),
    )
    _NEW_CODE = {n: f.__code__ for n, f in enumerate(_NEW_TEMPLATES)}  # fields -> __new__'s code

    def _arg_list(fields):
        return ", ".join(fields) + ("," if len(fields) == 1 else "")  # namedtuple's spelling

    def _new_method(name, fields, defaults):
        """``__new__(_cls, field, ...)``, as ``collections.namedtuple`` makes it, without compiling
        source for every class (its ``eval`` is half the cost of making a class): one code object
        per number of fields, its argument names replaced by the fields'."""
        code = _NEW_CODE.get(len(fields))
        if code is None:
            args = "".join(f", _{i}" for i in range(len(fields)))
            # as collections.namedtuple does; the text holds only names made here
            code = eval(f"lambda _cls{args}: _tuple_new(_cls, ({args[2:]}{',' if args else ''}))",  # noqa: S307
                        _NEW_GLOBALS).__code__
            _NEW_CODE[len(fields)] = code
        code = code.replace(co_varnames=("_cls", *fields), co_name="__new__",
                            co_qualname=f"{name}.__new__")
        new = FunctionType(code, _NEW_GLOBALS, "__new__", tuple(defaults) if defaults else None)
        new.__doc__ = f"A new {name}({_arg_list(fields)})."
        return new

    # the methods collections.namedtuple gives every class, written once for all of them
    @classmethod
    def _make(cls, iterable):
        """The instance holding the values of ``iterable``, one per field."""
        result = _tuple_new(cls, iterable)
        if len(result) != len(cls._fields):
            raise TypeError(f"Expected {len(cls._fields)} arguments, got {len(result)}")
        return result

    def _replace(self, /, **kwds):
        """A copy with the fields named by keyword set to new values."""
        result = self._make(map(kwds.pop, self._fields, self))
        if kwds:
            raise ValueError(f"Got unexpected field names: {list(kwds)!r}")
        return result

    def _repr(self):
        """``Name(field=value, ...)``."""
        values = ", ".join(f"{f}={v!r}" for f, v in zip(self._fields, self, strict=True))
        return f"{self.__class__.__name__}({values})"

    def _asdict(self):
        """The fields and their values as a dict."""
        return dict(zip(self._fields, self, strict=True))

    def _getnewargs(self):
        """The values as a plain tuple (what copy and pickle rebuild the instance from)."""
        return tuple(self)

    _repr.__name__, _getnewargs.__name__ = "__repr__", "__getnewargs__"

    class _NamedTupleMeta(type):
        def __new__(mcls, name, bases, ns):
            if not bases:  # NamedTuple itself, below
                return super().__new__(mcls, name, bases, ns)
            if bases != (NamedTuple,):
                raise TypeError("gpuslurm.tuples.NamedTuple: only 'class X(NamedTuple)' is supported")
            annotations = ns.get("__annotations__", {})
            fields = tuple(annotations)
            defaults = []
            for field in fields:
                if field.startswith("_"):
                    raise ValueError(f"Field names cannot start with an underscore: {field!r}")
                if field in ns:
                    defaults.append(ns[field])
                elif defaults:
                    raise TypeError(f"non-default field {field!r} follows a default field in {name}")
            body = {"__doc__": f"{name}({_arg_list(fields)})", "__slots__": (), "_fields": fields,
                    "_field_defaults": dict(zip(fields[len(fields) - len(defaults):], defaults, strict=True)),
                    "__new__": _new_method(name, fields, defaults), "_make": _make,
                    "_replace": _replace, "__repr__": _repr, "_asdict": _asdict,
                    "__getnewargs__": _getnewargs, "__match_args__": fields,
                    "__module__": ns.get("__module__"), "__qualname__": ns.get("__qualname__", name)}
            for index, field in enumerate(fields):
                body[field] = _tuplegetter(index, f"Field {index} of the tuple.")
            for key, value in ns.items():
                if key in _PROHIBITED:
                    raise AttributeError(f"cannot overwrite NamedTuple attribute {key}")
                if key not in _NOT_COPIED and key not in annotations:
                    body[key] = value
            cls = type(name, (tuple,), body)
            cls.__annotations__ = dict(annotations)
            return cls

    class NamedTuple(metaclass=_NamedTupleMeta):
        """Base of a typed named tuple: ``class Gpu(NamedTuple): uuid: str ...``."""


__all__ = ["TYPE_CHECKING", "NamedTuple"]
