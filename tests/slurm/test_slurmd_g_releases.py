"""slurmd -G as each Slurm release prints it: the real output in tests/slurm/slurmd_g/ (see its README),
read by the one parser, and the host's live 22.05 checked against its recording."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import example, given
from hypothesis import strategies as st
from tests.helpers.slurm_harness import make_devices, slurmd_parse, write_slurm_conf

from gpuslurm.errors import CommandError
from gpuslurm.gres.records import GresOptions, plan_gres
from gpuslurm.gres.render import render_node_conf, render_plan
from gpuslurm.hw.model.node import Node
from gpuslurm.hw.source import load_node
from gpuslurm.slurm.slurmd_g import SlurmGres, parse_slurmd_report, run_slurmd_report

CAPTURES = Path(__file__).parent / "slurmd_g"
RELEASES = ("22.05", "24.11", "26.05")
DEV = "/tmp/gsg/dev"


def _capture(release: str, kind: str) -> str:
    return (CAPTURES / f"{release}-{kind}.txt").read_text()


def _dgx_h100(records: tuple[SlurmGres, ...]) -> list[tuple[object, ...]]:
    return [(r.name, r.type, r.count, r.files, r.cores, r.core_count, r.links) for r in records]


EXPECTED = [("gpu", "nvidia_h100_80gb_hbm3", 1, (f"{DEV}/nvidia{i}",), "0-55" if i < 4 else "56-111", 224,
             ",".join("-1" if j == i else "18" for j in range(8))) for i in range(8)]


@pytest.mark.parametrize("release", RELEASES)
def test_every_release_clean_output_gives_the_eight_gpus(release: str) -> None:
    # 26.05 prefixes each line with a timestamp: read as 22.05 was, it gave no record at all.
    report = parse_slurmd_report(_capture(release, "clean"))
    assert _dgx_h100(report.records) == EXPECTED
    assert report.problems == ()


@pytest.mark.parametrize("release", RELEASES)
def test_every_release_warnings_are_problems(release: str) -> None:
    # 24.11 and later write "warning:": read as 22.05's "WARNING:" only, the file was reported clean.
    report = parse_slurmd_report(_capture(release, "warnings"))
    assert _dgx_h100(report.records) == EXPECTED  # slurmd dropped the two extra lines
    assert [p.split(":", 1)[0].lower() for p in report.problems] == ["warning", "warning"]
    assert "gpu:nvidia_a100 has 1 more configured than expected" in report.problems[0]
    assert "gpu:nvidia_h100_80gb_hbm3 has 1 more" in report.problems[1]


def test_flags_from_24_11_on() -> None:
    old = parse_slurmd_report(_capture("22.05", "clean")).records[0]
    new = parse_slurmd_report(_capture("26.05", "clean")).records[0]
    assert old.flags == ()
    assert new.flags[:3] == ("HAS_FILE", "HAS_TYPE", "ENV_NVML")
    assert old == new  # the flags are not part of what a record is


@pytest.mark.parametrize("release", ["24.11", "26.05"])
def test_without_munged_the_error_says_so(release: str, tmp_path: Path) -> None:
    # slurmd -G of 24.11 and later exits 1 without munged: run a stand-in that prints the recorded
    # output and exits 1, through the real runner, as run_slurmd_report would run slurmd.
    recorded = tmp_path / "out.txt"
    recorded.write_text(_capture(release, "nomunge"))
    fake = tmp_path / "slurmd"
    fake.write_text(f"#!/bin/sh\ncat {recorded} >&2\nexit 1\n")
    fake.chmod(0o755)
    (tmp_path / "etc").mkdir()
    with pytest.raises(CommandError, match=r"^slurmd -G exited 1: munged is not running") as exc:
        run_slurmd_report(tmp_path / "etc", str(fake))
    assert "Did you start munged?" in str(exc.value)
    assert len(str(exc.value).splitlines()) == 1


def test_22_05_needs_no_munged() -> None:
    clean = parse_slurmd_report(_capture("22.05", "clean"))
    assert parse_slurmd_report(_capture("22.05", "nomunge")) == clean


# ---- the parser on any prefix, record and problem -------------------------------------------------

_word = st.text(st.characters(min_codepoint=0x21, max_codepoint=0x7E, blacklist_characters="=,[]()"),
                min_size=1, max_size=12)
_prefix = st.one_of(st.just(""), st.just("slurmd: "), _word.map(lambda n: f"slurmd-{n}: "),
                    st.just("[2026-11-26T18:19:07.210] "), st.just("[2026-11-26T18:19:07] slurmd: "))
_level = st.sampled_from(["error", "fatal", "WARNING", "warning"])


@st.composite
def _records(draw: st.DrawFn) -> tuple[str, dict[str, object]]:
    name = draw(_word)
    gres_type = draw(st.one_of(st.none(), _word))
    count = draw(st.integers(0, 2**40))
    minor = draw(st.integers(0, 255))
    flags = draw(st.lists(st.sampled_from(["HAS_FILE", "HAS_TYPE", "ENV_NVML", "ENV_DEFAULT"]), max_size=4))
    links = draw(st.one_of(st.none(), st.lists(st.integers(-1, 18), min_size=1, max_size=8)))
    parts = [f"Gres Name={name} Type={gres_type or '(null)'} Count={count} Index={minor} ID=7696487",
             f"File=/dev/nvidia{minor}", "Cores=0-3 CoreCnt=8",
             "(null)" if links is None else "Links=" + ",".join(map(str, links))]
    if flags:
        parts.append("Flags=" + ",".join(flags))
    want = {"name": name, "type": gres_type, "count": count, "index": minor,
            "files": (f"/dev/nvidia{minor}",), "flags": tuple(flags),
            "links": None if links is None else ",".join(map(str, links))}
    return " ".join(parts), want


@given(st.lists(st.tuples(_prefix, st.one_of(_records(), st.tuples(_level, st.text(
    st.characters(min_codepoint=0x20, max_codepoint=0x7E), min_size=1, max_size=40).map(str.strip)))),
    max_size=8))
@example([("[2026-11-26T18:19:07.210] ", ("warning", "A line in gres.conf for GRES gpu:x has 1 more"))])
def test_any_prefix_record_and_problem(lines: list[tuple[str, tuple[object, object]]]) -> None:
    text = "\n".join(prefix + (body[0] if isinstance(body[1], dict) else f"{body[0]}: {body[1]}")
                     for prefix, body in lines)
    report = parse_slurmd_report(text)
    records = [body[1] for _, body in lines if isinstance(body[1], dict)]
    problems = list(dict.fromkeys(f"{body[0]}: {body[1]}" for _, body in lines
                                  if not isinstance(body[1], dict) and body[1]))
    got = [{k: getattr(r, k) for k in want} for r, want in zip(report.records, records, strict=True)]
    assert got == records
    assert list(report.problems) == problems


@st.composite
def _mutated(draw: st.DrawFn, base: str) -> str:
    """``base`` with a few spans replaced by random text."""
    for _ in range(draw(st.integers(0, 3))):
        start = draw(st.integers(0, len(base)))
        end = draw(st.integers(start, min(len(base), start + 20)))
        base = base[:start] + draw(st.text(max_size=12)) + base[end:]
    return base


@given(st.one_of(st.text(max_size=300), _mutated(_capture("26.05", "warnings")),
                 _mutated(_capture("22.05", "clean"))))
def test_any_text_is_read_or_refused_in_one_line(text: str) -> None:
    try:
        report = parse_slurmd_report(text)
    except CommandError as exc:
        assert str(exc).startswith("slurmd -G: ")
        return
    assert all(r.line and r.count >= 0 for r in report.records)


# ---- the host's live slurmd against its recording ---------------------------------------------

@pytest.mark.slurm
def test_host_slurmd_prints_what_was_recorded(tmp_path: Path) -> None:
    """The 22.05 recording is what this host's slurmd says today (device paths aside), so the
    recordings of the other releases, made the same way, stand for their releases."""
    node = load_node("dgx-h100")
    opts = GresOptions(node_name="dgx-h100", dev_root=str(tmp_path))
    make_devices(tmp_path / "dev", range(8))
    node_line = next(ln for ln in render_node_conf(node, "dgx-h100", opts).splitlines()
                     if ln.startswith("NodeName="))
    conf = tmp_path / "etc"
    records = slurmd_parse(conf, _gres_conf(node, opts, node_line, conf))
    assert _dgx_h100(tuple(replace(r, files=tuple(f.replace(str(tmp_path), "/tmp/gsg") for f in r.files))
                           for r in records)) == EXPECTED
    assert _dgx_h100(parse_slurmd_report(_capture("22.05", "clean")).records) == EXPECTED


def _gres_conf(node: Node, opts: GresOptions, node_line: str, conf: Path) -> str:
    write_slurm_conf(conf, node_line, gres_types="gpu")
    return render_plan(node, plan_gres(node, opts), opts)
