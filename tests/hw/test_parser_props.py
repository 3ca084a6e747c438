"""Every parser gpuslurm owns, on hostile text: a value or its one documented error, one line, fast.

Each input is a real file with spans replaced by pieces that broke gpuslurm before (huge ranges,
NaN, line separators...) or random text. The only exceptions allowed are the parser's own.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from tests.helpers.props_hostile import PIECES, mutated, one_line

from gpuslurm.config import parse_config
from gpuslurm.errors import InputError
from gpuslurm.gres.conf_parse import parse_gres_conf
from gpuslurm.hw.formats import health_json as health
from gpuslurm.hw.formats import scenario
from gpuslurm.hw.formats.lscpu import parse_lscpu
from gpuslurm.hw.formats.mig_minors import parse_mig_minors
from gpuslurm.hw.formats.smi_text import parse_smi_list, parse_smi_query_text
from gpuslurm.hw.formats.smi_xml import parse_smi_xml
from gpuslurm.hw.formats.topo_text import parse_cpu_list, parse_topo
from gpuslurm.hw.source import BUILTIN_DIR, load_node
from gpuslurm.isolate.mig import parse_layout
from gpuslurm.ranges import MAX_CPUS, MAX_GPUS, format_ranges, parse_ranges, range_bounds
from gpuslurm.topo.hostlist import expand_hostlist

A100 = BUILTIN_DIR / "a100-mig"
NODE = load_node("a100-mig")
UUIDS = [g.uuid for g in NODE.gpus]
PARSER = settings(max_examples=400)  # pure and fast: ~1 s each under CI


def _real(name: str, size: int = 6000) -> str:
    return (A100 / name).read_text()[:size]


def _refuses_in_one_line(call: object, *args: object) -> None:
    try:
        call(*args)  # type: ignore[operator]
    except InputError as exc:
        assert one_line(str(exc)), repr(str(exc))


@st.composite
def range_case(draw: st.DrawFn) -> tuple[str, int]:
    """A limit and a list to parse against it, often with numbers just past the limit."""
    limit = draw(st.sampled_from([MAX_CPUS, MAX_GPUS, 8, 100]))
    near = st.integers(0, 2 * limit)
    item = st.one_of(near.map(str), st.tuples(near, near).map(lambda p: f"{p[0]}-{p[1]}"),
                     st.sampled_from(PIECES))
    text = draw(st.one_of(st.lists(item, min_size=1, max_size=6).map(",".join),
                          st.lists(near, max_size=8).map(format_ranges), st.text(max_size=20)))
    return text, limit


@PARSER
@given(range_case())
@example(("0-4095,0-4095", MAX_GPUS))  # each item within the limit, together twice it
@example(("56-18446744073709551616", MAX_CPUS))
def test_ranges_are_bounded_before_expanding(case: tuple[str, int]) -> None:
    text, limit = case
    try:
        values = parse_ranges(text, limit)
    except ValueError as exc:
        assert one_line(str(exc))
        return
    assert all(0 <= v < limit for v in values) and len(values) <= limit
    assert sum(b - a + 1 for a, b, _ in range_bounds(text, limit)) <= limit


@PARSER
@given(st.lists(st.integers(0, MAX_GPUS - 1), max_size=30))
def test_ranges_round_trip(ids: list[int]) -> None:
    assert parse_ranges(format_ranges(ids), MAX_GPUS) == tuple(sorted(set(ids))) if ids else True


@PARSER
@given(mutated("gpu[001-004,10],login[1-2]x[3-4],/dev/nvidia[0-3]"))
def test_host_lists_are_bounded(text: str) -> None:
    try:
        names = expand_hostlist(text, limit=64)
    except ValueError as exc:
        assert one_line(str(exc))
        return
    assert len(names) <= 64


@PARSER
@given(mutated("0-3,8,10-11"))
def test_cpu_lists(text: str) -> None:
    try:
        assert all(0 <= c < MAX_CPUS for c in parse_cpu_list(text))
    except ValueError as exc:
        assert one_line(str(exc))


@pytest.mark.parametrize(("name", "parse"), [
    ("lscpu.csv", parse_lscpu), ("nvidia-smi-topo.txt", parse_topo),
    ("mig-minors", parse_mig_minors), ("nvidia-smi-L.txt", parse_smi_list),
])
@PARSER
@given(data=st.data())
def test_bundle_text_parsers(name: str, parse: object, data: st.DataObject) -> None:
    _refuses_in_one_line(parse, data.draw(mutated(_real(name))), f"/b/{name}")


@settings(max_examples=150)  # a 20 kB XML per example
@given(mutated(_real("nvidia-smi-q.xml", 20000), edits=4))
def test_smi_xml(text: str) -> None:
    _refuses_in_one_line(parse_smi_xml, text, "/b/nvidia-smi-q.xml")


SMI_TEXT = """==============NVSMI LOG==============

