"""The placement engine: choose devices for a request, topology first, then load (pure, no I/O).

Ranking (issue 10 §1), best first, of every set of ``count`` devices that pass the constraints:

1. the weakest link between any two chosen devices, maximised: NV<k> (more links better), then
   PIX, PXB, PHB, NODE, SYS; two MIG devices of one GPU share the GPU ("X", best of all);
2. the fewest NUMA nodes; 3. the most NVLinks in total over all pairs (whole GPUs only: MIG
   devices have no peer-to-peer over NVLink or PCIe, so for them this step is skipped);
4. the highest availability, summed over the set: 0.6 × free-memory fraction + 0.4 × (1 − util);
5. the lowest indices (the sorted (GPU index, MIG index) tuple, compared lexicographically).

Search. Devices are grouped by their GPU: the topology keys of a set depend only on how many
devices it takes from each GPU (every pair inside one GPU is "X"), and for a given count per GPU
the best availability and lowest indices come from that GPU's best devices in availability
order, so only those are tried. Whole GPUs are groups of one. The search is a depth-first walk
over groups in index order that drops a partial set as soon as it is strictly worse than the
K-th best complete set found on the weakest link, or equal there and worse on NUMA nodes: both
keys can only get worse as devices are added, so the pruning never drops a set that could rank
in the top K. The result is the exact optimum of the order above (tests compare it with brute
force). The walk visits at most C(G + n − 1, n) count vectors for G GPUs and n devices
(12 870 for 16 whole GPUs choosing 8; 330 for 8 MIG-partitioned GPUs choosing 4).
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Sequence

from gpuslurm.hw.model.capability import model_cc
from gpuslurm.hw.model.node import Gpu, Link, LinkKind, MigDevice, Node
from gpuslurm.place.request import Request
from gpuslurm.tuples import NamedTuple

RUNNERS_UP = 3
_CLASS_QUALITY = {LinkKind.SYS: 1, LinkKind.NODE: 2, LinkKind.PHB: 3, LinkKind.PXB: 4, LinkKind.PIX: 5}
_SAME_GPU = 10_000  # two MIG devices of one GPU


class DeviceState(NamedTuple):
    """Live state of one GPU or MIG device (by UUID); a device with no state is idle and healthy."""

    util_pct: float | None = None  # None: unknown (MIG devices): the parent's is used
    mem_used_mib: float = 0.0
    foreign_procs: int = 0  # processes of another user or job
    healthy: bool = True
    problem: str = ""  # why it is unhealthy
    window_util_pct: float | None = None  # mean over the monitor's recent window, when known
    window_mem_mib: float | None = None  # peak memory used over that window


class Device(NamedTuple):
    """A candidate: a whole GPU (``mig`` None) or one MIG device of it."""

    gpu: Gpu
    gpu_pos: int  # position in Node.gpus (row of the link matrix)
    mig: MigDevice | None = None

    @property
    def uuid(self) -> str:
        if self.mig is None:
            return self.gpu.uuid
        return self.mig.uuid or f"{self.gpu.uuid}/mig{self.mig.index}"

    @property
    def order(self) -> tuple[int, int]:
        return (self.gpu.index, -1 if self.mig is None else self.mig.index)

    @property
    def label(self) -> str:
        return f"GPU {self.gpu.index}" if self.mig is None else f"GPU {self.gpu.index}/MIG {self.mig.index}"

    @property
    def memory_mib(self) -> int:
        return self.gpu.memory_mib if self.mig is None else self.mig.memory_mib


class Exclusion(NamedTuple):
    device: Device
    constraint: str  # the option at fault: "unhealthy", "--mem", "--exclusive" …
    detail: str


class SetKey(NamedTuple):
    """A set's rank, as a tuple that sorts best first."""

    weakest: int  # negated quality
    numa_nodes: int
    nvlinks: int  # negated
    availability: float  # negated, rounded
    order: tuple[tuple[int, int], ...]


class Ranked(NamedTuple):
    devices: tuple[Device, ...]
    key: SetKey
    weakest_link: str | None  # "NV4", "PIX", "X" (one GPU); None for one device
    availability: float


class Placement(NamedTuple):
    """The engine's answer: the chosen set (None when nothing satisfies) and why."""

    chosen: Ranked | None
    runners_up: tuple[Ranked, ...]
    excluded: tuple[Exclusion, ...]
    candidates: int  # devices considered before constraints


def link_quality(link: Link) -> int:
    """Bigger is better: NV<k> above every PCIe class, more links above fewer."""
    if link.kind is LinkKind.NVLINK:
        return 100 + link.nvlinks
    if link.kind is LinkKind.SELF:
        return _SAME_GPU
    return _CLASS_QUALITY.get(link.kind, 0)


