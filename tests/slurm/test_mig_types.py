"""MIG GRES Types per target Slurm release: the built-in a100-mig bundle and the real MIG captures,
for 22.05, 24.11 and 26.05, through the library and through ``gpuslurm gres-conf``."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner
from hypothesis import given
from hypothesis import strategies as st

from gpuslurm.cli.main import cli
from gpuslurm.errors import CaptureError, InputError
from gpuslurm.gres.records import GresOptions, plan_gres
from gpuslurm.hw.model.node import Node
from gpuslurm.hw.replay.bundle import read_bundle
from gpuslurm.hw.replay.importer import import_multi_capture
from gpuslurm.hw.source import load_node
from gpuslurm.slurm.mig_types import (
    SlurmVersion,
    later_naming,
    mig_naming,
    parse_slurm_version,
    target_naming,
)

RELEASES = ("22.05", "24.11", "26.05")


def _types(node: Node, release: str) -> list[str]:
    naming = mig_naming(parse_slurm_version(release), "test")
    return [naming.type_of(g.name, m) for g in node.gpus for m in g.mig_devices]


def _imported(real_fixtures: Path, tmp_path: Path, capture: str) -> Node:
    import_multi_capture(real_fixtures / "multi" / capture, tmp_path / "b")
    return read_bundle(tmp_path / "b")


A100 = {  # built-in a100-mig: 3g.40gb (40192 MiB), 2g.20gb, 1g.10gb twice
    "22.05": ["nvidia_a100_3g.39gb", "nvidia_a100_2g.20gb", "nvidia_a100_1g.10gb", "nvidia_a100_1g.10gb"],
    "24.11": ["nvidia_a100_3g.40gb", "nvidia_a100_2g.20gb", "nvidia_a100_1g.10gb", "nvidia_a100_1g.10gb"],
}
A100["26.05"] = A100["24.11"]


@pytest.mark.parametrize("release", RELEASES)
def test_a100_mig_bundle(release: str) -> None:
    node = load_node("a100-mig")
    plan = plan_gres(node, GresOptions(mig=mig_naming(parse_slurm_version(release), "test")))
    assert [r.type for r in plan.gpu_records if r.mig is not None] == A100[release]
    split = any("bug 17482" in n for n in plan.notes)
    assert split is (release == "22.05")  # fixed in 23.02.7: no note where it does not apply


H200 = {  # real H200 (590.48.01): two compute instances share GI 2
    "22.05": ["nvidia_h200_3g.70gb", "nvidia_h200_3g.70gb", "nvidia_h200_2g.33gb", "nvidia_h200_1g.16gb",
              "nvidia_h200_1g.16gb"],
    "24.11": ["nvidia_h200_1c.3g.71gb", "nvidia_h200_2c.3g.71gb", "nvidia_h200_2g.35gb",
              "nvidia_h200_1g.18gb", "nvidia_h200_1g.18gb"],
}
H200["26.05"] = H200["24.11"]
# real H100 80GB HBM3: its 3g.40gb has 40448 MiB, 39.5 GiB, which roundl() takes to 40: no rename
_H100 = ["nvidia_h100_80gb_hbm3_3g.40gb", "nvidia_h100_80gb_hbm3_2g.20gb", "nvidia_h100_80gb_hbm3_1g.10gb",
         "nvidia_h100_80gb_hbm3_1g.10gb"]
H100 = dict.fromkeys(RELEASES, _H100)


@pytest.mark.parametrize("release", RELEASES)
@pytest.mark.parametrize(("capture", "want"), [("h200-mig__590.48.01.txt", H200),
                                               ("h100-mig__590.48.01.txt", H100)])
def test_real_captures(real_fixtures: Path, tmp_path: Path, capture: str, want: dict[str, list[str]],
                       release: str) -> None:
    assert _types(_imported(real_fixtures, tmp_path, capture), release) == want[release]


def test_h200_compute_instances_of_one_gi_get_two_types_from_23_02_6(real_fixtures: Path,
                                                                      tmp_path: Path) -> None:
    node = _imported(real_fixtures, tmp_path, "h200-mig__590.48.01.txt")
    assert len(set(_types(node, "23.02.5")[:2])) == 1
    assert len(set(_types(node, "23.02.6")[:2])) == 2


def test_a_capture_without_profile_names_is_refused_for_every_release(real_fixtures: Path,
                                                                      tmp_path: Path) -> None:
    # nvidia-smi -q -x alone does not name profiles; no release's Type can be made up from it
    bundle = tmp_path / "b"
    bundle.mkdir()
    (bundle / "nvidia-smi-q.xml").write_text((real_fixtures / "nvidia-smi-q-x" / "a100-sxm4-mig-v12.xml")
                                             .read_text())
    node = read_bundle(bundle)
    for release in RELEASES:
        with pytest.raises(CaptureError, match="profile"):
            plan_gres(node, GresOptions(mig=mig_naming(parse_slurm_version(release), "test")))


@pytest.mark.parametrize(("text", "want"), [
    ("22.05", SlurmVersion(22, 5, 0)), ("23.02.6", SlurmVersion(23, 2, 6)),
    ("24.11.5", SlurmVersion(24, 11, 5)),
    ("slurm-wlm 24.11.5", SlurmVersion(24, 11, 5)), ("slurm 22.05.8\n", SlurmVersion(22, 5, 8)),
    ("26.05.0-0rc1", SlurmVersion(26, 5, 0)),
])
def test_parse_slurm_version(text: str, want: SlurmVersion) -> None:
    assert parse_slurm_version(text) == want


@given(st.text(max_size=60))
def test_any_version_text_is_read_or_refused_in_one_line(text: str) -> None:
    try:
        version = parse_slurm_version(text)
    except InputError as exc:
        assert exc.exit_code == 2 and len(str(exc).splitlines()) == 1
        return
    assert 0 <= version.minor < 100 and version >= SlurmVersion(10, 0)


def test_later_naming_only_before_23_02_6() -> None:
    assert later_naming(mig_naming(SlurmVersion(22, 5, 8), "t")) is not None
    assert later_naming(mig_naming(SlurmVersion(23, 2, 6), "t")) is None
    assert later_naming(mig_naming(SlurmVersion(26, 5), "t")) is None


# ---- the command ------------------------------------------------------------------------------

def _gres_conf(*args: str) -> tuple[int, str]:
    """Run the command as a process, for its exit code and its one-line error."""
    proc = subprocess.run([sys.executable, "-m", "gpuslurm", "gres-conf", "--from", "a100-mig", *args],
                          capture_output=True, text=True, timeout=60)
    return proc.returncode, proc.stdout + proc.stderr


@pytest.mark.parametrize("release", RELEASES)
def test_gres_conf_writes_the_target_releases_types(release: str) -> None:
    code, out = _gres_conf("--slurm-version", release)
    assert code == 0
    assert [ln.split()[1] for ln in out.splitlines() if "MultipleFiles=" in ln] == \
        [f"Type={t}" for t in A100[release]]
    assert f"MIG Types as Slurm {parse_slurm_version(release)} (--slurm-version)" in out
    assert ("bug 17482" in out) is (release == "22.05")


def test_node_conf_names_the_same_types() -> None:
    result = CliRunner().invoke(cli, ["node-conf", "--from", "a100-mig", "--slurm-version", "24.11"])
    assert result.exit_code == 0
    assert "gpu:nvidia_a100_3g.40gb:1," in result.output


def test_check_names_types_a_later_slurm_calls_differently(tmp_path: Path) -> None:
    conf = tmp_path / "gres.conf"
    code, out = _gres_conf("--slurm-version", "22.05", "--output", str(conf))
    assert code == 0
    code, out = _gres_conf("--slurm-version", "22.05", "--check", str(conf))
    assert code == 0  # right for 22.05
    (renamed,) = [ln for ln in out.splitlines() if ": renamed: " in ln]
    assert "Type=nvidia_a100_3g.39gb: Slurm 23.02.6 and later" in renamed
    assert renamed.endswith("on GPU 0 nvidia_a100_3g.40gb; rename it here, in slurm.conf and wherever jobs "
                            "ask for it when the cluster moves to such a Slurm")
    code, out = _gres_conf("--slurm-version", "24.11", "--check", str(conf))
    assert code == 1 and "Type=nvidia_a100_3g.39gb would not match AutoDetect's nvidia_a100_3g.40gb" in out
    assert ": renamed: " not in out  # nothing later renames 24.11's types


def test_bad_slurm_version_is_bad_input() -> None:
    code, out = _gres_conf("--slurm-version", "24.x")
    assert code == 2
    assert out.strip().splitlines() == [
        "gpuslurm: not a Slurm version: '24.x' (want X.Y or X.Y.Z, e.g. 24.11)"]


def test_without_slurmd_the_file_says_whose_names_it_used(tmp_path: Path) -> None:
    naming = target_naming(None, slurmd=str(tmp_path / "no-slurmd"))
    assert naming.release is not None and naming.release.startswith("unknown: no slurmd here")
    assert naming.splits_shared  # 22.05's behaviour, note kept


@pytest.mark.slurm
def test_default_follows_the_hosts_slurmd() -> None:
    naming = target_naming(None)  # Debian 12's slurmd 22.05.8
    assert naming.release == "22.05.8 (/usr/sbin/slurmd -V)"
    assert naming.type_of("NVIDIA A100-SXM4-80GB", load_node("a100-mig").gpus[0].mig_devices[0]) \
        == "nvidia_a100_3g.39gb"
