"""``mig apply`` against the nvidia-smi stand-in, without Slurm (``--no-drain``), and the pure
helpers of the apply sequence. Draining, waiting and resuming run in the real test cluster:
see test_mig_slurm.py."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from tests.helpers.mig_helpers import make_bundle, smi_calls, smi_env, write_config

from gpuslurm.cli.main import main
from gpuslurm.errors import InputError
from gpuslurm.gres.conf_parse import parse_gres_conf
from gpuslurm.hw.source import load_node
from gpuslurm.isolate.mig import diff_lines, load_layout, resolve_layout
from gpuslurm.slurm.mig_apply import busy_jobs, is_drained, mode_query, node_field, write_atomic

# `scontrol -o show node` of the test cluster's node while `mig apply` held it (Slurm 22.05.8).
SHOW_NODE = (
    "NodeName=runner Arch=x86_64 CoresPerSocket=56 CPUAlloc=0 CPUEfctv=224 CPUTot=224 CPULoad=0.41 "
    "AvailableFeatures=(null) ActiveFeatures=(null) Gres=gpu:nvidia_h100_80gb_hbm3:8(S:0-1) "
    "NodeAddr=127.0.0.1 NodeHostName=runner Version=22.05.8 OS=Linux 6.1.0 RealMemory=2064384 "
    "AllocMem=0 FreeMem=1000 Sockets=2 Boards=1 State=IDLE+DRAIN ThreadsPerCore=2 TmpDisk=0 "
    "Weight=1 Owner=N/A MCS_label=N/A Partitions=gpu BootTime=2024-05-01T10:00:00 "
    "SlurmdStartTime=2024-05-01T10:00:01 LastBusyTime=2024-05-01T10:01:00 CfgTRES=cpu=224 "
    "AllocTRES= CapWatts=n/a CurrentWatts=0 AveWatts=0 ExtSensorsJoules=n/s ExtSensorsWatts=0 "
    "ExtSensorsTemp=n/s Reason=gpuslurm: MIG reconfiguration [root@2024-05-01T10:02:00]\n"
)

LAYOUT_7G = '[gpus."0-1"]\nprofiles = ["7g.80gb"]\n'


@pytest.fixture
def stand_in(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A writable a100-mig bundle driven by the nvidia-smi stand-in; returns the bundle."""
    bundle = make_bundle(tmp_path)
    for key, value in smi_env(bundle, tmp_path / "smi.log").items():
        monkeypatch.setenv(key, value)
    # No Slurm here: `scontrol reconfigure` after writing gres.conf is a no-op program.
    monkeypatch.setenv("GPUSLURM_CONFIG", str(write_config(tmp_path / "gpuslurm.toml", scontrol="/bin/true")))
    monkeypatch.delenv("GPUSLURM_CAPTURE", raising=False)
    return bundle


def layout(tmp_path: Path, text: str) -> str:
    path = tmp_path / "layout.toml"
    path.write_text(text)
    return str(path)