def devices_of(node: Node, mig_profile: str | None, allowed: Iterable[str] | None = None) -> list[Device]:
    """The candidates: whole GPUs not in MIG mode, or MIG devices of ``mig_profile``.

    ``allowed``: only these UUIDs (a MIG device is allowed when it or its GPU is named).
    """
    keep = None if allowed is None else {u.lower() for u in allowed}
    out: list[Device] = []
    for pos, g in enumerate(node.gpus):
        if mig_profile is None:
            if not (g.mig_mode and g.mig_devices) and (keep is None or g.uuid.lower() in keep):
                out.append(Device(g, pos))
            continue
        for m in g.mig_devices if g.mig_mode else ():
            if m.profile != mig_profile:
                continue
            if keep is None or (m.uuid or "").lower() in keep or g.uuid.lower() in keep:
                out.append(Device(g, pos, m))
    return out


def availability(dev: Device, states: dict[str, DeviceState]) -> float:
    """0.6 × free-memory fraction + 0.4 × (1 − utilisation).

    With a window (the monitor's store): its mean utilisation, and its peak memory when higher
    than now; else the one sample. A MIG device without utilisation takes its GPU's.
    """
    st = states.get(dev.uuid.lower(), DeviceState())
    util = st.window_util_pct if st.window_util_pct is not None else st.util_pct
    if util is None and dev.mig is not None:
        parent = states.get(dev.gpu.uuid.lower(), DeviceState())
        util = parent.window_util_pct if parent.window_util_pct is not None else parent.util_pct
    used = max(st.mem_used_mib, st.window_mem_mib or 0.0)  # a recent peak counts as used
    total = dev.memory_mib or 1
    free = min(1.0, max(0.0, 1.0 - used / total))
    return 0.6 * free + 0.4 * (1.0 - min(100.0, max(0.0, util or 0.0)) / 100.0)


def _exclusion(dev: Device, req: Request, states: dict[str, DeviceState],
               cc: dict[str, tuple[int, int]]) -> Exclusion | None:
    st = states.get(dev.uuid.lower(), DeviceState())
    parent = states.get(dev.gpu.uuid.lower(), DeviceState())
    if not st.healthy or not parent.healthy:
        return Exclusion(dev, "unhealthy", st.problem or parent.problem or "not healthy")
    if req.type_text is not None and req.type_text.lower() not in dev.gpu.name.lower():
        return Exclusion(dev, "--type", f"{dev.gpu.name!r} does not contain {req.type_text!r}")
    if req.min_cc is not None:
        have = cc.get(dev.gpu.uuid.lower()) or model_cc(dev.gpu.name)
        if have is None:
            return Exclusion(dev, "--min-cc", f"compute capability unknown for {dev.gpu.name!r}")
        if have < req.min_cc:
            return Exclusion(dev, "--min-cc", f"compute capability {have[0]}.{have[1]}")
    if req.mem_mib is not None:
        free = dev.memory_mib - st.mem_used_mib
        if free < req.mem_mib:
            return Exclusion(dev, "--mem", f"{free / 1024:.1f} GiB free")
    if req.exclusive and (st.foreign_procs or (dev.mig is None and parent.foreign_procs)):
        n = st.foreign_procs or parent.foreign_procs
        return Exclusion(dev, "--exclusive", f"{n} process{'es' if n != 1 else ''} of others")
    if req.max_util is not None:
        util = st.util_pct if st.util_pct is not None else parent.util_pct
        if (util or 0.0) > req.max_util:
            return Exclusion(dev, "--max-util", f"{util:.0f} % busy")
    return None


def place(node: Node, req: Request, states: dict[str, DeviceState] | None = None,
          allowed: Iterable[str] | None = None, cc: dict[str, tuple[int, int]] | None = None) -> Placement:
    """Choose ``req.n`` devices of ``node`` (only ``allowed`` UUIDs when given).

    ``states`` is keyed by lower-case UUID; ``cc`` by lower-case GPU UUID (compute capability
    from NVML, winning over the model table).
    """
    if req.n < 1:
        raise ValueError("the count must be at least 1")
    states = {k.lower(): v for k, v in (states or {}).items()}
    cands = devices_of(node, req.mig_profile, allowed)
    excluded: list[Exclusion] = []
    ok: list[Device] = []
    for d in cands:
        why = _exclusion(d, req, states, {k.lower(): v for k, v in (cc or {}).items()})
        (excluded.append(why) if why else ok.append(d))
    ranked = _search(node, ok, req.n, states, nvlink_total=req.mig_profile is None)
    return Placement(ranked[0] if ranked else None, tuple(ranked[1:]), tuple(excluded), len(cands))


