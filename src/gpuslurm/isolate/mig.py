"""Declarative MIG layouts (pure): parse and check a layout file, compare it with a node, plan
the ``nvidia-smi`` commands that turn one into the other.

A layout is TOML; each table under ``gpus`` selects GPUs by index, index range, UUID or ``all``
and says what they should be (see docs/mig.md)::

    [gpus."0-3"]
    profiles = ["3g.40gb", "3g.40gb"]   # MIG on, these GPU instances, one full compute instance each

    [gpus."4-7"]
    mig = false

    [gpus."8"]                          # a list in profiles: one GPU instance split into
    profiles = [["1c.3g.71gb", "2c.3g.71gb"], "2g.35gb"]   # these compute instances

GPUs the layout does not select are left as they are. Comparison ignores the order of profiles
and the media-extension suffix ``+me``, which NVML's MIG device facts do not show.
"""

from __future__ import annotations

import tomllib
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple, NoReturn

from gpuslurm.errors import InputError
from gpuslurm.hw.model.node import MIG_PROFILE_RE, Gpu, Node
from gpuslurm.isolate.mig_profiles import MigBoard, board_for, canonical_profile, creation_order, placements
from gpuslurm.ranges import MAX_GPUS, format_ranges, parse_ranges
from gpuslurm.safedir import read_regular

MAX_LAYOUT_BYTES = 1 << 20
MAX_COMPUTE_INSTANCES = 7  # a 7g GPU instance holds at most seven 1c compute instances


class LayoutEntry(NamedTuple):
    """One ``[gpus."<selector>"]`` table as written."""

    selector: str
    mig: bool
    profiles: tuple[str, ...]  # GPU-instance profiles
    compute: tuple[tuple[str, ...], ...] = ()  # per profile: its compute instances when split, else ()

    @property
    def label(self) -> str:
        return f'[gpus."{self.selector}"]'


class Layout(NamedTuple):
    source: str  # the file, for messages
    entries: tuple[LayoutEntry, ...]


@dataclass(frozen=True, slots=True)
class WantedGpu:
    """What the layout asks of one GPU of the node."""

    uuid: str
    index: int
    mig: bool
    profiles: tuple[str, ...]  # in creation order (biggest first)
    entry: str  # the table that selected it
    compute: tuple[tuple[str, ...], ...] = ()  # per profile: its compute instances when split, else ()


@dataclass(frozen=True, slots=True)
class GpuMigState:
    """What one GPU is now, in the layout's terms."""

    uuid: str
    index: int
    name: str
    mode: bool | None  # None: the GPU has no MIG
    profiles: tuple[str, ...]  # one per GPU instance, in GI id order, as the board names them
    split: tuple[int, ...] = ()  # GI ids whose compute instances are not one full instance
    compute: tuple[tuple[str, ...], ...] = ()  # per profile: its compute instances when split, else ()


@dataclass(frozen=True, slots=True)
class MigStep:
    """One ``nvidia-smi`` call of a plan (``args`` follow the binary's path)."""

    kind: str  # "destroy-ci", "destroy-gi", "mode", "create"
    index: int
    args: tuple[str, ...]
    mode: bool | None = None  # for "mode": the mode it sets


class GpuChange(NamedTuple):
    current: GpuMigState
    wanted: WantedGpu
    steps: tuple[MigStep, ...]


ALLOWED_KEYS = ("mig", "profiles")
UNKNOWN_PROFILE = "?"  # a GPU instance whose profile the capture does not name


def _fail(source: str, message: str) -> NoReturn:
    raise InputError(message, source)


def load_layout(path: Path) -> Layout:
    """Read and parse a layout file; every problem is one InputError naming the file."""
    try:
        data = read_regular(str(path), MAX_LAYOUT_BYTES)
    except OSError as exc:
        _fail(str(path), f"cannot read: {exc.strerror}")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        _fail(str(path), f"not UTF-8 (byte {exc.start})")
    return parse_layout(text, str(path))


