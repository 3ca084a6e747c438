"""gres.features: Slurm node features from the hardware, and node-conf's Features= (hand-worked)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner
from hypothesis import given
from hypothesis import strategies as st

from gpuslurm.cli.main import cli
from gpuslurm.gres.features import (
    FEATURE_RE,
    MEMORY_CLASSES_GIB,
    hardware_features,
    memory_class_gib,
    merge_features,
    model_feature,
)
from gpuslurm.gres.render import render_node_conf
from gpuslurm.hw.formats.nvml_json import dump_node
from gpuslurm.hw.model.node import Link, LinkKind
from gpuslurm.hw.source import bundle_path, load_node

LADDER_80 = [f"gpumem_ge_{c}g" for c in (8, 10, 12, 16, 20, 24, 32, 40, 48, 64, 80)]


def test_builtin_bundles() -> None:
    assert hardware_features(load_node("dgx-h100")) == ("h100", "gpumem_80g", *LADDER_80, "cc_9.0", "nvlink",
                                                        "nvswitch")
    assert hardware_features(load_node("l40s-4x")) == ("l40s", "gpumem_48g", *LADDER_80[:9], "cc_8.9")
    # one GPU in MIG mode, one not: no "mig"; NVLink between the two
    assert hardware_features(load_node("a100-mig")) == ("a100", "gpumem_80g", *LADDER_80, "cc_8.0", "nvlink")


@pytest.mark.parametrize(("xml", "model", "mem", "cc"), [
    ("a100-sxm4-mig-v12.xml", "a100", 80, "cc_8.0"),
    ("a10g.xml", "a10g", 24, "cc_8.6"),
    ("dual_2080-v13.xml", "rtx_2080", 8, None),  # not in the model table: no cc_ feature
    ("dual_a5000-v13.xml", "rtx_a5000", 24, "cc_8.6"),
    ("pro-6000-maxq-blackwell-v13.xml", "rtx_pro_6000_blackwell_max_q", 96, None),
    ("tesla-t4.xml", "t4", 16, "cc_7.5"),
])
def test_real_captures(real_fixtures: Path, tmp_path: Path, xml: str, model: str, mem: int,
                       cc: str | None) -> None:
    shutil.copy(real_fixtures / "nvidia-smi-q-x" / xml, tmp_path / "nvidia-smi-q.xml")
    got = hardware_features(load_node(str(tmp_path)))
    assert got[:2] == (model, f"gpumem_{mem}g")
    assert (cc in got) if cc else not any(f.startswith("cc_") for f in got)
    rungs = [int(f[10:-1]) for f in got if f.startswith("gpumem_ge_")]
    assert max(rungs) == mem


def test_nvml_capability_wins_and_mixed_nodes_lose_the_feature() -> None:
    dgx = load_node("dgx-h100")
    assert "cc_9.1" in hardware_features(dgx, {g.uuid: (9, 1) for g in dgx.gpus})
    one_off = {dgx.gpus[0].uuid: (8, 0)}  # the rest from the table, 9.0: mixed
    assert not any(f.startswith("cc_") for f in hardware_features(dgx, one_off))
    mixed = dgx._replace(gpus=(dgx.gpus[0]._replace(name="NVIDIA L4", memory_mib=23034), *dgx.gpus[1:]))
    got = hardware_features(mixed)
    assert got[0] == "gpumem_24g"  # no model; the smallest GPU's class
    assert "gpumem_ge_24g" in got and "gpumem_ge_32g" not in got


def test_links() -> None:
    dgx = load_node("dgx-h100")
    pcie = dgx._replace(links=tuple(tuple(Link(LinkKind.SELF) if i == j else Link(LinkKind.SYS)
                                          for j in range(8)) for i in range(8)))
    assert not {"nvlink", "nvswitch"} & set(hardware_features(pcie))
    one_pair = [list(row) for row in pcie.links or ()]
    one_pair[0][1] = one_pair[1][0] = Link(LinkKind.NVLINK, 4)
    got = hardware_features(pcie._replace(links=tuple(tuple(r) for r in one_pair)))
    assert "nvlink" in got and "nvswitch" not in got
    four = dgx._replace(gpus=dgx.gpus[:4], links=tuple(row[:4] for row in (dgx.links or ())[:4]))
    assert "nvswitch" not in hardware_features(four)  # 4 GPUs can be meshed directly
    assert "nvlink" not in hardware_features(dgx._replace(links=None))


def test_mig_when_every_gpu_is_in_mig_mode() -> None:
    node = load_node("a100-mig")
    assert "mig" in hardware_features(node._replace(gpus=tuple(g._replace(mig_mode=True) for g in node.gpus)))


@given(st.integers(1, 2_000_000))
def test_memory_class_is_the_smallest_class_not_below(mib: int) -> None:
    c = memory_class_gib(mib)
    assert c * 1024 >= mib - 11  # a hair over (0.01 GiB) keeps the class
    smaller = [x for x in MEMORY_CLASSES_GIB if x < c]
    assert all(x * 1024 < mib - 10 for x in smaller)


@given(st.integers(1, 400 * 1024), st.integers(1, 400))
def test_ge_feature_iff_the_class_reaches_it(mib: int, want_gib: int) -> None:
    """``--constraint=gpumem_ge_<X>g``, X the smallest class >= the request, holds exactly on
    nodes whose class is at least the request."""
    dgx = load_node("dgx-h100")
    node = dgx._replace(gpus=tuple(g._replace(memory_mib=mib) for g in dgx.gpus))
    features = hardware_features(node)
    rung = next((x for x in MEMORY_CLASSES_GIB if x >= want_gib), None)
    if rung is not None:
        assert (f"gpumem_ge_{rung}g" in features) == (memory_class_gib(mib) >= want_gib)
    assert all(FEATURE_RE.match(f) for f in features)


@given(st.text(max_size=60))
def test_model_feature_is_a_feature_name_or_none(name: str) -> None:
    got = model_feature(name)
    assert got is None or (FEATURE_RE.match(got) and got == got.lower())


def test_merge_keeps_the_admins_first() -> None:
    assert merge_features(["ib", "h100"], ["h100", "gpumem_80g"]) == ("ib", "h100", "gpumem_80g")


def test_node_conf_line() -> None:
    line = render_node_conf(load_node("l40s-4x"), "n1", features=["ib", "mps"])
    assert "Gres=gpu:nvidia_l40s:4 Features=ib,mps,l40s,gpumem_48g," in line
    assert line.rstrip().endswith("gpumem_ge_48g,cc_8.9")


def test_node_conf_cli(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    runner = CliRunner()
    monkeypatch.setenv("GPUSLURM_CONFIG", "/dev/null")
    out = runner.invoke(cli, ["node-conf", "--from", "dgx-h100", "--feature", "ib,fast", "--feature", "x"])
    assert out.exit_code == 0 and "Features=ib,fast,x,h100,gpumem_80g," in out.output
    bad = subprocess.run([sys.executable, "-m", "gpuslurm", "node-conf", "--from", "dgx-h100", "--feature",
                          "ib&gpu"], capture_output=True, text=True, check=False, timeout=60,
                         env={**os.environ, "GPUSLURM_CONFIG": "/dev/null"})
    assert (bad.returncode, bad.stdout) == (2, "")
    assert bad.stderr == "gpuslurm: --feature: not a Slurm feature name: 'ib&gpu' (letters, digits, _ . -)\n"
    config = tmp_path / "config.toml"
    config.write_text('[mps]\ntriggers = ["gres", "feature"]\nfeature = "shared_gpu"\n')
    monkeypatch.setenv("GPUSLURM_CONFIG", str(config))
    out = runner.invoke(cli, ["node-conf", "--from", "dgx-h100"])
    assert out.exit_code == 0 and "Features=shared_gpu,h100," in out.output  # the MPS trigger's feature


def test_capture_capability_from_nvml_json(tmp_path: Path) -> None:
    bundle = tmp_path / "b"
    shutil.copytree(str(bundle_path("dgx-h100")), bundle)
    node = load_node(str(bundle))
    (bundle / "nvml.json").write_text(dump_node(node, {g.uuid: (9, 1) for g in node.gpus}))
    out = CliRunner().invoke(cli, ["node-conf", "--from", str(bundle)], env={"GPUSLURM_CONFIG": "/dev/null"})
    assert out.exit_code == 0 and ",cc_9.1," in out.output
