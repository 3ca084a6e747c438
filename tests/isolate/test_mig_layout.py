"""MIG layouts, pure: profile tables and placement, layout parsing and checking, diffs, plans."""

from __future__ import annotations

import pytest

from gpuslurm.errors import InputError
from gpuslurm.hw.model.node import Gpu, MigDevice, Node
from gpuslurm.hw.source import load_node
from gpuslurm.isolate.mig import (
    diff_lines,
    gpu_state,
    layout_toml,
    matches,
    parse_layout,
    plan_changes,
    resolve_layout,
)
from gpuslurm.isolate.mig_profiles import (
    A30,
    A100_40GB,
    A100_80GB,
    H100_80GB,
    H100_94GB,
    H200_141GB,
    board_for,
    canonical_profile,
    creation_order,
    placements,
)

A100 = load_node("a100-mig")  # GPU0: MIG 3g.40gb+2g.20gb+1g.10gb+1g.10gb; GPU1: MIG off
GPU0, GPU1 = A100.gpus[0].uuid, A100.gpus[1].uuid


def resolve(text: str, node: Node = A100) -> tuple:  # type: ignore[type-arg]
    return resolve_layout(parse_layout(text, "site.toml"), node)


# --- profile tables ---------------------------------------------------------------------------

@pytest.mark.parametrize(("name", "memory", "board"), [
    ("NVIDIA A100-SXM4-80GB", 81920, A100_80GB),
    ("NVIDIA A100 80GB PCIe", 81920, A100_80GB),
    ("NVIDIA A100-SXM4-40GB", 40960, A100_40GB),
    ("NVIDIA A100-PCIE-40GB", 40536, A100_40GB),
    ("NVIDIA H100 80GB HBM3", 81559, H100_80GB),
    ("NVIDIA H100 PCIe", 81559, H100_80GB),
    ("NVIDIA H100 NVL", 95830, H100_94GB),
    ("NVIDIA H200", 143771, H200_141GB),
    ("NVIDIA A30", 24576, A30),
    ("NVIDIA GH200 480GB", 97871, None),  # a Grace Hopper, not an H200: no table rather than a wrong one
    ("NVIDIA L40S", 46068, None),
])
def test_board_for_picks_the_table_by_model_and_memory(name: str, memory: int, board: object) -> None:
    assert board_for(name, memory) == board


def test_profile_names_follow_the_memory_size() -> None:
    assert "1g.5gb" in A100_40GB.names and "3g.20gb" in A100_40GB.names and "7g.40gb" in A100_40GB.names
    assert "3g.40gb" in A100_80GB.names and "1g.20gb" in A100_80GB.names and "3g.20gb" not in A100_80GB.names
    assert "3g.47gb" in H100_94GB.names and "7g.141gb" in H200_141GB.names
    assert "4g.24gb" in A30.names and A30.compute_slices == 4


@pytest.mark.parametrize(("profiles", "fits"), [
    (("3g.40gb", "3g.40gb"), True),
    (("4g.40gb", "3g.40gb"), True),
    (("3g.40gb", "2g.20gb", "1g.10gb", "1g.10gb"), True),  # the a100-mig capture's own layout
    (("1g.10gb",) * 7, True),
    (("1g.20gb",) * 4, True),
    (("2g.20gb", "2g.20gb", "2g.20gb", "1g.20gb"), True),
    (("3g.40gb", "3g.40gb", "1g.10gb"), False),  # 7 compute slices, but each 3g takes half the memory
    (("4g.40gb", "4g.40gb"), False),
    (("7g.80gb", "1g.10gb"), False),
    (("1g.10gb",) * 8, False),
    (("1g.20gb",) * 5, False),
])
def test_placements_model_the_memory_slices(profiles: tuple[str, ...], fits: bool) -> None:
    result = placements(A100_80GB, profiles)
    assert (result is not None) is fits
    if result is not None:  # the placements found really are disjoint and allowed
        used: list[int] = []
        for name, start in zip(profiles, result, strict=True):
            shape = A100_80GB.profile(name)
            assert shape is not None and start in shape.starts
            used += range(start, start + shape.size)
        assert len(used) == len(set(used)) and max(used) < 8


def test_creation_order_is_biggest_first_and_keeps_restricted_shapes_ahead() -> None:
    assert creation_order(A100_80GB, ("1g.10gb", "3g.40gb", "1g.20gb", "2g.20gb")) == (
        "3g.40gb", "2g.20gb", "1g.20gb", "1g.10gb")