def parse_layout(text: str, source: str = "<layout>") -> Layout:
    """Parse layout TOML; checks shape and profile-name syntax (the node is checked later)."""
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        _fail(source, f"not valid TOML: {str(exc).splitlines()[0]}")
    unknown = sorted(set(doc) - {"gpus"})
    if unknown:
        _fail(source, f"unknown key {unknown[0]!r} (a layout has only [gpus.\"<selector>\"] tables)")
    gpus = doc.get("gpus")
    if not isinstance(gpus, dict) or not gpus:
        _fail(source, 'no GPUs: add a table such as [gpus."0-3"] with profiles = [...] or mig = false')
    entries = []
    for selector, table in gpus.items():
        label = f'[gpus."{selector}"]'
        if not isinstance(table, dict):
            _fail(source, f'gpus."{selector}" must be a table ({label}), not {table!r}')
        for key in table:
            if key not in ALLOWED_KEYS:
                _fail(source, f"{label}: unknown key {key!r} (allowed: {', '.join(ALLOWED_KEYS)})")
        parse_selector(selector, source, label)  # syntax now; indices against the node later
        entries.append(_entry(selector, table, source, label))
    return Layout(source, tuple(entries))


def _entry(selector: str, table: dict[str, object], source: str, label: str) -> LayoutEntry:
    mig = table.get("mig")
    profiles = table.get("profiles")
    if mig is not None and not isinstance(mig, bool):
        _fail(source, f"{label}: mig must be true or false, not {mig!r}")
    gi_names: list[str] = []
    compute: list[tuple[str, ...]] = []
    if profiles is not None:
        if not isinstance(profiles, list):
            _fail(source, f"{label}: profiles must be a list of profile names such as [\"3g.40gb\"]")
        for p in profiles:
            if isinstance(p, list):
                gi, cis = _split_instance(p, source, label)
            elif isinstance(p, str):
                if MIG_PROFILE_RE.match(p) is None or p.split(".")[0].endswith("c"):
                    _fail(source, f"{label}: {p!r} is not a GPU-instance profile name (like 3g.40gb)")
                gi, cis = p, ()
            else:
                _fail(source, f"{label}: profiles must be a list of profile names such as [\"3g.40gb\"]")
            gi_names.append(gi)
            compute.append(cis)
    if mig is None and profiles is None:
        _fail(source, f"{label}: say what these GPUs should be: profiles = [...] or mig = false")
    if mig is False and profiles:
        _fail(source, f"{label}: mig = false but profiles are given")
    return LayoutEntry(selector, mig is not False, tuple(gi_names), tuple(compute))


def _split_instance(cis: list[object], source: str, label: str) -> tuple[str, tuple[str, ...]]:
    """The GPU-instance profile and sorted compute instances of a ``["1c.3g.40gb", "2c.3g.40gb"]``."""
    example = '["1c.3g.40gb", "2c.3g.40gb"]'
    if not cis or len(cis) > MAX_COMPUTE_INSTANCES or not all(isinstance(c, str) for c in cis):
        _fail(source, f"{label}: a GPU instance split into compute instances is a list of 1 to "
                      f"{MAX_COMPUTE_INSTANCES} compute-instance profile names such as {example}")
    gis = set()
    for ci in cis:
        assert isinstance(ci, str)
        m = MIG_PROFILE_RE.match(ci)
        if m is None or not m.group("c") or int(m.group("c")) >= int(m.group("g")):
            _fail(source, f"{label}: {ci!r} is not a compute-instance profile name (like 1c.3g.40gb)")
        gis.add(ci.split(".", 1)[1])
    if len(gis) != 1:
        _fail(source, f"{label}: the compute instances {'+'.join(map(str, cis))} are not of one GPU "
                      "instance profile")
    return gis.pop(), tuple(sorted(map(str, cis)))


