"""Compute capability of a GPU model, for ``--min-cc`` (pure).

``nvidia-smi -q -x`` does not carry the compute capability. NVML does
(``nvmlDeviceGetCudaComputeCapability``); where a source gives it, the caller passes it in and it
wins. Otherwise this table, matched on words of the NVML device name, first match wins (so
"A100" is tried before "A10", "L40S" before "L40" before "L4"). A model the table does not know
has no capability: a request with ``--min-cc`` then excludes it and says so ("compute capability
unknown"), rather than guessing.
"""

from __future__ import annotations

# (word in the NVML name, capability). Order matters: longer names first.
MODEL_CC: tuple[tuple[str, tuple[int, int]], ...] = (
    ("GB200", (10, 0)), ("B200", (10, 0)), ("B100", (10, 0)),
    ("GH200", (9, 0)), ("H200", (9, 0)), ("H100", (9, 0)), ("H800", (9, 0)),
    ("L40S", (8, 9)), ("L40", (8, 9)), ("L4", (8, 9)), ("RTX 6000 Ada", (8, 9)),
    ("RTX 4090", (8, 9)), ("RTX 4080", (8, 9)),
    ("A100", (8, 0)), ("A800", (8, 0)), ("A30", (8, 0)),
    ("A40", (8, 6)), ("A16", (8, 6)), ("A10G", (8, 6)), ("A10", (8, 6)), ("A2", (8, 6)),
    ("RTX A6000", (8, 6)), ("RTX A5000", (8, 6)), ("RTX A4500", (8, 6)), ("RTX A4000", (8, 6)),
    ("RTX 3090", (8, 6)), ("RTX 3080", (8, 6)),
    ("T4", (7, 5)), ("Quadro RTX 8000", (7, 5)), ("Quadro RTX 6000", (7, 5)),
    ("V100", (7, 0)), ("P100", (6, 0)), ("P40", (6, 1)), ("P4", (6, 1)),
)
_TABLE = tuple((tuple(word.upper().split()), cc) for word, cc in MODEL_CC)


def _words(name: str) -> list[str]:
    # words of the name: letters and digits, everything else separates ("A100-SXM4-80GB")
    return "".join(c if c.isalnum() else " " for c in name.upper()).split()


def model_cc(name: str) -> tuple[int, int] | None:
    """The compute capability of the GPU model ``name`` from the table, or None when unknown."""
    words = _words(name)
    for seq, cc in _TABLE:
        n = len(seq)
        if any(tuple(words[i:i + n]) == seq for i in range(len(words) - n + 1)):
            return cc
    return None