@pytest.mark.parametrize(("name", "memory", "canonical"), [
    ("3g.39gb", 40192, "3g.40gb"),  # as gpuslurm names an NVML MIG device: memory rounded to GiB
    ("7g.79gb", 81050, "7g.80gb"),
    ("1g.10gb", 9728, "1g.10gb"),
    ("1g.19gb", 19968, "1g.20gb"),
    ("1c.3g.40gb", 40192, "3g.40gb"),  # a compute instance's name: its GPU instance's profile
])
def test_canonical_profile_maps_nvml_names_onto_the_table(name: str, memory: int, canonical: str) -> None:
    assert canonical_profile(A100_80GB, name, memory) == canonical
    assert canonical_profile(None, "3g.39gb", 40192) == "3g.39gb"


# --- parsing: every mistake is one line naming the file and the entry -------------------------

BAD_LAYOUTS = [
    ("[gpus.0\nprofiles = []", "not valid TOML"),
    ('node = "x"\n[gpus.0]\nmig = false', "unknown key 'node'"),
    ("", "no GPUs"),
    ("[gpus]", "no GPUs"),
    ('gpus = {"0" = 1}', 'gpus."0" must be a table'),
    ('[gpus.0]\nprofile = ["3g.40gb"]', "[gpus.\"0\"]: unknown key 'profile'"),
    ('[gpus.0]\nmig = "yes"', 'mig must be true or false'),
    ('[gpus.0]\nprofiles = "3g.40gb"', "profiles must be a list"),
    ("[gpus.0]\nprofiles = [3]", "profiles must be a list"),
    ('[gpus.0]\nprofiles = ["3g40gb"]', "'3g40gb' is not a GPU-instance profile name"),
    ('[gpus.0]\nprofiles = ["1c.3g.40gb"]', "'1c.3g.40gb' is not a GPU-instance profile name"),
    ('[gpus.0]\nprofiles = [[]]', "a list of 1 to 7 compute-instance profile names"),
    ('[gpus.0]\nprofiles = [["1c.1g.10gb"] ]', "'1c.1g.10gb' is not a compute-instance profile name"),
    ('[gpus.0]\nprofiles = [["3g.40gb"]]', "'3g.40gb' is not a compute-instance profile name"),
    ('[gpus.0]\nprofiles = [[1]]', "a list of 1 to 7 compute-instance profile names"),
    ('[gpus.0]\nprofiles = [["1c.3g.40gb", "1c.4g.40gb"]]', "are not of one GPU instance profile"),
    ('[gpus.0]\nprofiles = [["1c.3g.40gb"]] \n[gpus.1]\nmig = false\n[gpus.2]\nprofiles = [{}]',
     "profiles must be a list"),
    ("[gpus.0]", 'say what these GPUs should be'),
    ('[gpus.0]\nmig = false\nprofiles = ["7g.80gb"]', "mig = false but profiles are given"),
    ('[gpus.first]\nmig = false', '[gpus."first"]: not a GPU selector'),
    ('[gpus."3-1"]\nmig = false', '[gpus."3-1"]: not a GPU selector'),
    ('[gpus."0-"]\nmig = false', '[gpus."0-"]: not a GPU selector'),
    ('[gpus.""]\nmig = false', '[gpus.""]: not a GPU selector'),
    # a line separator other than \n in a quoted key would start a second log line of the
    # file's author's choosing (found by test_parser_props with U+2028)
    ('[gpus."0\u2028FAKE: all GPUs healthy"]\nmig = false', '[gpus."0 FAKE: all GPUs healthy"]'),
]


@pytest.mark.parametrize(("text", "expected"), BAD_LAYOUTS)
def test_bad_layout_files_are_one_line_errors(text: str, expected: str) -> None:
    with pytest.raises(InputError) as info:
        parse_layout(text, "/etc/gpuslurm/mig.toml")
    message = str(info.value)
    assert message.startswith("/etc/gpuslurm/mig.toml: ") and expected in message
    assert len(message.splitlines()) == 1 and info.value.exit_code == 2