def parse_selector(selector: str, source: str, label: str) -> tuple[str, tuple[int, ...] | str | None]:
    """("all", None), ("uuid", "GPU-…") or ("index", (0, 1, …)) for a selector string."""
    text = selector.strip()
    if text.lower() == "all":
        return "all", None
    if text.upper().startswith("GPU-"):
        return "uuid", text
    try:
        return "index", parse_ranges(text, MAX_GPUS)
    except ValueError as exc:
        _fail(source, f"{label}: not a GPU selector ({exc}); use an index, a range like 0-3, a list "
                      "like 0,2, a GPU UUID, or all")


def resolve_layout(layout: Layout, node: Node) -> tuple[WantedGpu, ...]:
    """What the layout asks of each GPU it selects, checked against the node's GPUs and models."""
    src = layout.source
    by_index = {g.index: g for g in node.gpus}
    by_uuid = {g.uuid.lower(): g for g in node.gpus}
    chosen: dict[str, str] = {}  # uuid -> label of the entry that selected it
    wanted: list[WantedGpu] = []
    for entry in layout.entries:
        kind, value = parse_selector(entry.selector, src, entry.label)
        if kind == "all":
            gpus = list(node.gpus)
        elif kind == "uuid":
            assert isinstance(value, str)
            if value.lower() not in by_uuid:
                _fail(src, f"{entry.label}: no GPU {value} on {node.hostname}")
            gpus = [by_uuid[value.lower()]]
        else:
            assert isinstance(value, tuple)
            missing = sorted(set(value) - set(by_index))
            if missing:
                have = format_ranges(sorted(by_index)) or "none"
                _fail(src, f"{entry.label}: no GPU {format_ranges(missing)} on {node.hostname} "
                           f"(it has GPUs {have})")
            gpus = [by_index[i] for i in sorted(set(value))]
        for gpu in gpus:
            if gpu.uuid in chosen:
                _fail(src, f"{entry.label}: GPU {gpu.index} is also selected by {chosen[gpu.uuid]}")
            chosen[gpu.uuid] = entry.label
            wanted.append(_check_gpu(entry, gpu, src))
    return tuple(sorted(wanted, key=lambda w: w.index))


def _check_gpu(entry: LayoutEntry, gpu: Gpu, src: str) -> WantedGpu:
    where = f"{entry.label}: GPU {gpu.index} ({gpu.name})"
    if not entry.mig:
        return WantedGpu(gpu.uuid, gpu.index, False, (), entry.label)
    if gpu.mig_mode is None:
        _fail(src, f"{where} does not support MIG")
    board = board_for(gpu.name, gpu.memory_mib)
    if board is None:
        _fail(src, f"{where}: gpuslurm has no MIG profile table for this model")
    check_profiles(board, entry.profiles, where, src)
    split: dict[str, list[tuple[str, ...]]] = {}
    for gi, cis in zip(entry.profiles, entry.compute or ((),) * len(entry.profiles), strict=True):
        shape = board.profile(gi)
        used = sum(int(c.split("c.", 1)[0]) for c in cis)
        if shape is not None and used > shape.compute:
            _fail(src, f"{where}: {'+'.join(cis)} need {used} compute slices, {gi} has {shape.compute}")
        split.setdefault(gi, []).append(cis)
    order = creation_order(board, entry.profiles)
    compute = tuple(split[gi].pop(0) for gi in order)  # equal profiles are interchangeable
    return WantedGpu(gpu.uuid, gpu.index, True, order, entry.label,
                     compute if any(compute) else ())


def check_profiles(board: MigBoard, profiles: tuple[str, ...], where: str, src: str) -> None:
    """Raise InputError unless ``profiles`` can all be created together on a ``board`` GPU."""
    for p in profiles:
        if board.profile(p) is None:
            _fail(src, f"{where}: unknown profile {p!r}; {board.model} offers {', '.join(board.names)}")
    shapes = [board.profile(p) for p in profiles]
    compute = sum(s.compute for s in shapes if s is not None)
    if compute > board.compute_slices:
        _fail(src, f"{where}: {'+'.join(profiles)} needs {compute} compute slices, the GPU has "
                   f"{board.compute_slices}")
    if sum(1 for s in shapes if s is not None and s.media) > 1:
        _fail(src, f"{where}: only one profile per GPU can have media extensions (+me)")
    if placements(board, profiles) is None:
        _fail(src, f"{where}: {'+'.join(profiles)} do not fit together: no placement of their "
                   f"memory slices on the {board.memory_slices} the GPU has")


