"""Slurm node features derived from the hardware, for ``gpuslurm node-conf`` (pure).

A job asks for a capability natively (``sbatch --gres=gpu:2 --constraint=gpumem_80g``) when the
node's ``Features=`` names it. A node has a feature when every GPU on it has the property (a
``--constraint`` picks the node, not the GPU: a node mixing an H100 and an L4 is neither ``h100``
nor ``l4``; typed GRES, ``--gres=gpu:nvidia_h100_80gb_hbm3:1``, picks among its GPUs). The rules
(docs/features.md):

- the model, e.g. ``h100``, ``a100``, ``l40s``, ``rtx_a5000`` (:func:`model_feature`), when all
  GPUs are the same model;
- the memory class ``gpumem_<C>g``: C the smallest of :data:`MEMORY_CLASSES_GIB` not below the
  GPU's memory in GiB (an 80 GB H100 reports 79.6 GiB: ``gpumem_80g``; an L40S 45 GiB:
  ``gpumem_48g``), the smallest GPU's class on a mixed node; and ``gpumem_ge_<X>g`` for every
  class X up to C, so "at least 40 GiB" is the one feature ``gpumem_ge_40g``;
- the compute capability ``cc_<major>.<minor>`` (NVML's where the caller has it, else the model
  table of :mod:`gpuslurm.hw.model.capability`; none when unknown or mixed);
- ``nvlink`` when some pair of GPUs is linked by NVLink, ``nvswitch`` when every pair of five or
  more GPUs is, with the same link count (a mesh that size needs a switch), from the link matrix;
- ``mig`` when every GPU has MIG mode enabled.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

from gpuslurm.hw.model.capability import model_cc
from gpuslurm.hw.model.node import LinkKind, Node

# Marketed GPU memory sizes in GB; a GPU's class is the smallest not below its GiB.
MEMORY_CLASSES_GIB = (8, 10, 12, 16, 20, 24, 32, 40, 48, 64, 80, 94, 96, 128, 141, 144, 180, 192, 256, 288)
# words of a device name that say vendor, memory size or type, form factor or edition, not model
_NOT_MODEL = re.compile(r"^(nvidia|tesla|quadro|geforce|\d+gb|hbm\d*e?|gddr\d*x?|pcie|sxm\d*|nvl|oam"
                        r"|generation|workstation|edition)$")
# A feature name gpuslurm writes: letters, digits, "_", "." and "-" (none of the blanks or of
# Slurm's constraint operators & | , * ! ( ) [ ] that would split or change a --constraint)
FEATURE_RE = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")


def model_feature(name: str) -> str | None:
    """The model word(s) of an NVML device name: "NVIDIA H100 80GB HBM3" → ``h100``.

    The name is lower-cased and split into words of letters and digits; vendor words (NVIDIA,
    Tesla, Quadro, GeForce), memory size and type (80GB, HBM3, GDDR6X), form factor (PCIe, SXM4,
    NVL, OAM) and "Generation", "Workstation", "Edition" are dropped; the rest is joined with "_":
    "NVIDIA A100-SXM4-80GB" → ``a100``, "NVIDIA RTX A5000" → ``rtx_a5000``, "NVIDIA RTX 6000 Ada
    Generation" → ``rtx_6000_ada``. None when nothing is left (or more than 64 characters are:
    a name that long is not a model).
    """
    words = [w for w in "".join(c if c.isascii() and c.isalnum() else " " for c in name.lower()).split()
             if not _NOT_MODEL.match(w)]
    model = "_".join(words)
    return model if FEATURE_RE.match(model) else None


def memory_class_gib(memory_mib: int) -> int:
    """The marketed memory class of a GPU with ``memory_mib`` (above the largest: whole GiB, up)."""
    gib = memory_mib / 1024
    for c in MEMORY_CLASSES_GIB:
        if c >= gib - 0.01:  # a GPU reporting a hair over its class keeps it
            return c
    return -(-memory_mib // 1024)


def hardware_features(node: Node, cc: Mapping[str, tuple[int, int]] | None = None) -> tuple[str, ...]:
    """The features every GPU of ``node`` has, in the order of the rules; () without GPUs.

    ``cc``: compute capability per GPU UUID from NVML, winning over the model table.
    """
    gpus = node.gpus
    if not gpus:
        return ()
    out: list[str] = []
    models = {model_feature(g.name) for g in gpus}
    if len(models) == 1 and None not in models:
        out.append(models.pop() or "")
    smallest = memory_class_gib(min(g.memory_mib for g in gpus))
    out.append(f"gpumem_{smallest}g")
    ladder = [c for c in MEMORY_CLASSES_GIB if c <= smallest]
    if smallest not in MEMORY_CLASSES_GIB:
        ladder.append(smallest)
    out += [f"gpumem_ge_{c}g" for c in ladder]
    ccs = {(cc or {}).get(g.uuid) or model_cc(g.name) for g in gpus}
    if len(ccs) == 1 and None not in ccs:
        major, minor = ccs.pop() or (0, 0)
        out.append(f"cc_{major}.{minor}")
    if node.links is not None and len(gpus) > 1:
        pairs = [node.links[i][j] for i in range(len(gpus)) for j in range(i + 1, len(gpus))]
        nv = [p for p in pairs if p.kind is LinkKind.NVLINK]
        if nv:
            out.append("nvlink")
        if len(gpus) >= 5 and len(nv) == len(pairs) and len({p.nvlinks for p in nv}) == 1:
            out.append("nvswitch")
    if all(g.mig_mode for g in gpus):
        out.append("mig")
    return tuple(out)


def merge_features(admin: Iterable[str], hardware: Iterable[str]) -> tuple[str, ...]:
    """The admin's features first, as given, then the hardware's they do not already name."""
    out: list[str] = []
    for f in (*admin, *hardware):
        if f not in out:
            out.append(f)
    return tuple(out)