def test_apply_reconfigures_only_what_differs_and_regenerates_gres_conf(
        stand_in: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    gres = tmp_path / "gres.conf"
    gres.write_text("# the old one\n")
    path = layout(tmp_path, '[gpus.1]\nprofiles = ["4g.40gb", "1g.10gb", "2g.20gb"]\n')
    code = main(["mig", "apply", path, "--from", str(stand_in), "--no-drain", "--gres-conf", str(gres)])
    out = capsys.readouterr().out
    assert code == 0, out
    calls = smi_calls(tmp_path / "smi.log")
    assert calls == [  # GPU 0 already matches (unselected anyway); GPU 1: mode, check, create big first
        ["-i", "1", "-mig", "1"],
        ["-i", "1", "--query-gpu=mig.mode.current,mig.mode.pending", "--format=csv,noheader"],
        ["mig", "-i", "1", "-cgi", "4g.40gb,2g.20gb,1g.10gb", "-C"],
    ]
    node = load_node(str(stand_in))
    assert diff_lines(node, resolve_layout(load_layout(Path(path)), node)) == []
    new = node.gpus[1].mig_devices
    assert [m.profile for m in new] == ["4g.40gb", "2g.20gb", "1g.10gb"]
    entries = parse_gres_conf(gres.read_text(), str(gres), None)
    mig_entries = [e for e in entries if len(e.files) == 3]  # parent GPU, GI cap, CI cap
    assert len(mig_entries) == 4 + 3  # GPU 0's four MIG devices and GPU 1's three new ones
    text = gres.read_text()
    for m in new:
        assert f"/dev/nvidia-caps/nvidia-cap{m.gi_minor}" in text and m.uuid and m.uuid in text
    assert "nvidia_a100_4g.39gb" in text and "# the old one" not in text
    assert "slurm.conf: set Gres=" in out and "now matches" in out

    # A second run finds nothing to do and calls nvidia-smi no more.
    assert main(["mig", "apply", path, "--from", str(stand_in), "--no-drain"]) == 0
    assert "nothing to do" in capsys.readouterr().out
    assert len(smi_calls(tmp_path / "smi.log")) == 3


def test_apply_rebuilds_a_mig_gpu_destroying_before_creating(
        stand_in: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["mig", "apply", layout(tmp_path, LAYOUT_7G), "--from", str(stand_in), "--no-drain"]) == 0
    assert smi_calls(tmp_path / "smi.log") == [
        ["mig", "-i", "0", "-dci"], ["mig", "-i", "0", "-dgi"], ["mig", "-i", "0", "-cgi", "7g.80gb", "-C"],
        ["-i", "1", "-mig", "1"],
        ["-i", "1", "--query-gpu=mig.mode.current,mig.mode.pending", "--format=csv,noheader"],
        ["mig", "-i", "1", "-cgi", "7g.80gb", "-C"],
    ]
    node = load_node(str(stand_in))
    assert [[m.profile for m in g.mig_devices] for g in node.gpus] == [["7g.80gb"], ["7g.80gb"]]
    off = layout(tmp_path, '[gpus.all]\nmig = false\n')
    assert main(["mig", "apply", off, "--from", str(stand_in), "--no-drain"]) == 0
    node = load_node(str(stand_in))
    assert [(g.mig_mode, g.mig_devices) for g in node.gpus] == [(False, ()), (False, ())]


def test_dry_run_changes_nothing(stand_in: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    before = (stand_in / "nvml.json").read_text()
    assert main(["mig", "apply", layout(tmp_path, LAYOUT_7G), "--from", str(stand_in), "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "2 GPU(s) to reconfigure" in out and "-cgi 7g.80gb -C" in out
    assert smi_calls(tmp_path / "smi.log") == [] and (stand_in / "nvml.json").read_text() == before


def test_a_mode_change_pending_a_reset_stops_before_creating(
        stand_in: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("FAKE_NVIDIA_SMI_RESET_PENDING", "1")
    code = main(["mig", "apply", layout(tmp_path, '[gpus.1]\nprofiles = ["7g.80gb"]\n'), "--from",
                 str(stand_in), "--no-drain"])
    err = capsys.readouterr().err
    assert code == 3
    assert "GPU 1: MIG mode enabled is pending a GPU reset (current disabled, pending enabled)" in err
    assert [c for c in smi_calls(tmp_path / "smi.log") if "-cgi" in c] == []


def test_a_failed_create_is_an_error_naming_the_gpu_and_gres_conf_is_left_alone(
        stand_in: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("FAKE_NVIDIA_SMI_FAIL", "cgi")
    gres = tmp_path / "gres.conf"
    gres.write_text("# the old one\n")
    code = main(["mig", "apply", layout(tmp_path, '[gpus.1]\nprofiles = ["3g.40gb", "3g.40gb"]\n'),
                 "--from", str(stand_in), "--no-drain", "--gres-conf", str(gres)])
    err = capsys.readouterr().err
    assert code == 4
    assert err.startswith("gpuslurm: GPU 1: create failed: nvidia-smi exited 3: Unable to create a GPU "
                          "instance on GPU 1 using profile 3g.40gb: Insufficient Resources")
    assert gres.read_text() == "# the old one\n"


def test_a_layout_that_does_not_fit_fails_before_any_command(
        stand_in: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["mig", "apply", layout(tmp_path, '[gpus.0]\nprofiles = ["3g.20gb"]\n'), "--from",
                 str(stand_in), "--no-drain"])
    err = capsys.readouterr().err
    assert code == 2 and "unknown profile '3g.20gb'" in err and err.count("\n") == 1
    assert smi_calls(tmp_path / "smi.log") == []


def test_a_broken_gres_template_fails_before_any_command(
        stand_in: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    template = tmp_path / "bad.j2"
    template.write_text("{% for r in records %}\n")
    code = main(["mig", "apply", layout(tmp_path, LAYOUT_7G), "--from", str(stand_in), "--no-drain",
                 "--gres-conf", str(tmp_path / "gres.conf"), "--gres-template", str(template)])
    assert code == 2 and "template syntax error" in capsys.readouterr().err
    assert smi_calls(tmp_path / "smi.log") == []


# --- pure helpers -----------------------------------------------------------------------------

def test_scontrol_show_node_fields() -> None:
    assert node_field(SHOW_NODE, "State") == "IDLE+DRAIN"
    assert node_field(SHOW_NODE, "Reason") == "gpuslurm: MIG reconfiguration [root@2024-05-01T10:02:00]"
    assert node_field(SHOW_NODE, "Comment") == ""
    assert is_drained("IDLE+DRAIN") and is_drained("MIXED+DRAIN") and is_drained("DOWN+DRAIN+NOT_RESPONDING")
    assert not is_drained("IDLE") and not is_drained("ALLOCATED")


def test_busy_jobs_ignores_pending_ones() -> None:
    assert busy_jobs("12 RUNNING\n13 COMPLETING\n14 PENDING\n15 SUSPENDED\n") == ["12", "13", "15"]
    assert busy_jobs("") == []


def test_mode_query() -> None:
    assert mode_query("Enabled, Enabled\n") == (True, True)
    assert mode_query("Disabled, Enabled\n") == (False, True)
    assert mode_query("[N/A], [N/A]\n") == (None, None)
    assert mode_query("") == (None, None)


def test_write_atomic_replaces_the_file_and_never_follows_a_planted_link(tmp_path: Path) -> None:
    target = tmp_path / "gres.conf"
    target.write_text("old\n")
    write_atomic(target, "new\n")
    assert target.read_text() == "new\n" and (target.stat().st_mode & 0o777) == 0o644
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    (tmp_path / f".gres.conf.{os.getpid()}.tmp").symlink_to(victim)  # safedir.replace_at's name
    with pytest.raises(InputError, match=r"gres\.conf: refusing to write: a symlink is already at"):
        write_atomic(target, "evil\n")
    assert victim.read_text() == "precious\n" and target.read_text() == "new\n"
