"""write_capture with a stand-in pynvml and stand-in nvidia-smi / lscpu scripts.

The stand-in stays here for what only it can express: NVML failing at init or at a call, a GPU
lost at its handle, and capture run in-process. ``gpuslurm capture`` through the real pynvml
and the replay library is tested in tests/hw/nvml/test_replay_edges.py (a round trip).
"""

from __future__ import annotations

import json
import pathlib
import socket
from typing import Any

import pytest
from tests.helpers.fakes import fake_pynvml as fp

from gpuslurm.errors import CaptureError, HardwareError, InputError
from gpuslurm.hw.formats.mig_minors import mig_minors_text
from gpuslurm.hw.formats.nvml_json import load_partial, read_capabilities
from gpuslurm.hw.live.capture import write_capture
from gpuslurm.hw.live.nvml import NvmlBackend

LSCPU_OUT = "# CPU,Core,Socket,Node\n0,0,0,0\n1,1,0,0\n"




def script(path: pathlib.Path, body: str) -> str:
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(0o755)
    return str(path)


def smi_script(tmp_path: pathlib.Path, xml: pathlib.Path) -> str:
    """An nvidia-smi that only knows ``-q -x``, like a driver whose topo and -L are broken."""
    return script(tmp_path / "nvidia-smi", f"""
if [ "$*" = "-q -x" ]; then cat '{xml}'; exit 0; fi
echo "Failed to initialize NVML: Unknown Error" >&2
exit 1
""")


def lscpu_script(tmp_path: pathlib.Path) -> str:
    return script(tmp_path / "lscpu", f"""
[ "$1" = "-p=CPU,CORE,SOCKET,NODE" ] || exit 2
printf '{LSCPU_OUT}'
""")


@pytest.fixture
def proc(tmp_path: pathlib.Path) -> pathlib.Path:
    root = tmp_path / "proc"
    root.mkdir()
    (root / "meminfo").write_text("MemTotal:       16318392 kB\n")
    return root


def fake_backend(proc: pathlib.Path, gpus: list[dict[str, Any]] | None = None, **options: Any) -> NvmlBackend:
    module = fp.build(fp.pcie_pair_minor_swapped() if gpus is None else gpus, **options)
    return NvmlBackend(module, sys_root=proc.parent / "nosys", proc_root=proc)


def log_lines(out: pathlib.Path) -> list[str]:
    return (out / "capture.log").read_text().splitlines()


def test_bundle_with_standin_nvidia_smi(tmp_path: pathlib.Path, proc: pathlib.Path,
                                        real_fixtures: pathlib.Path) -> None:
    xml = real_fixtures / "nvidia-smi-q-x/dual_a5000-v13.xml"
    out = tmp_path / "bundle"
    backend = fake_backend(proc)
    written = write_capture(out, backend=backend, nvidia_smi=smi_script(tmp_path, xml),
                            lscpu=lscpu_script(tmp_path), proc_root=proc, hostname="node7")
    assert written == ["nvidia-smi-q.xml", "lscpu.csv", "meminfo", "hostname", "nvml.json"]
    assert sorted(p.name for p in out.iterdir()) == sorted([*written, "capture.log"])  # no temp files
    assert (out / "nvidia-smi-q.xml").read_bytes() == xml.read_bytes()
    assert (out / "lscpu.csv").read_text() == LSCPU_OUT
    assert (out / "meminfo").read_text() == "MemTotal:       16318392 kB\n"
    assert (out / "hostname").read_text() == "node7\n"
    dumped = load_partial(out / "nvml.json")
    assert dumped["hostname"] == "node7"
    assert [(g.index, g.minor) for g in dumped["gpus"]] == [(0, 1), (1, 0)]
    assert str(dumped["links"][0][1]) == "SYS"

    log = log_lines(out)
    assert log[0].startswith("# gpuslurm ") and "node7" in log[0]
    assert any(line.startswith("ok      nvidia-smi-q.xml: ") and "-q -x" in line for line in log)
    topo = next(line for line in log if "nvidia-smi-topo.txt" in line)
    assert topo.startswith("missing nvidia-smi-topo.txt: ") and "exited 1: Failed to initialize NVML" in topo
    assert any(line.startswith("missing nvidia-smi-L.txt: ") for line in log)
    assert any(line.startswith("missing mig-minors: ") for line in log)
    assert not any("nvidia-smi-q.txt" in line for line in log)  # only tried when the XML fails


