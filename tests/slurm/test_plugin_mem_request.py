"""job_submit.lua: ``--comment gpuslurm:mem>=40G`` becomes ``--constraint=gpumem_ge_40g`` (the
feature node-conf writes, docs/features.md), under the real lua5.1 with the fake ``slurm``."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from tests.helpers.lua_harness import PLUGIN, lua_str, run_lua

from gpuslurm.gres.features import MEMORY_CLASSES_GIB


def _submit(tmp_path: Path, comment: str, features: str | None = None) -> tuple[str, str | None, list[str]]:
    """(return code, the job's features after submission, messages to the user)."""
    fields = f"comment = {lua_str(comment)}" + (f", features = {lua_str(features)}" if features else "")
    lines = run_lua(f"""
gpuslurm_throttle.default_path = function() return {lua_str(str(tmp_path / "none"))} end
local j = job({{{fields}}})
out("rc", slurm_job_submit(j, {{}}, 1000))
out("features", j.features)
dump_logs()
""")
    got = dict(line.split("|", 1) for line in lines if line.startswith(("rc|", "features|")))
    return got["rc"], None if got["features"] == "nil" else got["features"], \
        [line[5:] for line in lines if line.startswith("USER ")]


def test_the_lua_classes_are_pythons() -> None:
    text = PLUGIN.read_text()
    match = re.search(r"M\.MEMORY_CLASSES_GIB = \{([^}]*)\}", text)
    assert match and tuple(int(x) for x in match.group(1).split(",")) == MEMORY_CLASSES_GIB


@pytest.mark.parametrize(("comment", "feature"), [
    ("gpuslurm:mem>=40G", "gpumem_ge_40g"), ("gpuslurm:mem>=40GB", "gpumem_ge_40g"),
    ("gpuslurm:mem>=40GiB", "gpumem_ge_40g"), ("train; gpuslurm:mem>=30g", "gpumem_ge_32g"),
    ("gpuslurm:mem>=80G,x", "gpumem_ge_80g"), ("gpuslurm:mem>=81G", "gpumem_ge_94g"),
    ("gpuslurm:mem>=0.1T", "gpumem_ge_128g"), ("gpuslurm:mem>=4096M", "gpumem_ge_8g"),
    ("gpuslurm:mem>=288G", "gpumem_ge_288g"),
])
def test_a_request_becomes_the_feature(tmp_path: Path, comment: str, feature: str) -> None:
    rc, features, user = _submit(tmp_path, comment)
    assert (rc, features) == ("0", feature)
    word = comment.split()[-1].split(",")[0].split(";")[-1]
    assert user == [f"gpuslurm: {word} asks for --constraint={feature}"]


def test_anded_with_a_plain_constraint_refused_with_an_or(tmp_path: Path) -> None:
    assert _submit(tmp_path, "gpuslurm:mem>=40G", "h100&ib")[:2] == ("0", "h100&ib&gpumem_ge_40g")
    rc, features, user = _submit(tmp_path, "gpuslurm:mem>=40G", "h100|a100")
    assert (rc, features) == ("-1", "h100|a100")
    assert user == ['gpuslurm: cannot add gpumem_ge_40g (from "gpuslurm:mem>=40G" in --comment) to '
                    '--constraint="h100|a100": write it into your constraint']


@pytest.mark.parametrize("comment", ["gpuslurm:mem>=40", "gpuslurm:mem>=", "gpuslurm:mem>=G",
                                     "gpuslurm:mem>=-4G", "gpuslurm:mem>=0G", "gpuslurm:mem>=4X",
                                     "gpuslurm:mem>=1e9G", "gpuslurm:mem>=40GBB",
                                     "gpuslurm:mem>=9999999999999G"])
def test_a_malformed_request_is_refused(tmp_path: Path, comment: str) -> None:
    rc, features, user = _submit(tmp_path, comment)
    assert (rc, features) == ("-1", None)
    assert len(user) == 1 and "malformed GPU memory request" in user[0] and "gpuslurm:mem>=40G" in user[0]


def test_more_than_any_gpu_has_is_refused_with_the_largest_class(tmp_path: Path) -> None:
    rc, features, user = _submit(tmp_path, "gpuslurm:mem>=300G")
    assert (rc, features) == ("-1", None)
    assert user == ['gpuslurm: no GPU has 300G of memory ("gpuslurm:mem>=300G" in --comment; the largest '
                    "class is 288G)"]


def test_other_comments_pass_untouched(tmp_path: Path) -> None:
    for comment in ("", "gpuslurm:mps", "mem>=40G", "gpuslurm:memory>=40G"):
        assert _submit(tmp_path, comment)[:2] == ("0", None), comment


@pytest.mark.parametrize("comment", [
    "gpuslurm:mem>=" + "9" * 5000 + "G", "gpuslurm:mem>=%d%s%%G", "gpuslurm:mem>=40G\0x",
    "gpuslurm:mem>= " * 20000, "gpuslurm:mem>=(.-)*G", "gpuslurm:mem>=[^%]G",
    "gpuslurm:mem>=1.99999999999G", "gpuslurm:mem>=nan", "gpuslurm:mem>=infG",
    "gpuslurm:mem>=0x10G", "gpuslurm:mem>=\xff\xfeG",
])
def test_hostile_comments_are_refused_in_one_line(tmp_path: Path, comment: str) -> None:
    """Lua pattern specials, ``%`` formats, NUL, huge numbers, many request words: refused with one
    message (never a Lua error, which would pass the job unchecked)."""
    rc, features, user = _submit(tmp_path, comment, "%s%s")
    assert (rc, features) == ("-1", "%s%s")
    assert len(user) == 1 and user[0].startswith("gpuslurm: malformed GPU memory request"), user
    assert len(user[0]) < 300


@pytest.mark.parametrize("features", ["%s%n", "a" * 100_000, "h100&", "!gpumem_ge_8g"])
def test_a_request_beside_any_plain_constraint_is_anded(tmp_path: Path, features: str) -> None:
    rc, got, user = _submit(tmp_path, "gpuslurm:mem>=40G " * 1000, features)
    assert (rc, got) == ("0", features + "&gpumem_ge_40g") and len(user) == 1
