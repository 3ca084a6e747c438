"""``gpuslurm mig show|assert|apply`` on the command line (replayed bundles, no GPU)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from gpuslurm.cli.main import cli

README = Path(__file__).resolve().parents[2] / "README.md"
DOC = Path(__file__).resolve().parents[2] / "docs" / "mig.md"


def run(*args: str) -> tuple[int, str, str]:
    proc = subprocess.run([sys.executable, "-m", "gpuslurm", *args], capture_output=True, text=True,
                          timeout=60, env={"PATH": "/usr/bin:/bin"})
    return proc.returncode, proc.stdout, proc.stderr


def test_mig_subcommands_have_help_and_are_documented() -> None:
    readme = README.read_text()
    doc = DOC.read_text()
    for sub in ("show", "assert", "apply"):
        result = CliRunner().invoke(cli, ["mig", sub, "--help"])
        assert result.exit_code == 0 and "Usage: " in result.output, result.output
        assert f"gpuslurm mig {sub}" in readme and f"gpuslurm mig {sub}" in doc
    listing = CliRunner().invoke(cli, ["mig", "--help"]).output
    assert "show" in listing and "assert" in listing and "apply" in listing


def test_show_table_json_and_layout() -> None:
    table = CliRunner().invoke(cli, ["mig", "show", "--from", "a100-mig"])
    assert table.exit_code == 0
    lines = table.output.splitlines()
    assert lines[1].startswith("GPU 0  GPU-df621027")
    assert lines[1].endswith("MIG 3g.40gb+2g.20gb+1g.10gb+1g.10gb")
    assert "GI 2 CI 0  3g.40gb" in lines[2] and "MIG-a8dd8c6a-54a7-5909-ae1e-e032c249d3d7" in lines[2]
    assert lines[-1].endswith("NVIDIA A100-SXM4-80GB  MIG off")
    data = json.loads(CliRunner().invoke(cli, ["mig", "show", "--from", "a100-mig", "--json"]).output)
    gpu0, gpu1 = data["gpus"]
    assert gpu0["mig_mode"] is True and gpu0["profile_table"] == "A100 80GB"
    assert gpu0["profiles"] == ["3g.40gb", "2g.20gb", "1g.10gb", "1g.10gb"]
    assert [d["gi_id"] for d in gpu0["devices"]] == [2, 3, 9, 10]
    assert gpu0["devices"][0]["uuid"].startswith("MIG-")
    assert gpu1["mig_mode"] is False and gpu1["devices"] == []
    l40s = json.loads(CliRunner().invoke(cli, ["mig", "show", "--from", "l40s-4x", "--json"]).output)
    assert {g["mig_mode"] for g in l40s["gpus"]} == {None}
    text = CliRunner().invoke(cli, ["mig", "show", "--from", "dgx-h100", "--as-layout"]).output
    assert '[gpus."0-7"]  # NVIDIA H100 80GB HBM3\nmig = false\n' in text


def test_assert_round_trips_show_as_layout_and_reports_differences(tmp_path: Path) -> None:
    layout = tmp_path / "layout.toml"
    code, out, err = run("mig", "show", "--from", "a100-mig", "--as-layout")
    assert code == 0, err
    layout.write_text(out)
    assert run("mig", "assert", str(layout), "--from", "a100-mig") == (
        0, f"a100-mig01: matches {layout} (2 GPU(s))\n", "")
    layout.write_text('[gpus.0]\nprofiles = ["7g.80gb"]\n\n[gpus.1]\nmig = false\n')
    code, out, err = run("mig", "assert", str(layout), "--from", "a100-mig")
    assert code == 1
    assert out == ("a100-mig01: GPU 0 (GPU-df621027-dde5-5ea4-a4b4-35f538038f93): is MIG "
                   '3g.40gb+2g.20gb+1g.10gb+1g.10gb, layout [gpus."0"] wants MIG 7g.80gb\n')
    assert err == f"gpuslurm: a100-mig01: 1 GPU(s) differ from {layout}\n"


@pytest.mark.parametrize(("text", "expected"), [
    ('[gpus."0-3"]\nmig = false\n', '[gpus."0-3"]: no GPU 2-3 on a100-mig01 (it has GPUs 0-1)'),
    ('[gpus.0]\nprofiles = ["3g.40gb", "3g.40gb", "1g.10gb"]\n', "do not fit together"),
    ('[gpus.0]\nprofiles = ["3g.40gb"\n', "not valid TOML"),
])
def test_bad_layouts_exit_2_with_one_line(tmp_path: Path, text: str, expected: str) -> None:
    layout = tmp_path / "layout.toml"
    layout.write_text(text)
    for extra in (["assert"], ["apply", "--dry-run"]):
        code, out, err = run("mig", extra[0], str(layout), "--from", "a100-mig", *extra[1:])
        assert code == 2 and out == ""
        assert err.startswith(f"gpuslurm: {layout}: ") and expected in err and err.count("\n") == 1


def test_missing_layout_file_exits_2(tmp_path: Path) -> None:
    missing = tmp_path / "nope.toml"
    code, _, err = run("mig", "assert", str(missing), "--from", "a100-mig")
    assert code == 2 and err == f"gpuslurm: {missing}: cannot read: No such file or directory\n"


def test_apply_dry_run_prints_the_plan_with_the_configured_nvidia_smi(tmp_path: Path) -> None:
    layout = tmp_path / "layout.toml"
    layout.write_text('[gpus.all]\nprofiles = ["3g.40gb", "3g.40gb"]\n')
    config = tmp_path / "gpuslurm.toml"
    config.write_text('[paths]\nnvidia_smi = "/opt/nvidia/bin/nvidia-smi"\n')
    proc = subprocess.run([sys.executable, "-m", "gpuslurm", "mig", "apply", str(layout), "--from",
                           "a100-mig", "--dry-run"], capture_output=True, text=True, timeout=60,
                          env={"PATH": "/usr/bin:/bin", "GPUSLURM_CONFIG": str(config)})
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == [
        "a100-mig01: 2 GPU(s) to reconfigure",
        "  GPU 0 (GPU-df621027-dde5-5ea4-a4b4-35f538038f93): MIG 3g.40gb+2g.20gb+1g.10gb+1g.10gb -> "
        "MIG 3g.40gb+3g.40gb",
        "    /opt/nvidia/bin/nvidia-smi mig -i 0 -dci",
        "    /opt/nvidia/bin/nvidia-smi mig -i 0 -dgi",
        "    /opt/nvidia/bin/nvidia-smi mig -i 0 -cgi 3g.40gb,3g.40gb -C",
        "  GPU 1 (GPU-549c48e3-9b6d-5030-b77c-81ebdc89ebcf): MIG off -> MIG 3g.40gb+3g.40gb",
        "    /opt/nvidia/bin/nvidia-smi -i 1 -mig 1",
        "    /opt/nvidia/bin/nvidia-smi mig -i 1 -cgi 3g.40gb,3g.40gb -C",
    ]


def _real_h200_bundle(real_fixtures: Path, tmp_path: Path) -> Path:
    """The real H200 capture imported, with an lscpu.csv and the mig-minors of its GPU 0."""
    from gpuslurm.hw.replay.importer import import_multi_capture

    bundle = tmp_path / "h200"
    import_multi_capture(real_fixtures / "multi" / "h200-mig__590.48.01.txt", bundle)
    (bundle / "lscpu.csv").write_text("# CPU,Core,Socket,Node\n" + "".join(
        f"{c},{c},0,0\n" for c in range(24)))
    minors = ["config 1", "monitor 2"]
    for gi in range(15):
        minors.append(f"gpu0/gi{gi}/access {3 + gi * 9}")
        minors += [f"gpu0/gi{gi}/ci{ci}/access {4 + gi * 9 + ci}" for ci in range(8)]
    (bundle / "mig-minors").write_text("\n".join(minors) + "\n")
    return bundle


def test_real_h200_with_split_gpu_instance_matches_its_own_layout(real_fixtures: Path,
                                                                  tmp_path: Path) -> None:
    # GI 2 holds two compute instances, 1c.3g.71gb and 2c.3g.71gb: show --as-layout writes them and
    # assert accepts the file; before, assert refused it with two equal strings as the difference
    bundle = _real_h200_bundle(real_fixtures, tmp_path)
    code, layout, err = run("mig", "show", "--from", str(bundle), "--as-layout")
    assert code == 0, err
    assert 'profiles = [["1c.3g.71gb", "2c.3g.71gb"], "2g.35gb", "1g.18gb", "1g.18gb"]' in layout
    (tmp_path / "layout.toml").write_text(layout)
    code, out, err = run("mig", "assert", str(tmp_path / "layout.toml"), "--from", str(bundle))
    assert (code, err) == (0, ""), out
    code, out, err = run("mig", "show", "--from", str(bundle))
    assert "MIG 3g.71gb[1c.3g.71gb,2c.3g.71gb]+2g.35gb+1g.18gb+1g.18gb" in out.splitlines()[1]
    # a layout that gives GI 2 one full compute instance differs, and the message says how
    (tmp_path / "whole.toml").write_text(
        '[gpus.0]\nprofiles = ["3g.71gb", "2g.35gb", "1g.18gb", "1g.18gb"]\n')
    code, out, err = run("mig", "assert", str(tmp_path / "whole.toml"), "--from", str(bundle))
    assert code == 1, err
    is_part, wants_part = out.split(": is ", 1)[1].split(", layout [gpus.\"0\"] wants ")
    assert is_part != wants_part.strip()
    assert wants_part.strip() == "MIG 3g.71gb+2g.35gb+1g.18gb+1g.18gb"


def test_apply_refuses_to_create_split_gpu_instances_before_draining(real_fixtures: Path,
                                                                     tmp_path: Path) -> None:
    bundle = _real_h200_bundle(real_fixtures, tmp_path)
    (tmp_path / "l.toml").write_text('[gpus.0]\nprofiles = [["1c.3g.71gb", "2c.3g.71gb"], "3g.71gb"]\n')
    code, out, err = run("mig", "apply", str(tmp_path / "l.toml"), "--from", str(bundle), "--no-drain")
    assert code == 2 and out == "", out
    assert len(err.splitlines()) == 1 and "nvidia-smi mig -cci" in err


def test_real_a100_xml_without_profile_names_says_so(real_fixtures: Path, tmp_path: Path) -> None:
    # nvidia-smi -q -x names no MIG profiles: show printed "MIG +++" and a layout of empty names
    bundle = tmp_path / "a100"
    bundle.mkdir()
    (bundle / "nvidia-smi-q.xml").write_text((real_fixtures / "nvidia-smi-q-x" / "a100-sxm4-mig-v12.xml")
                                             .read_text())
    code, out, err = run("mig", "show", "--from", str(bundle))
    assert code == 0, err
    assert out.splitlines()[1].endswith(
        "MIG on, 4 GPU instance(s) whose profiles the capture does not name (nvidia-smi -L names them)")
    code, layout, err = run("mig", "show", "--from", str(bundle), "--as-layout")
    assert code == 0 and '""' not in layout and "profiles =" not in layout, layout
    (tmp_path / "l.toml").write_text('[gpus.0]\nprofiles = ["1g.20gb", "1g.20gb", "1g.20gb", "1g.20gb"]\n')
    code, out, err = run("mig", "assert", str(tmp_path / "l.toml"), "--from", str(bundle))
    assert code == 1 and "whose profiles the capture does not name" in out
