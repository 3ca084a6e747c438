"""``scontrol`` calls the hooks make: drain this node with a reason (and undo it).

Arguments go to scontrol as separate argv items (no shell), so a reason needs no quoting; it is
still kept to one printable line, since Slurm shows it in ``sinfo -R`` and logs.
"""

from __future__ import annotations

from gpuslurm.errors import CommandError, InputError
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


MAX_ADMIN_COMMENT = 1000  # a short line for people; sacct and scontrol show it whole


def check_job_id(job_id: str) -> str:
    """``job_id`` if it is ``<digits>`` or ``<digits>_<digits>`` (an array task)."""
    main, sep, task = job_id.partition("_")
    if not all(p.isascii() and p.isdigit() and len(p) <= 10 for p in ([main, task] if sep else [main])):
        raise InputError(f"not a Slurm job id: {job_id!r}", source="SLURM_JOB_ID")
    return job_id


def set_admin_comment(job_id: str, text: str, *, scontrol: str, timeout: float) -> CommandResult:
    """``scontrol update JobId=<id> AdminComment=<text>`` (replaces any earlier AdminComment).

    One argv item, so spaces, ``%`` and quotes pass as they are; the text is kept to one printable
    line of at most MAX_ADMIN_COMMENT characters (Slurm 22.05, tested: quotes, ``%``, ``=`` and
    1000 characters pass as they are). slurmctld takes it from root or an operator while the job
    lives; once the job finished (when the epilog runs) 22.05 answers "Job has already finished".
    """
    line = " ".join("".join(c if c.isprintable() else " " for c in text).split())
    if len(line) > MAX_ADMIN_COMMENT:
        line = line[: MAX_ADMIN_COMMENT - 3] + "..."
    return run_command([scontrol, "update", f"JobId={check_job_id(job_id)}", f"AdminComment={line}"],
                       timeout=timeout)


# What slurmctld answers to an update of a job that has ended (22.05: ESLURM_JOB_FINISHED; a job
# still completing: ESLURM_ALREADY_DONE)
FINISHED_REFUSALS = ("Job has already finished", "already completing or completed")


def refused_as_finished(exc: Exception) -> bool:
    """Whether ``exc`` is scontrol refusing a job update because the job has ended."""
    if not isinstance(exc, CommandError) or exc.returncode is None:
        return False
    said = f"{exc.stderr}\n{exc}".lower()
    return any(m.lower() in said for m in FINISHED_REFUSALS)