Attached GPUs                             : 1
GPU 00000000:07:00.0
    Product Name                          : NVIDIA A100-SXM4-40GB
    Minor Number                          : 0
    GPU UUID                              : GPU-5e2d6a5c-2f6d-4f55-9f7b-0c0f2b1f2a11
    FB Memory Usage
        Total                             : 40960 MiB
"""


@PARSER
@given(mutated(SMI_TEXT))
def test_smi_text(text: str) -> None:
    _refuses_in_one_line(parse_smi_query_text, text, "/b/nvidia-smi-q.txt")


GRES = "NodeName=gpu[01-02] Name=gpu Type=a100 File=/dev/nvidia[0-3] Cores=0-31 Links=-1,12,12,12\n" \
       "Name=mps Count=4k\nName=gpu MultipleFiles=/dev/nvidia0,/dev/nvidia-caps/nvidia-cap[21-22]\n"


@PARSER
@given(mutated(GRES, edits=4), st.sampled_from([None, "gpu01"]))
def test_gres_conf(text: str, node: str | None) -> None:
    _refuses_in_one_line(parse_gres_conf, text, "/etc/slurm/gres.conf", node)


CONFIG = """[monitor]\ninterval_s = 10.0\ncommand_timeout_s = 5\n[throttle]\nsync_minutes = 120\n
[detect.share]\nusers = { alice = 0.5 }\n[health.temperature]\nlimit_c = 85\naction = "drain"\n"""


@PARSER
@given(mutated(CONFIG, edits=4))
def test_config_toml(text: str) -> None:
    _refuses_in_one_line(parse_config, text, "/etc/gpuslurm/gpuslurm.toml")


LAYOUT = ("""[gpus."0-1"]\nprofiles = ["3g.20gb", "3g.20gb"]\n[gpus."2"]\nmig = false\n"""
          """[gpus."3"]\nprofiles = [["1c.3g.20gb", "2c.3g.20gb"], "2g.10gb"]\n""")


@PARSER
@given(mutated(LAYOUT, edits=4))
def test_mig_layout(text: str) -> None:
    _refuses_in_one_line(parse_layout, text, "/etc/gpuslurm/mig.toml")


HEALTH = json.dumps({UUIDS[0]: {"xid": [79], "temperature_c": 90}, UUIDS[1]: {"lost": True}})
SCENARIO = json.dumps({"start": 1700000000, "steps": [
    {"at": 0, "procs": [{"pid": 5, "gpu": UUIDS[0], "mem_mib": 700}]}]})


@PARSER
@given(mutated(HEALTH, edits=4))
def test_health_json(text: str) -> None:
    _refuses_in_one_line(health.parse_scenario, text, "/b/health.json", UUIDS)


@PARSER
@given(mutated(SCENARIO, edits=4))
def test_scenario_json(text: str) -> None:
    _refuses_in_one_line(scenario.parse_scenario, text, "/b/scenario.json", NODE)


def test_bases_parse() -> None:
    """The unmutated inputs are valid, so the mutations start from something that parses."""
    parse_gres_conf(GRES, "g")
    parse_config(CONFIG, "c")
    parse_layout(LAYOUT, "l")
    health.parse_scenario(HEALTH, "h", UUIDS)
    scenario.parse_scenario(SCENARIO, "s", NODE)
    parse_smi_query_text(SMI_TEXT, "t")
    assert Path(A100).is_dir()


@pytest.mark.parametrize("text", [
    "login[1-2]9999999999999999999999999999999999999999x[3-4]",  # found by the property above
    "n[0-1]" + "9" * 40, "9" * 19 + "[1-2]",
])
def test_digits_beside_a_bracket_never_reach_clustershells_assert(text: str) -> None:
    with pytest.raises(ValueError, match="digits"):
        expand_hostlist(text, limit=64)
