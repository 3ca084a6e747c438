"""The hooks' lighter node read: identities without the link matrix (links=False)."""

from __future__ import annotations

import pathlib
from typing import Any

import pytest
from test_nvml import backend, dgx_sys  # tests/hw is on sys.path, as for hook_helpers

from fakes import fake_pynvml as fp
from gpuslurm.hw import nvml as nvml_module
from gpuslurm.hw.mig_minors import mig_minors_text
from gpuslurm.hw.source import load_node

# Every NVML call that only serves the link matrix.
LINK_CALLS = ("nvmlDeviceGetNvLink", "nvmlDeviceGetTopologyCommonAncestor")


def link_calls(fake: Any) -> list[str]:
    return [c for c in fake.calls if c.startswith(LINK_CALLS)]


def full_and_light(gpus: list[dict[str, Any]], tmp_path: pathlib.Path,
                   sys_root: pathlib.Path | None = None) -> tuple[Any, Any, Any, Any]:
    full_fake, full = backend(gpus, tmp_path, sys_root)
    light_fake, light = backend(gpus, tmp_path, sys_root)
    try:
        return full_fake, full.read_node("n1"), light_fake, light.read_node("n1", links=False)
    finally:
        full.close()
        light.close()


def test_dgx_h100_light_read_skips_every_link_query(tmp_path: pathlib.Path) -> None:
    full_fake, full, light_fake, light = full_and_light(fp.dgx_h100(), tmp_path, dgx_sys(tmp_path / "sys"))
    assert len(link_calls(full_fake)) > 8 * 18  # the full read does ask (NVLink state per link)
    assert link_calls(light_fake) == []
    assert light.links is None and full.links is not None
    assert light == full._replace(links=None)
    assert [g.numa_node for g in light.gpus] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert len(light_fake.calls) * 4 < len(full_fake.calls)


def test_pcie_pair_light_read_skips_common_ancestor(tmp_path: pathlib.Path) -> None:
    full_fake, full, light_fake, light = full_and_light(fp.pcie_pair_minor_swapped(), tmp_path)
    assert "nvmlDeviceGetTopologyCommonAncestor" in full_fake.calls
    assert link_calls(light_fake) == []
    assert light == full._replace(links=None)
    assert [(g.index, g.minor) for g in light.gpus] == [(0, 1), (1, 0)]  # minor is not the index


def test_mig_devices_and_their_minors_are_kept(tmp_path: pathlib.Path) -> None:
    caps = tmp_path / "proc/driver/nvidia-caps"
    caps.mkdir(parents=True)
    (caps / "mig-minors").write_text(mig_minors_text(1))
    _, full, light_fake, light = full_and_light(fp.h200_mig(), tmp_path)
    assert link_calls(light_fake) == []
    assert light == full._replace(links=None)
    migs = light.gpus[0].mig_devices
    assert [m.uuid for m in migs] == [fp.uuid(i, "MIG") for i in (0, 1, 3, 4)]
    assert all(m.gi_minor is not None and m.ci_minor is not None for m in migs)


def test_load_node_passes_links_false_to_nvml(tmp_path: pathlib.Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    fake, nvml = backend(fp.dgx_h100(), tmp_path, dgx_sys(tmp_path / "sys"))
    monkeypatch.setattr(nvml_module, "_default", nvml)
    monkeypatch.delenv("GPUSLURM_CAPTURE", raising=False)
    try:
        node = load_node(None, links=False)
        assert link_calls(fake) == [] and fake.calls
        assert node.links is None and len(node.gpus) == 8
        assert load_node(None).links is not None  # the default is still the full read
        assert link_calls(fake)
    finally:
        nvml.close()


def test_load_node_from_a_bundle_drops_links_too() -> None:
    full = load_node("dgx-h100")
    light = load_node("dgx-h100", links=False)
    assert full.links is not None
    assert light == full._replace(links=None)
