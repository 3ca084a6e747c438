"""Which devices a job must not open: gpuslurm's own GPU device isolation, the pure part.

What is denied (:func:`denied_devices`): the node's GPUs not given to the job (character major
195, the GPU's minor) and, for MIG, the ``nvidia-caps`` capability devices of MIG instances not
given. Everything else stays allowed (``/dev/nvidiactl``, ``nvidia-uvm``, ``/dev/null``...): a
deny list, as Slurm builds for GRES devices. A job without GPUs is denied every GPU.
"""

from __future__ import annotations

from collections.abc import Sequence

from gpuslurm.tuples import TYPE_CHECKING, NamedTuple

if TYPE_CHECKING:
    from gpuslurm.hw.model.node import Node
    from gpuslurm.state.job import JobDevice

NVIDIA_MAJOR = 195


class Device(NamedTuple):
    """A character device number."""

    major: int
    minor: int

    @property
    def v1_rule(self) -> str:
        return f"c {self.major}:{self.minor} rwm"



def char_majors(proc_devices: str) -> dict[str, int]:
    """Character device majors by driver name, from the text of ``/proc/devices``."""
    majors: dict[str, int] = {}
    in_char = False
    for line in proc_devices.splitlines():
        text = line.strip()
        if text.endswith(":"):
            in_char = text == "Character devices:"
            continue
        number, _, name = text.partition(" ")
        if in_char and number.isascii() and number.isdigit() and len(number) <= 9 and name.strip():
            majors.setdefault(name.strip(), int(number))
    return majors


def denied_devices(node: Node, given: Sequence[JobDevice], caps_major: int | None) -> tuple[Device, ...]:
    """The devices a job holding ``given`` must not open on ``node``.

    ``caps_major`` is the ``nvidia-caps`` major, or None when that driver is not loaded: then no
    capability device can be opened anyway and none is listed. A MIG instance of another job on
    a GPU this job uses is reachable through the shared ``/dev/nvidia<minor>``, so its capability
    minors must be known; ValueError when they are not.
    """
    mine_gpus = {d.gpu.minor for d in given}
    allowed_caps: set[int] = set()
    for d in given:
        if d.mig is not None:
            allowed_caps.update(m for m in (d.mig.gi_minor, d.mig.ci_minor) if m is not None)
    given_migs = {(d.gpu.uuid, d.mig.gi_id, d.mig.ci_id) for d in given if d.mig is not None}
    denied = {Device(NVIDIA_MAJOR, g.minor) for g in node.gpus if g.minor not in mine_gpus}
    for gpu in node.gpus:
        for mig in gpu.mig_devices:
            if (gpu.uuid, mig.gi_id, mig.ci_id) in given_migs:
                continue
            caps = [m for m in (mig.gi_minor, mig.ci_minor) if m is not None]
            if len(caps) < 2 and gpu.minor in mine_gpus and caps_major is not None:
                raise ValueError(f"MIG device {mig.gi_id}/{mig.ci_id} of GPU {gpu.index} has no "
                                 f"capability minors (mig-minors): it cannot be denied")
            if caps_major is not None:
                denied.update(Device(caps_major, m) for m in caps if m not in allowed_caps)
    return tuple(sorted(denied))