BAD_FOR_THE_NODE = [
    ('[gpus."0-3"]\nmig = false', '[gpus."0-3"]: no GPU 2-3 on a100-mig01 (it has GPUs 0-1)'),
    ('[gpus."GPU-00000000-0000-0000-0000-000000000000"]\nmig = false', "no GPU GPU-00000000"),
    ('[gpus.all]\nmig = false\n[gpus.1]\nmig = false', '[gpus."1"]: GPU 1 is also selected by [gpus."all"]'),
    ('[gpus."0-1"]\nmig = false\n[gpus."1,0"]\nmig = false', "GPU 0 is also selected by [gpus.\"0-1\"]"),
    ('[gpus.0]\nprofiles = ["3g.20gb"]', "unknown profile '3g.20gb'; A100 80GB offers 1g.10gb, "),
    ('[gpus.0]\nprofiles = ["4g.40gb", "4g.40gb"]', "4g.40gb+4g.40gb needs 8 compute slices, the GPU has 7"),
    ('[gpus.0]\nprofiles = ["3g.40gb", "1g.10gb", "3g.40gb"]', "do not fit together"),
    ('[gpus.0]\nprofiles = ["1g.10gb+me", "1g.10gb+me"]', "only one profile per GPU can have media"),
    ('[gpus.0]\nprofiles = [["2c.3g.40gb", "2c.3g.40gb"]]', "2c.3g.40gb+2c.3g.40gb need 4 compute slices, "
     "3g.40gb has 3"),
    ('[gpus.0]\nprofiles = [["1c.3g.20gb", "2c.3g.20gb"]]', "unknown profile '3g.20gb'"),
]


@pytest.mark.parametrize(("text", "expected"), BAD_FOR_THE_NODE)
def test_layouts_that_do_not_fit_the_node_are_one_line_errors(text: str, expected: str) -> None:
    with pytest.raises(InputError) as info:
        resolve(text)
    message = str(info.value)
    assert message.startswith("site.toml: ") and expected in message and "\n" not in message


def test_gpus_without_mig_or_without_a_table() -> None:
    l40s = load_node("l40s-4x")
    with pytest.raises(InputError, match=r'\[gpus."2"\]: GPU 2 \(NVIDIA L40S\) does not support MIG'):
        resolve('[gpus.2]\nprofiles = []', l40s)
    assert plan_changes(l40s, resolve("[gpus.all]\nmig = false", l40s)) == ()  # nothing to switch off
    odd = Node("n1", (Gpu("GPU-1", 0, 0, "00000000:01:00.0", "NVIDIA X9000", 100_000, mig_mode=False),))
    with pytest.raises(InputError, match="gpuslurm has no MIG profile table for this model"):
        resolve('[gpus.0]\nprofiles = ["1g.10gb"]', odd)


def test_selectors_by_uuid_any_case_and_by_list() -> None:
    wanted = resolve(f'[gpus."{GPU1.upper().replace("GPU-", "gpu-")}"]\nmig = false')
    assert [w.uuid for w in wanted] == [GPU1]
    assert [w.index for w in resolve('[gpus."1,0"]\nmig = false')] == [0, 1]


# --- current state, diff, plan ----------------------------------------------------------------

def test_the_capture_matches_its_own_layout_and_show_as_layout_round_trips() -> None:
    text = layout_toml(A100)
    assert '[gpus."0"]' in text and 'profiles = ["3g.40gb", "2g.20gb", "1g.10gb", "1g.10gb"]' in text
    assert '[gpus."1"]' in text and "mig = false" in text
    assert diff_lines(A100, resolve(text)) == []
    dgx = load_node("dgx-h100")
    text = layout_toml(dgx)
    assert '[gpus."0-7"]  # NVIDIA H100 80GB HBM3\nmig = false' in text
    assert diff_lines(dgx, resolve(text, dgx)) == []
    assert "GPU 0-3 (NVIDIA L40S): no MIG support" in layout_toml(load_node("l40s-4x"))


def test_profile_order_and_media_suffix_do_not_count_as_differences() -> None:
    wanted = resolve('[gpus.0]\nprofiles = ["1g.10gb", "1g.10gb+me", "2g.20gb", "3g.40gb"]')
    assert diff_lines(A100, wanted) == []


def test_nvml_style_profile_names_match_the_table() -> None:
    gpu = A100.gpus[0]
    nvml_named = gpu._replace(mig_devices=tuple(
        m._replace(profile=m.profile.replace("3g.40gb", "3g.39gb")) for m in gpu.mig_devices))
    state = gpu_state(nvml_named)
    assert state.profiles == ("3g.40gb", "2g.20gb", "1g.10gb", "1g.10gb")
    assert matches(state, resolve('[gpus.0]\nprofiles = ["3g.40gb", "2g.20gb", "1g.10gb", "1g.10gb"]')[0])