def test_missing_nvidia_smi_is_logged_and_nvml_is_enough(tmp_path: pathlib.Path, proc: pathlib.Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUSLURM_NVIDIA_SMI", "/nonexistent/nvidia-smi")
    out = tmp_path / "bundle"
    written = write_capture(out, backend=fake_backend(proc), lscpu=lscpu_script(tmp_path),
                            proc_root=proc)
    assert "nvml.json" in written and not any(n.startswith("nvidia-smi") for n in written)
    log = log_lines(out)
    for name in ("nvidia-smi-q.xml", "nvidia-smi-q.txt", "nvidia-smi-topo.txt", "nvidia-smi-L.txt"):
        line = next(x for x in log if f" {name}: " in x)
        assert line.startswith("missing ") and "/nonexistent/nvidia-smi: not found" in line
    assert (out / "hostname").read_text() == socket.gethostname().split(".")[0] + "\n"


def test_env_overrides_are_used(tmp_path: pathlib.Path, proc: pathlib.Path,
                                monkeypatch: pytest.MonkeyPatch) -> None:
    xml = tmp_path / "q.xml"
    xml.write_text("<nvidia_smi_log></nvidia_smi_log>\n")
    monkeypatch.setenv("GPUSLURM_NVIDIA_SMI", smi_script(tmp_path, xml))
    monkeypatch.setenv("GPUSLURM_LSCPU", lscpu_script(tmp_path))
    written = write_capture(tmp_path / "b", backend=fake_backend(proc), proc_root=proc)
    assert {"nvidia-smi-q.xml", "lscpu.csv"} <= set(written)


def test_relative_override_is_refused_before_anything_is_written(
        tmp_path: pathlib.Path, proc: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUSLURM_NVIDIA_SMI", "nvidia-smi")
    with pytest.raises(InputError) as info:
        write_capture(tmp_path / "b", backend=fake_backend(proc), proc_root=proc)
    assert str(info.value) == "GPUSLURM_NVIDIA_SMI: the nvidia-smi path must be absolute, not 'nvidia-smi'"
    assert not (tmp_path / "b").exists()


def test_no_gpu_facts_at_all_is_an_error_with_a_log(tmp_path: pathlib.Path, proc: pathlib.Path) -> None:
    out = tmp_path / "b"
    backend = fake_backend(proc, init_error=fp.NVML_ERROR_LIBRARY_NOT_FOUND)
    with pytest.raises(HardwareError, match="no GPU facts could be captured"):
        write_capture(out, backend=backend, nvidia_smi="/nonexistent/nvidia-smi",
                      lscpu=lscpu_script(tmp_path), proc_root=proc)
    log = log_lines(out)
    assert "missing nvml.json: NVML: NVML is not available: NVML Shared Library Not Found" in log
    assert (out / "lscpu.csv").exists()  # what could be captured is kept for the post-mortem


def test_nvml_without_gpus_is_not_gpu_facts(tmp_path: pathlib.Path, proc: pathlib.Path) -> None:
    with pytest.raises(HardwareError):
        write_capture(tmp_path / "b", backend=fake_backend(proc, gpus=[]),
                      nvidia_smi="/nonexistent/nvidia-smi", lscpu="/nonexistent/lscpu", proc_root=proc)
    assert "warning nvml.json: NVML sees no GPUs" in log_lines(tmp_path / "b")


def test_nvml_failure_is_logged_when_nvidia_smi_answers(tmp_path: pathlib.Path, proc: pathlib.Path) -> None:
    xml = tmp_path / "q.xml"
    xml.write_text("<nvidia_smi_log></nvidia_smi_log>\n")
    backend = fake_backend(proc, errors={"nvmlDeviceGetCount": fp.NVML_ERROR_UNKNOWN})
    written = write_capture(tmp_path / "b", backend=backend, nvidia_smi=smi_script(tmp_path, xml),
                            lscpu="/nonexistent/lscpu", proc_root=proc)
    assert "nvml.json" not in written
    assert "missing nvml.json: NVML: NVML nvmlDeviceGetCount failed: Unknown Error" in log_lines(
        tmp_path / "b")


def test_lost_gpu_and_mig_minors_go_into_the_bundle(tmp_path: pathlib.Path, proc: pathlib.Path) -> None:
    (proc / "driver/nvidia-caps").mkdir(parents=True)
    (proc / "driver/nvidia-caps/mig-minors").write_text(mig_minors_text(2))
    gpus = fp.dgx_h100()[:2] + fp.h200_mig()
    gpus[0]["lost"] = True
    out = tmp_path / "b"
    written = write_capture(out, backend=fake_backend(proc, gpus=gpus), nvidia_smi="/nonexistent/x",
                            lscpu="/nonexistent/lscpu", proc_root=proc)
    assert "mig-minors" in written
    assert (out / "mig-minors").read_text() == mig_minors_text(2)
    assert any(line.startswith("warning nvml.json: GPU 0: ") and "lost" in line for line in log_lines(out))
    dumped = load_partial(out / "nvml.json")
    assert [g.index for g in dumped["gpus"]] == [1, 2]
    assert dumped["gpus"][1].mig_devices[0].gi_minor == 21


def test_existing_bundle_needs_force(tmp_path: pathlib.Path, proc: pathlib.Path) -> None:
    out = tmp_path / "b"
    out.mkdir()
    (out / "nvml.json").write_text("stale")
    (out / "notes.txt").write_text("mine")
    with pytest.raises(InputError, match="exists and is not empty"):
        write_capture(out, backend=fake_backend(proc), proc_root=proc)
    assert (out / "nvml.json").read_text() == "stale"

    xml = tmp_path / "q.xml"
    xml.write_text("<nvidia_smi_log></nvidia_smi_log>\n")
    failing = fake_backend(proc, init_error=fp.NVML_ERROR_DRIVER_NOT_LOADED)
    written = write_capture(out, backend=failing, nvidia_smi=smi_script(tmp_path, xml),
                            lscpu="/nonexistent/lscpu", proc_root=proc, force=True)
    assert "nvml.json" not in written
    assert not (out / "nvml.json").exists()  # a stale dump must not pass for this capture
    assert (out / "notes.txt").read_text() == "mine"


def test_out_dir_that_is_a_file(tmp_path: pathlib.Path, proc: pathlib.Path) -> None:
    (tmp_path / "f").write_text("x")
    with pytest.raises(InputError, match="not a directory"):
        write_capture(tmp_path / "f", backend=fake_backend(proc), proc_root=proc)


def test_compute_capability_goes_into_nvml_json(tmp_path: pathlib.Path, proc: pathlib.Path) -> None:
    """NVML's compute capability per GPU (nvidia-smi -q -x has none); a GPU whose driver does not
    answer has no entry, and pick and node-conf fall back to the model table for it."""
    gpus = fp.pcie_pair_minor_swapped()
    gpus[0]["cc"] = (8, 6)
    out = tmp_path / "b"
    write_capture(out, backend=fake_backend(proc, gpus=gpus), nvidia_smi="/nonexistent/x",
                  lscpu="/nonexistent/lscpu", proc_root=proc)
    assert read_capabilities(out / "nvml.json") == {gpus[0]["uuid"]: (8, 6)}
    doc = json.loads((out / "nvml.json").read_text())
    assert doc["gpus"][0]["compute_capability"] == "8.6" and "compute_capability" not in doc["gpus"][1]
    assert load_partial(out / "nvml.json")["gpus"][0].uuid == gpus[0]["uuid"]  # the reader takes it


@pytest.mark.parametrize("value", ["nine", "9", "9.0.1", "x.0", "123.0", 9.0, ["9", "0"], "٩.٠"])
def test_a_malformed_compute_capability_is_one_capture_error(tmp_path: pathlib.Path, proc: pathlib.Path,
                                                             value: object) -> None:
    out = tmp_path / "b"
    write_capture(out, backend=fake_backend(proc), nvidia_smi="/nonexistent/x", lscpu="/nonexistent/lscpu",
                  proc_root=proc)
    doc = json.loads((out / "nvml.json").read_text())
    doc["gpus"][1]["compute_capability"] = value
    (out / "nvml.json").write_text(json.dumps(doc))
    with pytest.raises(CaptureError, match=r"gpus\[1\]\.compute_capability: must be"):
        read_capabilities(out / "nvml.json")
