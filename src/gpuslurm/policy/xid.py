"""What an Xid says about a GPU (pure): the classes of NVIDIA's Xid catalog and the action each gets.

An Xid is the driver's error report. Some say the GPU itself is faulty (a double-bit ECC error,
the GPU falling off the bus); others are how a user's program ends badly (a bad pointer makes a
page fault) and say nothing about the board. The table below puts the codes a data-centre node
logs in one of three kinds, from NVIDIA's Xid catalog (docs.nvidia.com/deploy/xid-errors: the
causes it lists per Xid, and its immediate and investigatory resolution buckets):

``hardware``
    the GPU (or its links or firmware) is at fault; it should not take new jobs until it has been
    reset or the node rebooted (``recovery`` says which, as NVIDIA's catalog does).
``application``
    the catalog names the application as a cause (or sends the investigation to the application
    and CUDA, CHECK_APP/CUDA) and asks for no more than restarting it (RESTART_APP) or nothing
    (IGNORE); the GPU recovers when that program exits.
``record``
    bookkeeping, not a fault: 63 records that a row remap (or page retirement) was logged, 106
    and 107 are test messages. A pending remap is read from NVML on its own
    (``[health.row_remap]``), so 63 adds nothing.

The application kind is what ``[health.xid] ignore`` leaves out by default (config.XidCheck; a
test keeps the two equal). Any program a user runs can raise these at will (an out-of-bounds
access is 13 or 31, a killed kernel 43 and 45), so counting them would let one user empty a
cluster, one GPU per job. A site that sees one repeat on one board removes it from ``ignore``.
109 (context-switch timeout) lists the application among its causes too, but the catalog asks
for a GPU reset: it stays a fault. An Xid not in the table is a fault unless ignored (a new code
is more likely to be a new failure than noise). docs/health.md gives the decision per Xid, kept
equal to this table by a test.

Xid 154 carries the driver's own recovery verdict ("GPU recovery action changed from 0x0 (None)
to 0x2 (Node Reboot Required)"); :func:`recovery_from_text` reads it, from the start of the text
only (a process name earlier on the line is the user's).
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
    XidInfo(8, APPLICATION, NONE, "GPU stopped processing (idle timeout)"),
    XidInfo(11, APPLICATION, NONE, "invalid or corrupted push buffer stream"),
    XidInfo(13, APPLICATION, NONE, "graphics engine exception"),
    XidInfo(25, APPLICATION, NONE, "invalid or illegal push buffer stream"),
    XidInfo(31, APPLICATION, NONE, "GPU memory page fault"),
    XidInfo(32, APPLICATION, NONE, "invalid or corrupted push buffer stream (PBDMA)"),
    XidInfo(43, APPLICATION, NONE, "GPU stopped processing"),
    XidInfo(45, APPLICATION, NONE, "preemptive cleanup after an earlier error"),
    XidInfo(48, HARDWARE, RESET, "double-bit ECC error"),
    XidInfo(61, HARDWARE, RESET, "internal micro-controller breakpoint"),
    XidInfo(62, HARDWARE, RESET, "internal micro-controller halt"),
    XidInfo(63, RECORD, NONE, "row remap or page retirement recorded"),
    XidInfo(64, HARDWARE, RESET, "row remap or page retirement recording failed"),
    XidInfo(66, APPLICATION, NONE, "illegal access by driver"),
    XidInfo(67, APPLICATION, NONE, "illegal access by driver"),
    XidInfo(68, APPLICATION, NONE, "video decoder (NVDEC0) exception"),
    XidInfo(69, APPLICATION, NONE, "graphics engine class error"),
    XidInfo(74, HARDWARE, RESET, "NVLink error"),
    XidInfo(79, HARDWARE, REBOOT, "GPU has fallen off the bus"),
    XidInfo(80, APPLICATION, NONE, "corrupted data sent to GPU"),
    XidInfo(92, HARDWARE, RESET, "high single-bit ECC error rate"),
    XidInfo(94, HARDWARE, RESET, "contained ECC error"),
    XidInfo(95, HARDWARE, RESET, "uncontained ECC error"),
    XidInfo(106, RECORD, NONE, "SMBPBI test message"),
    XidInfo(107, RECORD, NONE, "SMBPBI test message (silent)"),
    XidInfo(109, HARDWARE, RESET, "context switch timeout"),
    XidInfo(119, HARDWARE, RESET, "GSP RPC timeout"),
    XidInfo(120, HARDWARE, RESET, "GSP error"),
    XidInfo(121, HARDWARE, RESET, "C2C link error"),
    XidInfo(137, APPLICATION, NONE, "NVLink privilege (FLA) error"),
    XidInfo(140, HARDWARE, RESET, "unrecovered ECC error"),
    XidInfo(143, HARDWARE, REBOOT, "GPU initialisation failure"),
    XidInfo(154, HARDWARE, RESET, "GPU recovery action changed"),
)
XID_TABLE: dict[int, XidInfo] = {x.code: x for x in _TABLE}

# The driver's recovery action codes in Xid 154's text (NVML's nvmlDeviceGpuRecoveryAction_t).
_RECOVERY_CODES = {0: NONE, 1: RESET, 2: REBOOT, 3: DRAIN, 4: DRAIN}
# the driver's own words, at the start of Xid 154's text; compiled on first use (re's cache)
_RECOVERY = r"GPU recovery action changed from 0x[0-9a-fA-F]{1,8} \([^()]{0,40}\) to 0x([0-9a-fA-F]{1,8})\b"


def classify(code: int) -> XidInfo:
    """The table's entry for ``code``; an unknown code is ``UNKNOWN`` with recovery ``reset``."""
    return XID_TABLE.get(code) or XidInfo(code, UNKNOWN, RESET, "Xid not in gpuslurm's table")


def recovery_from_text(code: int, text: str) -> str:
    """The recovery an Xid's kernel-log text asks for: Xid 154's stated action, else the table's."""
    if code == 154 and (m := re.match(_RECOVERY, text)):
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