def test_split_compute_instances_differ_from_the_default_one() -> None:
    gpu = A100.gpus[0]._replace(mig_devices=(
        MigDevice(0, 1, 0, "1c.3g.40gb", 40192), MigDevice(1, 1, 1, "2c.3g.40gb", 40192)))
    node = A100._replace(gpus=(gpu, A100.gpus[1]))
    wanted = resolve('[gpus.0]\nprofiles = ["3g.40gb"]', node)
    assert diff_lines(node, wanted) == [
        f'GPU 0 ({GPU0}): is MIG 3g.40gb[1c.3g.40gb,2c.3g.40gb], layout [gpus."0"] wants MIG 3g.40gb']
    assert [s.kind for s in plan_changes(node, wanted)[0].steps] == ["destroy-ci", "destroy-gi", "create"]


def test_split_compute_instances_round_trip_through_the_layout() -> None:
    # NVML-style names (3g.39gb) are named on the table (3g.40gb), the compute instances too
    gpu = A100.gpus[0]._replace(mig_devices=(
        MigDevice(0, 1, 0, "1c.3g.39gb", 40192), MigDevice(1, 1, 1, "2c.3g.39gb", 40192),
        MigDevice(2, 2, 0, "3g.39gb", 40192)))
    node = A100._replace(gpus=(gpu, A100.gpus[1]))
    text = layout_toml(node)
    assert 'profiles = [["1c.3g.40gb", "2c.3g.40gb"], "3g.40gb"]' in text
    assert diff_lines(node, resolve(text, node)) == []
    assert plan_changes(node, resolve(text, node)) == ()
    # order of the instances and of the compute instances within one does not count
    reordered = resolve('[gpus.0]\nprofiles = ["3g.40gb", ["2c.3g.40gb", "1c.3g.40gb"]]', node)
    assert diff_lines(node, reordered) == []
    other = resolve('[gpus.0]\nprofiles = [["1c.3g.40gb", "1c.3g.40gb"], "3g.40gb"]', node)
    assert diff_lines(node, other) == [
        f'GPU 0 ({GPU0}): is MIG 3g.40gb[1c.3g.40gb,2c.3g.40gb]+3g.40gb, layout [gpus."0"] wants '
        'MIG 3g.40gb[1c.3g.40gb,1c.3g.40gb]+3g.40gb']
    with pytest.raises(InputError, match="apply creates one full compute instance per GPU instance"):
        plan_changes(node, other)


def test_plan_rebuilds_only_the_gpus_that_differ_in_the_documented_order() -> None:
    wanted = resolve('[gpus.all]\nprofiles = ["3g.40gb", "3g.40gb"]')
    changes = plan_changes(A100, wanted)
    assert [c.wanted.index for c in changes] == [0, 1]
    assert [s.args for s in changes[0].steps] == [
        ("mig", "-i", "0", "-dci"), ("mig", "-i", "0", "-dgi"),
        ("mig", "-i", "0", "-cgi", "3g.40gb,3g.40gb", "-C")]
    assert [s.args for s in changes[1].steps] == [
        ("-i", "1", "-mig", "1"), ("mig", "-i", "1", "-cgi", "3g.40gb,3g.40gb", "-C")]
    assert changes[1].steps[0].mode is True


def test_plan_for_mig_off_and_for_mig_on_without_instances() -> None:
    off = plan_changes(A100, resolve("[gpus.0]\nmig = false"))
    assert [(s.kind, s.args) for s in off[0].steps] == [
        ("destroy-ci", ("mig", "-i", "0", "-dci")), ("destroy-gi", ("mig", "-i", "0", "-dgi")),
        ("mode", ("-i", "0", "-mig", "0"))]
    empty = plan_changes(A100, resolve("[gpus.1]\nmig = true"))
    assert [s.args for s in empty[0].steps] == [("-i", "1", "-mig", "1")]
    assert plan_changes(A100, resolve("[gpus.1]\nmig = false")) == ()
    diff = diff_lines(A100, resolve('[gpus."0-1"]\nprofiles = ["7g.80gb"]'))
    assert diff == [
        f'GPU 0 ({GPU0}): is MIG 3g.40gb+2g.20gb+1g.10gb+1g.10gb, layout [gpus."0-1"] wants MIG 7g.80gb',
        f'GPU 1 ({GPU1}): is MIG off, layout [gpus."0-1"] wants MIG 7g.80gb']