def gpu_state(gpu: Gpu) -> GpuMigState:
    """The GPU's MIG mode and GPU instances, with profile names as the model's table has them."""
    board = board_for(gpu.name, gpu.memory_mib) if gpu.mig_mode is not None else None
    by_gi: dict[int, list[tuple[str, int]]] = {}
    for dev in gpu.mig_devices:
        by_gi.setdefault(dev.gi_id, []).append((dev.profile, dev.memory_mib))
    profiles = []
    split = []
    compute: list[tuple[str, ...]] = []
    for gi in sorted(by_gi):
        cis = by_gi[gi]
        first, memory = cis[0]
        # a capture without the names (the XML alone carries none) leaves the profile unknown
        profile = canonical_profile(board, first, memory) if first else UNKNOWN_PROFILE
        profiles.append(profile)
        m = MIG_PROFILE_RE.match(first)
        if len(cis) > 1 or (m is not None and m.group("c")):
            split.append(gi)
            compute.append(tuple(sorted(_ci_name(name, profile) for name, _ in cis)))
        else:
            compute.append(())
    return GpuMigState(gpu.uuid, gpu.index, gpu.name, gpu.mig_mode, tuple(profiles), tuple(split),
                       tuple(compute) if split else ())


def _ci_name(name: str, gi_profile: str) -> str:
    """A compute instance's profile named on its GPU instance's table name ("1c.3g.39gb" -> "1c.3g.40gb")."""
    m = MIG_PROFILE_RE.match(name)
    return f"{m.group('c')}c.{gi_profile}" if m is not None and m.group("c") else gi_profile


def describe_state(state: GpuMigState) -> str:
    if state.mode is None:
        return "no MIG support"
    if not state.mode:
        return "MIG off"
    if not state.profiles:
        return "MIG on, no instances"
    if UNKNOWN_PROFILE in state.profiles:
        return (f"MIG on, {len(state.profiles)} GPU instance(s) whose profiles the capture does not "
                "name (nvidia-smi -L names them)")
    return "MIG " + _instances(state.profiles, state.compute)


def describe_wanted(wanted: WantedGpu) -> str:
    if not wanted.mig:
        return "MIG off"
    return "MIG " + _instances(wanted.profiles, wanted.compute) if wanted.profiles else "MIG on, no instances"


def _instances(profiles: tuple[str, ...], compute: tuple[tuple[str, ...], ...]) -> str:
    """The GPU instances, each split one with its compute instances: ``3g.71gb[1c.3g.71gb,2c.3g.71gb]``."""
    cis = compute or ((),) * len(profiles)
    return "+".join(p + (f"[{','.join(c)}]" if c else "") for p, c in zip(profiles, cis, strict=True))


def _instance_key(profiles: tuple[str, ...],
                  compute: tuple[tuple[str, ...], ...]) -> Counter[tuple[str, ...]]:
    cis = compute or ((),) * len(profiles)
    return Counter((p.removesuffix("+me"), *(n.removesuffix("+me") for n in c))
                   for p, c in zip(profiles, cis, strict=True))


def matches(state: GpuMigState, wanted: WantedGpu) -> bool:
    """Whether the GPU already is what the layout asks (split GPU instances compared with their
    compute instances)."""
    if not wanted.mig:
        return not state.mode and not state.profiles
    return (state.mode is True and UNKNOWN_PROFILE not in state.profiles
            and _instance_key(state.profiles, state.compute)
            == _instance_key(wanted.profiles, wanted.compute))


def diff_lines(node: Node, wanted: tuple[WantedGpu, ...]) -> list[str]:
    """One line per GPU that differs from the layout; [] when the node matches."""
    lines = []
    for w in wanted:
        state = gpu_state(node.gpu(w.uuid))
        if not matches(state, w):
            lines.append(f"GPU {w.index} ({w.uuid}): is {describe_state(state)}, "
                         f"layout {w.entry} wants {describe_wanted(w)}")
    return lines


