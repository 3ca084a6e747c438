"""What an Xid says about a GPU (pure): the classes of NVIDIA's Xid catalog and the action each gets.

An Xid is the driver's error report. Some say the GPU itself is faulty (a double-bit ECC error,
the GPU falling off the bus); others are how a user's program ends badly (a bad pointer makes a
page fault) and say nothing about the board. The table below puts the codes a node sees most in
one of three kinds:

``hardware``
    the GPU (or its links or firmware) is at fault; it should not take new jobs until it has been
    reset or the node rebooted (``recovery`` says which, as NVIDIA's catalog does).
``application``
    usually caused by the program running on the GPU; the GPU recovers when that program exits.
``record``
    bookkeeping, not a fault: 63 records that a row remap (or page retirement) was logged. A
    pending remap is read from NVML on its own (``[health.row_remap]``), so 63 adds nothing.

31 (MMU fault) and 43 (GPU stopped processing) are often called critical. gpuslurm's default
ignores them, with 13 and 45: on a healthy GPU they follow an out-of-bounds access or a killed
kernel in the user's own code, the driver cleans up when the process exits, and taking a GPU out
for each would let one buggy program empty a cluster. A site that sees them repeat on one board
removes them from ``[health.xid] ignore``. An Xid not in the table is a fault unless ignored (a
new code is more likely to be a new failure than noise).

Xid 154 carries the driver's own recovery verdict ("GPU recovery action changed from 0x0 (None)
to 0x2 (Node Reboot Required)"); :func:`recovery_from_text` reads it.
"""

from __future__ import annotations

import re

from gpuslurm.tuples import NamedTuple

HARDWARE = "hardware"
APPLICATION = "application"
RECORD = "record"
UNKNOWN = "unknown"

# Recovery an Xid needs before the GPU is trusted again.
NONE = "none"
RESET = "reset"  # a GPU reset (nvidia-smi -r) or a reboot
REBOOT = "reboot"  # the node must be rebooted
DRAIN = "drain"  # finish the running work, then reset (the driver's "drain and reset")
SERVICE = "service"  # hardware service (RMA)


class XidInfo(NamedTuple):
    code: int
    kind: str  # HARDWARE, APPLICATION, RECORD or UNKNOWN
    recovery: str
    what: str  # a few words an admin recognises


_TABLE: tuple[XidInfo, ...] = (
    XidInfo(13, APPLICATION, NONE, "graphics engine exception"),
    XidInfo(31, APPLICATION, NONE, "GPU memory page fault"),
    XidInfo(43, APPLICATION, NONE, "GPU stopped processing"),
    XidInfo(45, APPLICATION, NONE, "preemptive cleanup after an earlier error"),
    XidInfo(48, HARDWARE, RESET, "double-bit ECC error"),
    XidInfo(61, HARDWARE, RESET, "internal micro-controller breakpoint"),
    XidInfo(62, HARDWARE, RESET, "internal micro-controller halt"),
    XidInfo(63, RECORD, NONE, "row remap or page retirement recorded"),
    XidInfo(64, HARDWARE, RESET, "row remap or page retirement recording failed"),
    XidInfo(74, HARDWARE, RESET, "NVLink error"),
    XidInfo(79, HARDWARE, REBOOT, "GPU has fallen off the bus"),
    XidInfo(92, HARDWARE, RESET, "high single-bit ECC error rate"),
    XidInfo(94, HARDWARE, RESET, "contained ECC error"),
    XidInfo(95, HARDWARE, RESET, "uncontained ECC error"),
    XidInfo(119, HARDWARE, RESET, "GSP RPC timeout"),
    XidInfo(120, HARDWARE, RESET, "GSP error"),
    XidInfo(121, HARDWARE, RESET, "C2C link error"),
    XidInfo(140, HARDWARE, RESET, "unrecovered ECC error"),
    XidInfo(143, HARDWARE, REBOOT, "GPU initialisation failure"),
    XidInfo(154, HARDWARE, RESET, "GPU recovery action changed"),
)
XID_TABLE: dict[int, XidInfo] = {x.code: x for x in _TABLE}

# The driver's recovery action codes in Xid 154's text (NVML's nvmlDeviceGpuRecoveryAction_t).
_RECOVERY_CODES = {0: NONE, 1: RESET, 2: REBOOT, 3: DRAIN, 4: DRAIN}
_RECOVERY = r"\bto\s+0x([0-9a-fA-F]{1,8})\b"  # compiled on first use (re's cache): hooks import this


def classify(code: int) -> XidInfo:
    """The table's entry for ``code``; an unknown code is ``UNKNOWN`` with recovery ``reset``."""
    return XID_TABLE.get(code) or XidInfo(code, UNKNOWN, RESET, "Xid not in gpuslurm's table")


def recovery_from_text(code: int, text: str) -> str:
    """The recovery an Xid's kernel-log text asks for: Xid 154's stated action, else the table's."""
    if code == 154 and (m := re.search(_RECOVERY, text)):
        return _RECOVERY_CODES.get(int(m.group(1), 16), SERVICE)
    return classify(code).recovery


def is_fault(code: int, ignore: tuple[int, ...] | frozenset[int]) -> bool:
    """Whether ``code`` counts against the GPU: not ignored, and not a mere record (63)."""
    return code not in ignore and classify(code).kind != RECORD


def describe(code: int, recovery: str | None = None) -> str:
    """``Xid 79 (GPU has fallen off the bus; needs reboot)``: for drain reasons and logs."""
    info = classify(code)
    rec = recovery or info.recovery
    need = "" if rec == NONE else f"; needs {rec}"
    return f"Xid {code} ({info.what}{need})"
