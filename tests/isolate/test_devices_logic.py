"""Which devices a job is denied, and whether gpuslurm isolates at all: pure, on real bundles."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from gpuslurm.config import CgroupConfig, Config
from gpuslurm.hw.source import load_node
from gpuslurm.isolate.cgroup_v1 import v1_job_dir
from gpuslurm.isolate.denylist import Device, char_majors, denied_devices
from gpuslurm.isolate.devices import wanted
from gpuslurm.slurm.hookenv import gres_devices

# The start of a real /proc/devices on a MIG-capable node (driver 535).
PROC_DEVICES = """Character devices:
  1 mem
  4 /dev/vc/0
195 nvidia-frontend
195 nvidia
234 nvidia-nvswitch
237 nvidia-caps
505 nvidia-uvm
510 nvidia-caps-imex-channels

Block devices:
  7 loop
237 not-a-char-device
"""


def test_char_majors_reads_only_character_devices() -> None:
    majors = char_majors(PROC_DEVICES)
    assert majors["nvidia-caps"] == 237
    assert majors["nvidia"] == 195 and majors["nvidia-uvm"] == 505
    assert majors["/dev/vc/0"] == 4
    assert "loop" not in majors and "not-a-char-device" not in majors
    assert char_majors("") == {}


def test_isolation_modes() -> None:
    """``auto`` asks the scheduler's adapter (and only then); ``always``/``never`` do not."""
    asked: list[bool] = []

    def scheduler(answer: bool) -> Callable[[], bool]:
        def constrains() -> bool:
            asked.append(answer)
            return answer
        return constrains

    def cfg(mode: str) -> Config:
        return Config(cgroup=CgroupConfig(devices=mode))

    assert wanted(cfg("auto"), scheduler(False))
    assert not wanted(cfg("auto"), scheduler(True))
    assert asked == [False, True]
    assert wanted(cfg("always"), scheduler(True))
    assert not wanted(cfg("never"), scheduler(False))
    assert asked == [False, True]
    with pytest.raises(ValueError):
        wanted(cfg("sometimes"), scheduler(False))


def test_four_of_eight_gpus_denies_the_other_four() -> None:
    node = load_node("dgx-h100")
    table = gres_devices(node)
    given = [table[i] for i in (0, 2, 5, 7)]
    assert denied_devices(node, given, caps_major=237) == tuple(
        Device(195, m) for m in (1, 3, 4, 6))


def test_a_job_without_gpus_is_denied_all_of_them() -> None:
    node = load_node("dgx-h100")
    assert denied_devices(node, (), None) == tuple(Device(195, g.minor) for g in node.gpus)


def test_minor_not_index_is_what_counts() -> None:
    node = load_node("a100-mig")  # GPU index 1 is /dev/nvidia0
    full = [d for d in gres_devices(node) if d.mig is None]
    assert [d.gpu.minor for d in full] == [0]
    denied = denied_devices(node, full, caps_major=None)
    assert denied == (Device(195, 1),)


def test_mig_denies_the_other_instances_caps_and_keeps_the_parent() -> None:
    node = load_node("a100-mig")
    migs = [d for d in gres_devices(node) if d.mig is not None]
    mine = migs[1]  # GI 3 / CI 0: caps 165, 166 on /dev/nvidia1
    denied = set(denied_devices(node, [mine], caps_major=237))
    assert Device(195, 1) not in denied  # the shared parent GPU stays open
    assert Device(195, 0) in denied  # the other, non-MIG GPU
    others = {m for d in migs if d is not mine for m in (d.mig.gi_minor, d.mig.ci_minor)}  # type: ignore[union-attr]
    assert {Device(237, m) for m in others} <= denied
    assert Device(237, 165) not in denied and Device(237, 166) not in denied
    # Without the nvidia-caps driver no capability file can be opened: only GPUs are listed.
    assert set(denied_devices(node, [mine], caps_major=None)) == {Device(195, 0)}


def test_mig_instance_without_cap_minors_on_a_shared_gpu_is_an_error() -> None:
    node = load_node("a100-mig")
    gpu = next(g for g in node.gpus if g.mig_mode)
    blind = gpu._replace(mig_devices=(
        gpu.mig_devices[0], gpu.mig_devices[1]._replace(gi_minor=None, ci_minor=None)))
    node = node._replace(gpus=tuple(blind if g is gpu else g for g in node.gpus))
    mine = next(d for d in gres_devices(node) if d.mig is not None and d.mig.gi_id == 2)
    with pytest.raises(ValueError, match="no capability minors"):
        denied_devices(node, [mine], caps_major=237)
    # On a GPU the job does not use, denying /dev/nvidiaN already blocks the instance.
    other = next(d for d in gres_devices(node) if d.mig is None)
    assert Device(195, 1) in denied_devices(node, [other], caps_major=237)


def test_cgroup_paths_take_only_job_ids() -> None:
    assert v1_job_dir("/sys/fs/cgroup", "42") == "/sys/fs/cgroup/devices/gpuslurm/job_42"
    for bad in ("../x", "", "1/2", "12 ", "٣"):
        with pytest.raises(ValueError):
            v1_job_dir("/sys/fs/cgroup", bad)