def plan_changes(node: Node, wanted: tuple[WantedGpu, ...]) -> tuple[GpuChange, ...]:
    """The ``nvidia-smi`` steps for each GPU that differs, in the order they must run.

    A GPU that changes is rebuilt whole: its compute and GPU instances are destroyed, the mode
    switched if needed, then the wanted GPU instances created (biggest first), each with its
    default full compute instance. ``nvidia-smi mig -i`` takes the NVML index.
    """
    changes = []
    for w in wanted:
        state = gpu_state(node.gpu(w.uuid))
        if matches(state, w):
            continue
        if any(w.compute):
            raise InputError(f"GPU {w.index}: {w.entry} wants GPU instances split into compute "
                             f"instances ({describe_wanted(w)}); apply creates one full compute "
                             "instance per GPU instance: split them with nvidia-smi mig -cci")
        i = str(w.index)
        steps = []
        if state.mode and state.profiles:
            steps.append(MigStep("destroy-ci", w.index, ("mig", "-i", i, "-dci")))
            steps.append(MigStep("destroy-gi", w.index, ("mig", "-i", i, "-dgi")))
        if w.mig != bool(state.mode):
            steps.append(MigStep("mode", w.index, ("-i", i, "-mig", "1" if w.mig else "0"), mode=w.mig))
        if w.mig and w.profiles:
            steps.append(MigStep("create", w.index, ("mig", "-i", i, "-cgi", ",".join(w.profiles), "-C")))
        changes.append(GpuChange(state, w, tuple(steps)))
    return tuple(changes)


def format_plan(node: Node, changes: tuple[GpuChange, ...], nvidia_smi: str) -> list[str]:
    """The plan as lines for people: one line per GPU that changes, then its commands."""
    if not changes:
        return [f"{node.hostname}: every GPU already matches the layout; nothing to do"]
    lines = [f"{node.hostname}: {len(changes)} GPU(s) to reconfigure"]
    for c in changes:
        lines.append(f"  GPU {c.wanted.index} ({c.wanted.uuid}): {describe_state(c.current)} -> "
                     f"{describe_wanted(c.wanted)}")
        lines.extend("    " + " ".join((nvidia_smi, *s.args)) for s in c.steps)
    return lines


def layout_toml(node: Node) -> str:
    """The node's current MIG layout as a layout file (consecutive equal GPUs share a table)."""
    out = [f"# MIG layout of {node.hostname} ({node.source or 'live'}), "
           "written by gpuslurm mig show --as-layout", ""]
    groups: list[tuple[list[Gpu], GpuMigState]] = []
    for gpu in node.gpus:
        state = gpu_state(gpu)
        prev = groups[-1] if groups else None
        if (prev is not None and prev[0][-1].index == gpu.index - 1 and prev[0][-1].name == gpu.name
                and (prev[1].mode, prev[1].profiles, prev[1].compute)
                == (state.mode, state.profiles, state.compute)):
            prev[0].append(gpu)
        else:
            groups.append(([gpu], state))
    for gpus, state in groups:
        sel = format_ranges([g.index for g in gpus])
        if state.mode is None:
            out += [f"# GPU {sel} ({gpus[0].name}): no MIG support", ""]
            continue
        if UNKNOWN_PROFILE in state.profiles:
            out += [f"# GPU {sel} ({gpus[0].name}): {describe_state(state)}", ""]
            continue
        out.append(f'[gpus."{sel}"]  # {gpus[0].name}')
        if state.split:
            out.append("# a list in profiles is one GPU instance split into these compute instances")
        if state.mode:
            cis = state.compute or ((),) * len(state.profiles)
            out.append("profiles = [" + ", ".join(
                "[" + ", ".join(f'"{n}"' for n in c) + "]" if c else f'"{p}"'
                for p, c in zip(state.profiles, cis, strict=True)) + "]")
        else:
            out.append("mig = false")
        out.append("")
    return "\n".join(out).rstrip("\n") + "\n"
