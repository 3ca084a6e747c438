"""The hooks' lighter node read: identities without the link matrix (links=False).

Through NVML this is tested with the real pynvml against the replay library, counting the calls
that cross into it (tests/hw/nvml/test_calls.py: a light read asks no NVLink or PCIe-ancestor query
on the DGX H100, the PCIe L40S and the MIG A100, keeps MIG minors, and ``load_node`` passes
``links=False`` through). What stays here needs no NVML at all.
"""

from __future__ import annotations

from gpuslurm.hw.source import load_node


def test_load_node_from_a_bundle_drops_links_too() -> None:
    full = load_node("dgx-h100")
    light = load_node("dgx-h100", links=False)
    assert full.links is not None
    assert light == full._replace(links=None)
