"""``capture import``: multi-command captures become bundles that read_bundle accepts."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuslurm.errors import CaptureError
from gpuslurm.hw.model.node import Link, LinkKind
from gpuslurm.hw.replay.bundle import read_bundle
from gpuslurm.hw.replay.importer import import_multi_capture, split_sections

BUNDLE_FILES = ["nvidia-smi-L.txt", "nvidia-smi-topo.txt", "nvidia-smi-q.txt"]


@pytest.fixture
def multi(real_fixtures: Path) -> Path:
    return real_fixtures / "multi"


@pytest.mark.parametrize(("capture", "name", "cpus", "migs"), [
    ("h100-80gb-hbm3__590.48.01.txt", "NVIDIA H100 80GB HBM3", 20, 0),
    ("h100-mig__590.48.01.txt", "NVIDIA H100 80GB HBM3", 20, 4),
    ("h200-mig__590.48.01.txt", "NVIDIA H200", 24, 5),
    ("l40s__595.80.txt", "NVIDIA L40S", 8, 0),
])
def test_import_then_read(multi: Path, tmp_path: Path, capture: str, name: str, cpus: int,
                          migs: int) -> None:
    out = tmp_path / "bundle"
    assert import_multi_capture(multi / capture, out) == BUNDLE_FILES
    assert sorted(p.name for p in out.iterdir()) == sorted(BUNDLE_FILES)
    node = read_bundle(out)
    assert node.hostname == "bundle" and node.cpus == ()
    (gpu,) = node.gpus
    assert gpu.name == name and gpu.minor == 0 and gpu.numa_node == 0
    assert gpu.cpu_affinity == tuple(range(cpus))
    assert node.links == ((Link(LinkKind.SELF),),)
    assert len(gpu.mig_devices) == migs
    assert all(m.profile and m.uuid for m in gpu.mig_devices)


def test_h200_two_compute_instances_in_one_gi(multi: Path, tmp_path: Path) -> None:
    import_multi_capture(multi / "h200-mig__590.48.01.txt", tmp_path / "b")
    migs = read_bundle(tmp_path / "b").gpus[0].mig_devices
    assert [(m.gi_id, m.ci_id, m.profile) for m in migs] == [
        (2, 0, "1c.3g.71gb"), (2, 1, "2c.3g.71gb"), (3, 0, "2g.35gb"), (9, 0, "1g.18gb"), (10, 0, "1g.18gb")]
    assert migs[1].uuid == "MIG-00000001-0000-0000-0000-000000000001"


def test_idle_query_is_preferred_over_load(multi: Path, tmp_path: Path) -> None:
    capture = multi / "h100-mig__590.48.01.txt"
    assert "./gpu_burn" in capture.read_text()  # the load -q section lists it
    import_multi_capture(capture, tmp_path / "b")
    q = (tmp_path / "b" / "nvidia-smi-q.txt").read_text()
    assert q.lstrip().startswith("==============NVSMI LOG==============")
    assert "gpu_burn" not in q and "#####" not in q
    assert (tmp_path / "b" / "nvidia-smi-L.txt").read_text().splitlines()[0].startswith("GPU 0: NVIDIA H100")


def test_split_sections_shape(multi: Path) -> None:
    sections = split_sections((multi / "l40s__595.80.txt").read_text())
    first = sections[0]
    assert (first.state, first.name, first.command) == ("capabilities", "version", "nvidia-smi --version")
    assert first.body.startswith("NVIDIA-SMI version  : 595.80\n") and first.body.endswith("13.2\n")
    states = {s.state for s in sections}
    assert states == {"capabilities", "idle", "load"}


def test_refuses_non_empty_out_dir(multi: Path, tmp_path: Path) -> None:
    out = tmp_path / "b"
    out.mkdir()
    (out / "nvml.json").write_text("{}")
    with pytest.raises(CaptureError) as info:
        import_multi_capture(multi / "l40s__595.80.txt", out)
    assert str(info.value) == f"{out}: exists and is not an empty directory; import into a new one"
    assert sorted(p.name for p in out.iterdir()) == ["nvml.json"]


def test_empty_existing_dir_is_fine(multi: Path, tmp_path: Path) -> None:
    (tmp_path / "b").mkdir()
    assert import_multi_capture(multi / "l40s__595.80.txt", tmp_path / "b") == BUNDLE_FILES


def test_no_sections(tmp_path: Path) -> None:
    src = tmp_path / "notes.txt"
    src.write_text("################\n# just a comment\n################\nhello\n")
    with pytest.raises(CaptureError) as info:
        import_multi_capture(src, tmp_path / "out")
    msg = str(info.value)
    assert msg.startswith(f"{src}: no nvidia-smi -L, topo -m or -q sections") and "\n" not in msg
    assert not (tmp_path / "out").exists()


def test_bad_section_fails_before_writing(tmp_path: Path) -> None:
    rule = "#" * 80
    src = tmp_path / "cap.txt"
    src.write_text(f"{rule}\n# capabilities :: topo -m\n# $ nvidia-smi topo -m\n{rule}\n"
                   "\tGPU0\tCPU Affinity\nGPU0\tNV9\t0-3\n\n\n"
                   f"{rule}\n# capabilities :: list (-L)\n# $ nvidia-smi -L\n{rule}\n"
                   "GPU 0: NVIDIA L4 (UUID: GPU-00000000-0000-0000-0000-000000000000)\n")
    with pytest.raises(CaptureError) as info:
        import_multi_capture(src, tmp_path / "out")
    msg = str(info.value)
    assert msg.startswith(f"{src} (line 2, capabilities :: topo -m): GPU0 is not X on the diagonal")
    assert not (tmp_path / "out").exists()


def test_sections_without_command_lines_match_by_name(tmp_path: Path) -> None:
    rule = "#" * 40
    src = tmp_path / "cap.txt"
    src.write_text(f"{rule}\n# capabilities :: list (-L)\n{rule}\n"
                   "GPU 0: NVIDIA L4 (UUID: GPU-00000000-0000-0000-0000-000000000000)\n")
    assert import_multi_capture(src, tmp_path / "out") == ["nvidia-smi-L.txt"]
    assert (tmp_path / "out" / "nvidia-smi-L.txt").read_text() == (
        "GPU 0: NVIDIA L4 (UUID: GPU-00000000-0000-0000-0000-000000000000)\n")
