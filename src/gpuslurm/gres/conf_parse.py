"""Read an existing gres.conf (pure): the lines that apply to one node, devices expanded.

Follows gres.conf(5): parameter names are case-insensitive, ``#`` starts a comment, a line may
start with ``NodeName=`` (a hostlist) or ``Name=``, and ``File=`` may hold a bracketed range
(``/dev/nvidia[0-3]``) that stands for one device per file.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpuslurm.errors import InputError
from gpuslurm.ranges import MAX_CPUS, parse_ranges
from gpuslurm.topo.hostlist import expand_hostlist


@dataclass(frozen=True, slots=True)
class ConfEntry:
    """One device (or one count-only line) as an existing gres.conf declares it."""

    line: int
    name: str
    type: str | None
    files: tuple[str, ...]  # one device's files: (File,) or the MultipleFiles list
    cores: tuple[int, ...] | None
    links: tuple[int, ...] | None
    count: int | None


def expand_files(expr: str) -> list[str]:
    """``/dev/nvidia[0-2,5]`` → four paths; a plain path → itself."""
    return list(expand_hostlist(expr))


def parse_gres_conf(text: str, source: str, node_name: str | None = None) -> tuple[ConfEntry, ...]:
    """Entries of ``text`` that apply to ``node_name`` (all lines when it is None)."""
    entries: list[ConfEntry] = []
    for lineno, raw in enumerate(text.splitlines(), start=1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        fields: dict[str, str] = {}
        for token in line.split():
            key, sep, value = token.partition("=")
            if not sep:
                raise InputError(f"line {lineno}: expected key=value, found {token!r}", source)
            fields[key.lower()] = value
        if "nodename" in fields:
            try:
                hosts = expand_hostlist(fields.pop("nodename"))
            except ValueError as exc:
                raise InputError(f"line {lineno}: bad NodeName hostlist: {exc}", source) from None
            if node_name is not None and node_name not in hosts:
                continue
        if "autodetect" in fields and "name" not in fields:
            continue
        if "name" not in fields:
            raise InputError(f"line {lineno}: no Name= on a device line", source)
        entries.extend(_entries(fields, lineno, source))
    return tuple(entries)


def _entries(fields: dict[str, str], lineno: int, source: str) -> list[ConfEntry]:
    def ints(key: str) -> tuple[int, ...] | None:
        if key not in fields:
            return None
        try:
            if key == "links":
                return tuple(int(v) for v in fields[key].split(","))
            return parse_ranges(fields[key].strip("[]"), MAX_CPUS)
        except ValueError as exc:
            raise InputError(f"line {lineno}: bad {key.capitalize()}= value: {exc}", source) from None

    cores = ints("cores") if "cores" in fields else ints("cpus")
    links = ints("links")
    count = None
    if "count" in fields:
        try:
            count = _count(fields["count"])
        except ValueError:
            raise InputError(f"line {lineno}: bad Count= value {fields['count']!r}", source) from None
    name, gtype = fields["name"], fields.get("type")
    key = "multiplefiles" if "multiplefiles" in fields else "file"
    try:
        paths = expand_files(fields[key]) if key in fields else []
    except ValueError as exc:
        raise InputError(f"line {lineno}: bad {key.capitalize()}= value: {exc}", source) from None
    if key == "multiplefiles":
        return [ConfEntry(lineno, name, gtype, tuple(paths), cores, links, count)]
    if "file" in fields:
        return [ConfEntry(lineno, name, gtype, (p,), cores, links, count) for p in paths]
    return [ConfEntry(lineno, name, gtype, (), cores, links, count)]


def _count(text: str) -> int:
    scale = {"k": 1024, "m": 1024**2, "g": 1024**3, "t": 1024**4, "p": 1024**5}
    t = text.strip().lower()
    if t and t[-1] in scale:
        return int(t[:-1]) * scale[t[-1]]
    return int(t)
