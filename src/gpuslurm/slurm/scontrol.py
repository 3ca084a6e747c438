"""``scontrol`` calls the hooks make: drain this node with a reason (and undo it).

Arguments go to scontrol as separate argv items (no shell), so a reason needs no quoting; it is
still kept to one printable line, since Slurm shows it in ``sinfo -R`` and logs.
"""

from __future__ import annotations

from gpuslurm.errors import InputError
from gpuslurm.runner import CommandResult, run_command

MAX_REASON = 1000  # Slurm keeps longer reasons, but sinfo -R is read by people


def clean_reason(reason: str) -> str:
    """``reason`` as one printable line of at most MAX_REASON characters."""
    text = " ".join("".join(c if c.isprintable() else " " for c in reason).split())
    return text if len(text) <= MAX_REASON else text[: MAX_REASON - 3] + "..."


def check_node_name(name: str) -> str:
    """``name`` if it can be a Slurm NodeName= value (no spaces, ``=``, or control characters)."""
    if not name or not all(c.isprintable() and not c.isspace() and c not in "=," for c in name):
        raise InputError(f"not a node name: {name!r}", source="SLURMD_NODENAME")
    return name


def drain_node(node: str, reason: str, *, scontrol: str, timeout: float) -> CommandResult:
    """``scontrol update NodeName=<node> State=DRAIN Reason=<reason>``; CommandError on failure."""
    return run_command([scontrol, "update", f"NodeName={check_node_name(node)}", "State=DRAIN",
                        f"Reason={clean_reason(reason)}"], timeout=timeout)


def resume_node(node: str, *, scontrol: str, timeout: float) -> CommandResult:
    """``scontrol update NodeName=<node> State=RESUME``."""
    return run_command([scontrol, "update", f"NodeName={check_node_name(node)}", "State=RESUME"],
                       timeout=timeout)
