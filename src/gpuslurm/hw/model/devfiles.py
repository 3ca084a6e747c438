"""Device file names of GPUs and MIG devices, shared by the model and the hooks' light identities."""

from __future__ import annotations


def mig_device_files(parent_minor: int, gi_minor: int | None, ci_minor: int | None) -> tuple[str, ...]:
    """The device files a job needs for a MIG device (parent GPU, GI cap, CI cap)."""
    if gi_minor is None or ci_minor is None:
        raise ValueError("MIG capability minors are unknown")
    return (f"/dev/nvidia{parent_minor}", f"/dev/nvidia-caps/nvidia-cap{gi_minor}",
            f"/dev/nvidia-caps/nvidia-cap{ci_minor}")
