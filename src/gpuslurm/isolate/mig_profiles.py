"""The MIG profiles each GPU model offers, and whether a set of them fits on one GPU (pure).

Facts from NVIDIA's MIG User Guide ("Supported MIG Profiles"): a GPU instance occupies a run of
memory slices that must start at one of a few placements, so two profiles whose compute slices
add up to 7 can still fail to fit (3g + 3g + 1g on an A100: each 3g takes half the memory).
A 7-slice GPU has 8 memory slices; an A30 has 4 of each.

Profile names carry the memory in GB, which differs per memory size of the same chip, so the
tables are per model *and* memory size. A profile with ``+me`` also takes the GPU's one set of
media extensions (at most one such instance per GPU).
"""

from __future__ import annotations

import re
from typing import NamedTuple

from gpuslurm.hw.model.node import MIG_PROFILE_RE


class ProfileShape(NamedTuple):
    """One GPU-instance profile of one GPU model."""

    name: str  # e.g. "3g.40gb"
    compute: int  # GPU (compute) slices: the "g" of the name
    memory_gb: int  # the GB of the name
    size: int  # memory slices it occupies
    starts: tuple[int, ...]  # first memory slice of each placement the driver allows
    media: bool = False  # "+me": the GPU's single set of media extensions


class MigBoard(NamedTuple):
    """A MIG-capable GPU model: its slices and the profiles it offers."""

    model: str  # "A100 80GB", for messages
    compute_slices: int
    memory_slices: int
    profiles: tuple[ProfileShape, ...]

    def profile(self, name: str) -> ProfileShape | None:
        for p in self.profiles:
            if p.name == name:
                return p
        return None

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(p.name for p in self.profiles)


def _seven_slice(model: str, one: int, two: int, half: int, full: int, media: bool = True) -> MigBoard:
    """The A100/H100/H200/B200 geometry: 7 compute slices, 8 memory slices."""
    shapes = [ProfileShape(f"1g.{one}gb", 1, one, 1, (0, 1, 2, 3, 4, 5, 6))]
    if media:
        shapes.append(ProfileShape(f"1g.{one}gb+me", 1, one, 1, (0, 1, 2, 3, 4, 5, 6), media=True))
    shapes += [
        ProfileShape(f"1g.{two}gb", 1, two, 2, (0, 2, 4, 6)),
        ProfileShape(f"2g.{two}gb", 2, two, 2, (0, 2, 4)),
        ProfileShape(f"3g.{half}gb", 3, half, 4, (0, 4)),
        ProfileShape(f"4g.{half}gb", 4, half, 4, (0,)),
        ProfileShape(f"7g.{full}gb", 7, full, 8, (0,)),
    ]
    return MigBoard(model, 7, 8, tuple(shapes))


A30 = MigBoard("A30 24GB", 4, 4, (
    ProfileShape("1g.6gb", 1, 6, 1, (0, 1, 2, 3)),
    ProfileShape("1g.6gb+me", 1, 6, 1, (0, 1, 2, 3), media=True),
    ProfileShape("2g.12gb", 2, 12, 2, (0, 2)),
    ProfileShape("2g.12gb+me", 2, 12, 2, (0, 2), media=True),
    ProfileShape("4g.24gb", 4, 24, 4, (0,)),
))
A100_40GB = _seven_slice("A100 40GB", 5, 10, 20, 40)
A100_80GB = _seven_slice("A100 80GB", 10, 20, 40, 80)
H100_80GB = _seven_slice("H100 80GB", 10, 20, 40, 80)
H100_94GB = _seven_slice("H100 94GB", 12, 24, 47, 94)
H200_141GB = _seven_slice("H200 141GB", 18, 35, 71, 141)
B200_180GB = _seven_slice("B200 180GB", 23, 45, 90, 180, media=False)
BOARDS = (A30, A100_40GB, A100_80GB, H100_80GB, H100_94GB, H200_141GB, B200_180GB)


def _has(name: str, chip: str) -> bool:
    # Word boundaries: "GH200" is a Grace Hopper superchip, not an H200.
    return re.search(rf"(?<![A-Z0-9]){chip}(?![0-9])", name) is not None


def board_for(gpu_name: str, memory_mib: int) -> MigBoard | None:
    """The profile table for a GPU (NVML name and framebuffer size), or None if gpuslurm has none."""
    name = gpu_name.upper()
    if _has(name, "A30"):
        return A30
    if _has(name, "A100") or _has(name, "A800"):
        return A100_80GB if memory_mib > 60_000 else A100_40GB
    if _has(name, "H100") or _has(name, "H800"):
        return H100_94GB if memory_mib > 90_000 else H100_80GB
    if _has(name, "H200"):
        return H200_141GB
    if _has(name, "B200"):
        return B200_180GB
    return None


def canonical_profile(board: MigBoard | None, name: str, memory_mib: int) -> str:
    """The board's name for an existing GPU instance of profile ``name`` with ``memory_mib``.

    NVML reports only slice counts and memory, from which gpuslurm builds names such as
    "3g.39gb" (40192 MiB rounded); the table says "3g.40gb". A compute-instance prefix
    ("1c.") is dropped: the GPU instance's profile is what a layout names.
    """
    m = MIG_PROFILE_RE.match(name)
    if m is None or board is None:
        return name
    gi_name = name.split(".", 1)[1] if m.group("c") else name
    if board.profile(gi_name) is not None:
        return gi_name
    compute = int(m.group("g"))
    candidates = [p for p in board.profiles if p.compute == compute and not p.media]
    if not candidates:
        return gi_name
    gib = memory_mib / 1024 if memory_mib > 0 else float(m.group("mem"))
    return min(candidates, key=lambda p: abs(p.memory_gb - gib)).name


def placements(board: MigBoard, names: tuple[str, ...]) -> tuple[int, ...] | None:
    """A start slice for each profile (same order) so that none overlap, or None if none exists.

    Every name must be one of the board's. Tries the biggest profiles first; a GPU holds at
    most 7 instances, so the search is tiny.
    """
    shapes = [board.profile(n) for n in names]
    if any(s is None for s in shapes):
        raise ValueError(f"not profiles of {board.model}: {names}")
    order = sorted(range(len(names)), key=lambda i: -shapes[i].size)  # type: ignore[union-attr]
    starts: list[int] = [0] * len(names)
    used = [False] * board.memory_slices

    def place(k: int) -> bool:
        if k == len(order):
            return True
        i = order[k]
        shape = shapes[i]
        assert shape is not None
        for start in shape.starts:
            span = range(start, start + shape.size)
            if span.stop <= board.memory_slices and not any(used[s] for s in span):
                for s in span:
                    used[s] = True
                starts[i] = start
                if place(k + 1):
                    return True
                for s in span:
                    used[s] = False
        return False

    return tuple(starts) if place(0) else None


def creation_order(board: MigBoard | None, names: tuple[str, ...]) -> tuple[str, ...]:
    """``names`` biggest first: the driver places each new instance where it still fits, and small
    ones created first can take the only placements a big one has (1g at slice 4 blocks a 3g)."""
    if board is None:
        return names

    def key(n: str) -> tuple[int, int]:
        p = board.profile(n)
        return (0, 0) if p is None else (-p.size, -p.compute)

    return tuple(sorted(names, key=key))
