"""``typing.NamedTuple``'s class syntax without importing :mod:`typing`, for the start-up path.

Importing :mod:`typing` costs about a third of an interpreter start (3.6 ms against 11 ms, see
benchmarks/README.md, bench_pick.py), and ``typing.NamedTuple`` compiles every field's annotation
string again when a class is made. ``gpuslurm pick`` runs in front of job steps and reaches the
node model, the placement engine and their value types, all NamedTuples; those modules take
``NamedTuple`` and ``TYPE_CHECKING`` from here. Type checkers see ``typing.NamedTuple`` itself;
at run time the class statement builds the same ``collections.namedtuple`` ``typing`` would
(fields in annotation order, defaults, methods, properties and docstring kept; annotations stay
the strings ``from __future__ import annotations`` makes, not ForwardRefs), so values,
``_replace``, ``_asdict`` and ``_fields`` behave as they do with ``typing.NamedTuple``. Not
supported, and not used by gpuslurm: generic NamedTuples and subclassing a NamedTuple class.
"""

from __future__ import annotations

import collections

TYPE_CHECKING = False  # mypy takes any name TYPE_CHECKING as true; only typing's costs an import

if TYPE_CHECKING:
    from typing import NamedTuple as NamedTuple
else:
    # what typing.NamedTuple refuses too: these would break the tuple's own machinery
    _PROHIBITED = frozenset({"__new__", "__init__", "__slots__", "__getnewargs__", "_fields",
                             "_field_defaults", "_make", "_replace", "_asdict", "_source"})
    _NOT_COPIED = frozenset({"__module__", "__qualname__", "__annotations__", "__dict__",
                             "__weakref__"})

    class _NamedTupleMeta(type):
        def __new__(mcls, name, bases, ns):
            if not bases:  # NamedTuple itself, below
                return super().__new__(mcls, name, bases, ns)
            if bases != (NamedTuple,):
                raise TypeError("gpuslurm.tuples.NamedTuple: only 'class X(NamedTuple)' is supported")
            fields = list(ns.get("__annotations__", {}))
            defaults = []
            for field in fields:
                if field in ns:
                    defaults.append(ns[field])
                elif defaults:
                    raise TypeError(f"non-default field {field!r} follows a default field in {name}")
            cls = collections.namedtuple(name, fields, defaults=defaults, module=ns.get("__module__"))
            for key, value in ns.items():
                if key in _PROHIBITED:
                    raise AttributeError(f"cannot overwrite NamedTuple attribute {key}")
                if key not in _NOT_COPIED and key not in fields:
                    setattr(cls, key, value)
            cls.__annotations__ = dict(ns.get("__annotations__", {}))
            cls.__qualname__ = ns.get("__qualname__", name)
            return cls

    class NamedTuple(metaclass=_NamedTupleMeta):
        """Base of a typed named tuple: ``class Gpu(NamedTuple): uuid: str ...``."""


__all__ = ["TYPE_CHECKING", "NamedTuple"]
