"""cgroup v2 device limits for real: a BPF program assembled in Python, loaded and attached with
bpf(2) to a test cgroup on the host's cgroup2 mount, and processes inside it opening devices."""

from __future__ import annotations

import os
import struct
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from tests.helpers import cgroup_helpers
from tests.helpers.cgroup_helpers import PROBE, make_gpu_files, parse_probe, v2_unavailable

from gpuslurm.errors import HardwareError
from gpuslurm.isolate import bpf
from gpuslurm.isolate.cgroup_v2 import setup_v2
from gpuslurm.isolate.denylist import Device

UNIFIED = Path(cgroup_helpers.UNIFIED)


def test_program_layout() -> None:
    code = bpf.deny_program([(195, 3), (195, 1), (195, 3)])
    insns = [struct.unpack("<BBhi", code[i:i + 8]) for i in range(0, len(code), 8)]
    assert len(insns) == 5 + 4 * 2 + 2  # prologue, two distinct rules, allow-all tail
    assert insns[4] == (0x55, 2, 8, bpf.BPF_DEVCG_DEV_CHAR)  # non-char devices skip every rule
    assert [i[3] for i in insns[5:13]] == [195, 1, 0, 0, 195, 3, 0, 0]  # sorted, deduplicated
    assert insns[-2:] == [(0xB7, 0, 0, 1), (0x95, 0, 0, 0)]
    with pytest.raises(ValueError):
        bpf.deny_program([(195, -1)])


def _skip_reason() -> str | None:
    return v2_unavailable("BPF device tests")


needs_bpf = pytest.mark.skipif(_skip_reason() is not None, reason=str(_skip_reason()))


@pytest.fixture
def cgroup() -> Iterator[Path]:
    path = UNIFIED / f"gpuslurm-test-{os.getpid()}"
    path.mkdir()
    try:
        yield path
    finally:
        for pid in (path / "cgroup.procs").read_text().split():
            os.kill(int(pid), 9)
        for _ in range(100):
            try:
                path.rmdir()
                break
            except OSError:
                subprocess.run(["/bin/sleep", "0.02"], check=True)


def _probe_in(cgroup: Path, paths: list[str]) -> dict[str, str]:
    script = f'echo $$ > {cgroup}/cgroup.procs && exec {sys.executable} -c "$0" "$@"'
    out = subprocess.run(["/bin/sh", "-c", script, PROBE, *paths], capture_output=True, text=True,
                         check=True, timeout=30).stdout
    return parse_probe(out)


@needs_bpf
def test_attached_program_denies_only_its_devices(cgroup: Path) -> None:
    for gpu_dir in make_gpu_files([1, 3, 7]):
        paths = [str(gpu_dir / f"nvidia{m}") for m in (1, 3, 7)]
        bpf.deny_devices(str(cgroup), [(195, 7), (195, 1)])
        fd = os.open(cgroup, os.O_RDONLY | os.O_DIRECTORY)
        try:
            assert len(bpf.attached_program_ids(fd)) == 1
        finally:
            os.close(fd)
        assert _probe_in(cgroup, paths) == {"nvidia1": "EPERM", "nvidia3": "ENXIO", "nvidia7": "EPERM"}
        # /dev/null is no GPU: still usable inside.
        assert _probe_in(cgroup, ["/dev/null"]) == {"null": "OK"}
        # The same files outside the cgroup: every open reaches the (absent) driver.
        assert set(_probe_in(UNIFIED, paths).values()) == {"ENXIO"}


@needs_bpf
def test_programs_stack_and_cover_child_cgroups(cgroup: Path) -> None:
    for gpu_dir in make_gpu_files([0, 1, 2]):
        paths = [str(gpu_dir / f"nvidia{m}") for m in (0, 1, 2)]
        bpf.deny_devices(str(cgroup), [(195, 0)])
        bpf.deny_devices(str(cgroup), [(195, 1)])  # ALLOW_MULTI: beside the first, not instead
        child = cgroup / "step_0"
        child.mkdir()
        try:
            assert _probe_in(child, paths) == {"nvidia0": "EPERM", "nvidia1": "EPERM", "nvidia2": "ENXIO"}
        finally:
            child.rmdir()


@needs_bpf
def test_setup_v2_makes_the_job_cgroup_under_the_configured_parent(cgroup: Path) -> None:
    path = Path(setup_v2(str(cgroup / "job_77"), [Device(195, 5)]))
    try:
        assert path == cgroup / "job_77"
        for gpu_dir in make_gpu_files([4, 5]):
            assert _probe_in(path, [str(gpu_dir / "nvidia4"), str(gpu_dir / "nvidia5")]) == {
                "nvidia4": "ENXIO", "nvidia5": "EPERM"}
    finally:
        path.rmdir()
    with pytest.raises(HardwareError, match="does not exist"):
        setup_v2(str(UNIFIED / "no-such-scope" / "job_77"), [])