def weakest_link(node: Node, devs: Sequence[Device]) -> str | None:
    """The weakest link among ``devs`` as topo -m names it ("X" inside one GPU); None for one."""
    if len(devs) < 2:
        return None
    worst: Link | None = None
    for i, a in enumerate(devs):
        for b in devs[i + 1:]:
            link = _link(node, a.gpu_pos, b.gpu_pos)
            if worst is None or link_quality(link) < link_quality(worst):
                worst = link
    return str(worst)


def _link(node: Node, a: int, b: int) -> Link:
    if a == b:
        return Link(LinkKind.SELF)
    if node.links is None:
        return Link(LinkKind.UNKNOWN)
    return node.links[a][b]


def _search(node: Node, devs: list[Device], count: int, states: dict[str, DeviceState],
            nvlink_total: bool = True) -> list[Ranked]:
    """The best ``RUNNERS_UP + 1`` sets, best first (see the module docstring)."""
    if count > len(devs):
        return []
    # Groups: one per GPU, its devices best availability first, then lowest index.
    by_gpu: dict[int, list[tuple[float, Device]]] = {}
    for d in devs:
        by_gpu.setdefault(d.gpu_pos, []).append((round(availability(d, states), 9), d))
    positions = sorted(by_gpu)
    groups = [sorted(by_gpu[p], key=lambda ad: (-ad[0], ad[1].order)) for p in positions]
    ng = len(groups)
    links = [[_link(node, a, b) for b in positions] for a in positions]
    quality = [[link_quality(x) for x in row] for row in links]
    nvl = [[x.nvlinks if x.kind is LinkKind.NVLINK and nvlink_total else 0 for x in row] for row in links]
    numa = [groups[i][0][1].gpu.numa_node for i in range(ng)]
    # prefix sums of each group's availabilities: taking k of group g adds avail_of[g][k]
    avail_of = [[0.0] for _ in groups]
    for g, grp in enumerate(groups):
        for a, _ in grp:
            avail_of[g].append(avail_of[g][-1] + a)
    remaining = [0] * (ng + 1)  # devices in groups i..end
    for i in range(ng - 1, -1, -1):
        remaining[i] = remaining[i + 1] + len(groups[i])
    best_avail = [max((grp[0][0] for grp in groups[i:]), default=0.0) for i in range(ng + 1)]
    max_nvl = max((v for row in nvl for v in row), default=0)

    best: list[tuple[SetKey, tuple[tuple[int, int], ...]]] = []  # (key, take) sorted
    take: list[tuple[int, int]] = []  # (group, how many)

    def leaf(weak: int, nnuma: int, nl: int, avail: float) -> None:
        chosen = [d for g, k in take for _, d in groups[g][:k]]
        key = SetKey(-weak, nnuma, -nl, -round(avail, 6), tuple(sorted(d.order for d in chosen)))
        if len(best) > RUNNERS_UP and key >= best[-1][0]:
            return
        bisect.insort(best, (key, tuple(take)))
        del best[RUNNERS_UP + 1:]

    def walk(i: int, left: int, placed: int, weak: int, numas: frozenset[int | None], nl: int,
             avail: float) -> None:
        if left == 0:
            leaf(weak, len(numas), nl, avail)
            return
        if i == ng or remaining[i] < left:
            return
        if len(best) > RUNNERS_UP:
            # Bounds: weakest and NUMA count only get worse, NVLinks and availability grow by
            # at most this much. The walk meets sets in increasing index order (more of a lower
            # GPU first, each GPU's devices taken as a prefix), so a set that at best ties the
            # K-th best on the first four keys loses to it on indices: prune on >=, not >.
            kth = best[-1][0]
            nl_ub = nl + max_nvl * (left * placed + left * (left - 1) // 2)
            if (-weak, len(numas), -nl_ub, -round(avail + left * best_avail[i], 6)) >= kth[:4]:
                return
        for k in range(min(left, len(groups[i])), -1, -1):
            if k == 0:
                walk(i + 1, left, placed, weak, numas, nl, avail)
                continue
            w, add = weak, 0
            if k > 1:
                w = min(w, _SAME_GPU)
            for g, kg in take:
                w = min(w, quality[g][i])
                add += nvl[g][i] * kg
            take.append((i, k))
            walk(i + 1, left - k, placed + k, w, numas | {numa[i]}, nl + add * k, avail + avail_of[i][k])
            take.pop()

    walk(0, count, 0, _SAME_GPU + 1, frozenset(), 0, 0.0)
    out = []
    for key, took in best:
        chosen = tuple(sorted((d for g, k in took for _, d in groups[g][:k]), key=lambda d: d.order))
        out.append(Ranked(chosen, key, weakest_link(node, chosen), -key.availability))
    return out
