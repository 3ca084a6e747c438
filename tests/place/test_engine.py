"""The placement engine: hand-worked picks on built-in and small bundles, brute force, properties."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from tests.helpers.place_nodes import BUNDLES, DATA, NVL_PAIRS, PCIE_TREE, bundle_text, make_node

from gpuslurm.hw.model.node import Gpu, Link, LinkKind, MigDevice, Node
from gpuslurm.hw.source import load_node
from gpuslurm.place.engine import Device, DeviceState, Placement, devices_of, place
from gpuslurm.place.explain import explain_lines, local_cpus
from gpuslurm.place.request import Request


def indices(p: Placement) -> list[int]:
    assert p.chosen is not None
    return [d.gpu.index for d in p.chosen.devices]


def uuid_of(node: Node, i: int) -> str:
    return node.gpus[i].uuid


def test_bundles_match_generator() -> None:
    for name, node in BUNDLES.items():
        assert (DATA / name / "nvml.json").read_text() == bundle_text(node)


# --- built-in bundles, worked by hand from their topo matrices ---

def test_dgx_h100_four_stay_on_one_socket() -> None:
    node = load_node("dgx-h100")
    p = place(node, Request(4))
    # all pairs NV18 through NVSwitch: NUMA decides (0-3 on node 0), then lowest indices
    assert indices(p) == [0, 1, 2, 3]
    assert p.chosen is not None and p.chosen.weakest_link == "NV18"
    assert local_cpus(node, p.chosen.devices).numa_nodes == (0,)
    assert any("more NUMA nodes (2 vs 1)" in line for line in explain_lines(node, p))


def test_dgx_h100_load_moves_the_pick_within_a_socket() -> None:
    node = load_node("dgx-h100")
    busy = {uuid_of(node, i): DeviceState(util_pct=90, mem_used_mib=60000) for i in (0, 1)}
    assert indices(place(node, Request(2), busy)) == [2, 3]
    # four on one socket beats load: 0-3 keep NUMA 0 only if 4-7 are not free; they are
    assert indices(place(node, Request(4), busy)) == [4, 5, 6, 7]


def test_l40s_interleaved_minor_not_index() -> None:
    node = load_node("l40s-4x")
    assert [g.minor for g in node.gpus] != [g.index for g in node.gpus]
    p = place(node, Request(2))
    assert indices(p) == [0, 1]  # PIX beats NODE (2,3) and SYS
    assert p.chosen is not None and p.chosen.weakest_link == "PIX"
    assert local_cpus(node, p.chosen.devices).os_cpus == tuple(range(0, 128, 2))
    busy = {uuid_of(node, 0): DeviceState(foreign_procs=1)}
    p = place(node, Request(2, exclusive=True), busy)
    assert indices(p) == [2, 3]  # NODE, one socket, beats SYS
    assert p.chosen is not None and p.chosen.weakest_link == "NODE"
    assert local_cpus(node, p.chosen.devices).os_cpus == tuple(range(1, 128, 2))


def test_a100_mig_devices_share_their_gpu() -> None:
    node = load_node("a100-mig")
    assert [d.gpu.index for d in devices_of(node, None)] == [1]  # GPU 0 is in MIG mode
    p = place(node, Request(2, mig_profile="1g.10gb"))
    assert p.chosen is not None and p.chosen.weakest_link == "X"
    assert all(d.mig is not None and d.mig.profile == "1g.10gb" for d in p.chosen.devices)
    assert all(d.uuid.startswith("MIG-") for d in p.chosen.devices)


# --- an NVLink-pairs node ---

def test_nvlink_pairs_bonded_pair_first() -> None:
    assert indices(place(NVL_PAIRS, Request(2))) == [0, 1]
    load = {uuid_of(NVL_PAIRS, 0): DeviceState(util_pct=100)}
    assert indices(place(NVL_PAIRS, Request(2), load)) == [2, 3]


@pytest.mark.parametrize(("req", "state", "constraint"), [
    (Request(2, exclusive=True), DeviceState(foreign_procs=2), "--exclusive"),
    (Request(2, mem_mib=8192), DeviceState(mem_used_mib=38000), "--mem"),
    (Request(2), DeviceState(healthy=False, problem="Xid 79"), "unhealthy"),
])
def test_nvlink_pairs_one_of_each_pair_taken(req: Request, state: DeviceState, constraint: str) -> None:
    states = {uuid_of(NVL_PAIRS, 1): state, uuid_of(NVL_PAIRS, 3): state}
    p = place(NVL_PAIRS, req, states)
    assert indices(p) == [0, 2]
    assert p.chosen is not None and p.chosen.weakest_link == "PXB"  # beats 0-3 / 1-2 (PHB)
    text = "\n".join(explain_lines(NVL_PAIRS, p))
    assert f"excluded GPU 1 ({uuid_of(NVL_PAIRS, 1)}): {constraint}" in text
    assert f"excluded GPU 3 ({uuid_of(NVL_PAIRS, 3)}): {constraint}" in text


def test_nvlink_pairs_job_candidates_only() -> None:
    allowed = [uuid_of(NVL_PAIRS, 1), uuid_of(NVL_PAIRS, 2)]
    assert indices(place(NVL_PAIRS, Request(2), allowed=allowed)) == [1, 2]
    assert place(NVL_PAIRS, Request(3), allowed=allowed).chosen is None


# --- a PCIe switch tree ---

def test_pcie_tree_pix_pairs_first() -> None:
    assert indices(place(PCIE_TREE, Request(2))) == [0, 1]
    taken = {uuid_of(PCIE_TREE, i): DeviceState(foreign_procs=1) for i in (0, 2)}
    assert indices(place(PCIE_TREE, Request(2, exclusive=True), taken)) == [4, 5]  # a PIX pair left
    assert indices(place(PCIE_TREE, Request(4))) == [0, 1, 2, 3]  # PXB inside socket 0
    p = place(PCIE_TREE, Request(4, exclusive=True), taken)
    assert indices(p) == [4, 5, 6, 7]  # NODE on socket 1 beats SYS across
    p = place(PCIE_TREE, Request(3, exclusive=True), taken)
    assert indices(p) == [4, 5, 6]


def test_unknown_links_rank_last_but_still_pick() -> None:
    node = PCIE_TREE._replace(links=None)
    p = place(node, Request(2))
    assert indices(p) == [0, 1] and p.chosen is not None and p.chosen.weakest_link == "N/A"


def test_compute_capability_and_type() -> None:
    assert place(PCIE_TREE, Request(1, min_cc=(9, 0))).chosen is None  # L40S is 8.9
    assert indices(place(PCIE_TREE, Request(1, min_cc=(8, 9)))) == [0]
    unknown = PCIE_TREE._replace(gpus=tuple(g._replace(name="Mystery GPU")
                                                         for g in PCIE_TREE.gpus))
    p = place(unknown, Request(1, min_cc=(1, 0)))
    assert p.chosen is None and "compute capability unknown" in p.excluded[0].detail
    cc = {g.uuid: (9, 0) for g in unknown.gpus}  # NVML's answer wins over the table
    assert indices(place(unknown, Request(1, min_cc=(9, 0)), cc=cc)) == [0]
    assert place(PCIE_TREE, Request(1, type_text="h100")).chosen is None
    assert indices(place(PCIE_TREE, Request(1, type_text="l40s"))) == [0]


def test_real_single_gpu_captures(real_fixtures: Path, tmp_path: Path) -> None:
    found = 0
    for capture in sorted((real_fixtures / "multi").glob("*.txt")):
        text = capture.read_text()
        if "# $ nvidia-smi topo -m\n" not in text:
            continue
        bundle = tmp_path / capture.stem
        bundle.mkdir()
        for cmd, name in (("topo -m", "nvidia-smi-topo.txt"), ("-q", "nvidia-smi-q.txt"),
                          ("-L", "nvidia-smi-L.txt")):
            section = text.split(f"# $ nvidia-smi {cmd}\n", 1)[1].split("\n", 1)[1]
            (bundle / name).write_text(section.split("\n\n\n#####", 1)[0] + "\n")
        node = load_node(str(bundle))
        whole = devices_of(node, None)
        if not whole:
            continue
        p = place(node, Request(1))
        assert p.chosen is not None and p.chosen.devices[0].gpu is whole[0].gpu
        assert local_cpus(node, p.chosen.devices).os_cpus == node.gpus[0].cpu_affinity != ()
        found += 1
    assert found >= 2


# --- brute force and properties ---

PCIE = ["SYS", "NODE", "PHB", "PXB", "PIX"]


def brute_rank(link: Link) -> int:
    if link.kind is LinkKind.SELF:
        return 10**6
    if link.kind is LinkKind.NVLINK:
        return 1000 + link.nvlinks
    return PCIE.index(link.kind.value) + 1 if link.kind.value in PCIE else 0


def brute_best(node: Node, devs: list[Device], n: int, given: dict[str, DeviceState]) -> list[Device]:
    states = {k.lower(): v for k, v in given.items()}

    def avail(d: Device) -> float:
        s = states.get(d.uuid.lower(), DeviceState())
        util = s.util_pct if s.util_pct is not None or d.mig is None else \
            states.get(d.gpu.uuid.lower(), DeviceState()).util_pct
        free = min(1.0, max(0.0, 1 - s.mem_used_mib / d.memory_mib))
        return 0.6 * free + 0.4 * (1 - min(100.0, util or 0.0) / 100)

    def key(combo: tuple[Device, ...]) -> tuple[object, ...]:
        d0 = combo[0]
        pairs = list(itertools.combinations(combo, 2))
        links = [Link(LinkKind.SELF) if a.gpu_pos == b.gpu_pos else
                 (node.links[a.gpu_pos][b.gpu_pos] if node.links else Link(LinkKind.UNKNOWN))
                 for a, b in pairs]
        weakest = min((brute_rank(x) for x in links), default=10**7)
        return (-weakest, len({d.gpu.numa_node for d in combo}),
                -sum(x.nvlinks for x in links if x.kind is LinkKind.NVLINK and d0.mig is None),
                -round(sum(round(avail(d), 9) for d in combo), 6), sorted(d.order for d in combo))

    return sorted(min(itertools.combinations(devs, n), key=key), key=lambda d: d.order)


CLASSES = ["SYS", "NODE", "PHB", "PXB", "PIX", "NV1", "NV2", "NV4", "NV12"]


@st.composite
def nodes_and_states(draw: st.DrawFn, mig: bool = False) -> tuple[Node, dict[str, DeviceState]]:
    n = draw(st.integers(1, 7))
    cells = {(i, j): draw(st.sampled_from(CLASSES)) for i in range(n) for j in range(i + 1, n)}
    matrix = [" ".join("X" if i == j else cells[min(i, j), max(i, j)] for j in range(n)) for i in range(n)]
    numa = [draw(st.integers(0, 2)) for _ in range(n)]
    node = make_node("h", matrix, numa)
    if mig:
        gpus = []
        for g in node.gpus:
            k = draw(st.integers(0, 3))
            migs = tuple(MigDevice(i, i + 1, 0, "1g.10gb", 9856, f"MIG-{g.index}-{i}") for i in range(k))
            gpus.append(g._replace(mig_mode=True, mig_devices=migs))
        node = node._replace(gpus=tuple(gpus))
    uuids = [g.uuid for g in node.gpus] + [m.uuid or "" for g in node.gpus for m in g.mig_devices]
    states = {u: DeviceState(util_pct=draw(st.sampled_from([None, 0.0, 30.0, 100.0])),
                             mem_used_mib=draw(st.sampled_from([0.0, 5000.0, 9000.0, 40000.0])),
                             foreign_procs=draw(st.integers(0, 1)), healthy=draw(st.booleans()))
              for u in uuids if draw(st.booleans())}
    return node, states


requests = st.builds(Request, st.integers(1, 4), st.sampled_from([None, 4096.0, 20000.0]),
                     st.sampled_from([None, (8, 0), (9, 0)]), st.sampled_from([None, "a100", "h100"]),
                     st.none(), st.booleans(), st.sampled_from([None, 50.0]))


def check_invariants(node: Node, req: Request, states: dict[str, DeviceState],
                     allowed: list[str] | None) -> None:
    p = place(node, req, states, allowed)
    assert p == place(node, req, dict(reversed(states.items())), allowed)  # deterministic
    devs = devices_of(node, req.mig_profile, allowed)
    bad = {e.device.uuid for e in p.excluded}
    ok = [d for d in devs if d.uuid not in bad]
    if p.chosen is None:
        assert len(ok) < req.n
        return
    chosen = p.chosen.devices
    assert len(chosen) == req.n == len({d.uuid for d in chosen})
    for d in chosen:
        s = states.get(d.uuid, DeviceState())
        parent = states.get(d.gpu.uuid, DeviceState())
        assert s.healthy and parent.healthy
        assert allowed is None or d.uuid in allowed or d.gpu.uuid in allowed
        assert req.mem_mib is None or d.memory_mib - s.mem_used_mib >= req.mem_mib
        assert not (req.exclusive and s.foreign_procs)
        assert req.type_text is None or req.type_text in d.gpu.name.lower()
    assert [d.order for d in chosen] == [d.order for d in brute_best(node, ok, req.n, states)]


@given(nodes_and_states(), requests, st.data())
def test_engine_properties_and_brute_force(ns: tuple[Node, dict[str, DeviceState]], req: Request,
                                           data: st.DataObject) -> None:
    node, states = ns
    allowed = data.draw(st.none() | st.lists(st.sampled_from([g.uuid for g in node.gpus]), unique=True))
    check_invariants(node, req, states, allowed)


@given(nodes_and_states(mig=True), st.integers(1, 5), st.booleans())
def test_engine_mig_brute_force(ns: tuple[Node, dict[str, DeviceState]], n: int, exclusive: bool) -> None:
    node, states = ns
    check_invariants(node, Request(n, mig_profile="1g.10gb", exclusive=exclusive), states, None)


def test_sixteen_gpus_exact_and_64_devices_bounded() -> None:
    rows = [" ".join("X" if i == j else ("NV4" if i // 2 == j // 2 else ("PIX" if i // 4 == j // 4 else
                     ("NODE" if i // 8 == j // 8 else "SYS"))) for j in range(16)) for i in range(16)]
    node = make_node("n16", rows, [i // 8 for i in range(16)])
    p = place(node, Request(4))
    assert indices(p) == [0, 1, 2, 3] and p.chosen is not None and p.chosen.weakest_link == "PIX"
    dgx = load_node("dgx-h100")
    migs = tuple(MigDevice(i, i + 1, 0, "1g.10gb", 9856, f"MIG-{g.index}-{i}") for g in dgx.gpus
                 for i in range(7))
    gpus: list[Gpu] = [g._replace(mig_mode=True, mig_devices=migs[g.index * 7:(g.index + 1) * 7])
                       for g in dgx.gpus]
    big = dgx._replace(gpus=tuple(gpus))
    busy = {f"MIG-{g}-{i}": DeviceState(foreign_procs=1) for g in range(8) for i in range(5)}
    p = place(big, Request(8, mig_profile="1g.10gb", exclusive=True), busy)
    assert p.chosen is not None and len(p.chosen.devices) == 8
    assert {d.gpu.index for d in p.chosen.devices} == {0, 1, 2, 3}  # two free per GPU, one socket


def test_total_nvlinks_break_a_weakest_link_tie() -> None:
    node = make_node("nv", ["X NV2 NV1 NV1", "NV2 X NV1 NV1", "NV1 NV1 X NV12", "NV1 NV1 NV12 X"], [0] * 4)
    p = place(node, Request(3))
    assert indices(p) == [0, 2, 3]  # 14 NVLinks ({1,2,3} too: lower indices) beat 4 ({0,1,x})
    assert p.chosen is not None and p.chosen.weakest_link == "NV1"
    assert "fewer NVLinks in total (4 vs 14)" in "\n".join(explain_lines(node, p))


def test_the_most_available_set_is_found_late_in_the_walk() -> None:
    node = load_node("dgx-h100")
    busy = {uuid_of(node, i): DeviceState(util_pct=50) for i in range(6)}
    p = place(node, Request(2), busy)
    assert indices(p) == [6, 7]
    assert "lower availability (1.80 vs 2.00)" in "\n".join(explain_lines(node, p))


@given(nodes_and_states(), st.integers(2, 4))
def test_engine_brute_force_nvlink_only(ns: tuple[Node, dict[str, DeviceState]], n: int) -> None:
    node, states = ns
    # every pair NVLinked, 1 + its drawn count: weakest-link ties, so the NVLink total decides
    nv = tuple(tuple(link if link.kind is LinkKind.SELF else Link(LinkKind.NVLINK, 1 + link.nvlinks)
                     for link in row) for row in node.links or ())
    check_invariants(node._replace(links=nv), Request(n), states, None)
