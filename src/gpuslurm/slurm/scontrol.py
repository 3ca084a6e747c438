"""``scontrol`` calls the hooks make: drain this node with a reason (and undo it).

Arguments go to scontrol as separate argv items (no shell), so a reason needs no quoting; it is
still kept to one printable line, since Slurm shows it in ``sinfo -R`` and logs.
"""

from __future__ import annotations

import re

from gpuslurm.errors import CommandError, InputError
from gpuslurm.names import check_node_name as _check_name
from gpuslurm.runner import CommandResult, run_command

MAX_REASON = 1000  # Slurm keeps longer reasons, but sinfo -R is read by people


def clean_reason(reason: str) -> str:
    """``reason`` as one printable line of at most MAX_REASON characters."""
    text = " ".join("".join(c if c.isprintable() else " " for c in reason).split())
    return text if len(text) <= MAX_REASON else text[: MAX_REASON - 3] + "..."


def check_node_name(name: str) -> str:
    """``name`` if it is one Slurm node name (see :mod:`gpuslurm.names`)."""
    return _check_name(name, source="SLURMD_NODENAME")


def drain_node(node: str, reason: str, *, scontrol: str, timeout: float) -> CommandResult:
    """``scontrol update NodeName=<node> State=DRAIN Reason=<reason>``; CommandError on failure."""
    return run_command([scontrol, "update", f"NodeName={check_node_name(node)}", "State=DRAIN",
                        f"Reason={clean_reason(reason)}"], timeout=timeout)


def resume_node(node: str, *, scontrol: str, timeout: float) -> CommandResult:
    """``scontrol update NodeName=<node> State=RESUME``."""
    return run_command([scontrol, "update", f"NodeName={check_node_name(node)}", "State=RESUME"],
                       timeout=timeout)


MAX_ADMIN_COMMENT = 1000  # a short line for people; sacct and scontrol show it whole

# AdminComment is one field that other tools write whole too (Princeton jobstats: "JS1:" and its
# payload, decoded only when the field holds nothing else). gpuslurm writes "gpuslurm/1: <summary>"
# and only into an empty field or over its own: this version's, a later one's, or the unversioned
# "gpuslurm: ..." of before (issue 21). Users cannot set AdminComment; their field is Comment,
# which gpuslurm neither reads here nor writes.
ADMIN_COMMENT_TAG = "gpuslurm/1: "
_OURS = re.compile(r"gpuslurm(?:/[0-9]{1,4})?:(?: |$)")


def own_admin_comment(text: str) -> str:
    """``text`` as gpuslurm's AdminComment payload: ``gpuslurm/1: <text>`` (an old "gpuslurm: " dropped)."""
    body = text.strip()
    if match := _OURS.match(body):
        body = body[match.end():]
    return ADMIN_COMMENT_TAG + body


def admin_comment_is_ours(current: str) -> bool:
    """Whether gpuslurm may write over ``current``: empty, or a payload of gpuslurm's own."""
    return not current.strip() or _OURS.match(current.strip()) is not None


def current_admin_comment(job_id: str, *, squeue: str, timeout: float) -> str | None:
    """The job's AdminComment as slurmctld holds it (``squeue --json``: the field by name, where no
    user's text can pose as it), or None when squeue does not list the job."""
    from gpuslurm.slurm.squeue import parse_squeue_json

    wanted = check_job_id(job_id)
    listed = run_command([squeue, "--json", f"--jobs={wanted}"], timeout=timeout)  # 22.05 lists all
    found = [j for j in parse_squeue_json(listed.stdout) if j.job_id == wanted]
    return found[0].admin_comment if found else None


def set_own_admin_comment(job_id: str, text: str, *, squeue: str, scontrol: str,
                          timeout: float) -> str | None:
    """Set the job's AdminComment to :func:`own_admin_comment` of ``text`` unless it holds another
    tool's content (or squeue no longer lists the job); what it holds then, else None.

    Read, then written: a tool that writes between the two loses its line to gpuslurm's (slurmctld
    has no compare-and-set); jobstats writes once the job has ended, when slurmctld refuses
    gpuslurm's update anyway.
    """
    current = current_admin_comment(job_id, squeue=squeue, timeout=timeout)
    if current is None:
        return "(the job is not listed by squeue)"
    if not admin_comment_is_ours(current):
        return current
    set_admin_comment(job_id, own_admin_comment(text), scontrol=scontrol, timeout=timeout)
    return None


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


# sacctmgr's answers when this host keeps no accounting database: slurm.conf names no slurmdbd
# (AccountingStorageType=accounting_storage/none), or there is no Slurm configuration to read
NO_ACCOUNTING = ("not running a supported accounting_storage plugin",
                 "Could not establish a configuration source", "Unable to process configuration file")


def accounting_admin_comment(job_id: str, *, sacct: str, timeout: float) -> str | None:
    """The job's AdminComment in slurmdbd (``sacct -X -n -P -o AdminComment``), or None when
    there is no accounting database or no record of the job yet (nothing to compare: not written)."""
    main = check_job_id(job_id).partition("_")[0]
    result = run_command([sacct, "-X", "-n", "-P", "-j", main, "-o", "AdminComment"], timeout=timeout,
                         check=False)
    lines = result.stdout.splitlines()
    if result.returncode != 0 or not lines:
        return None
    return lines[-1].strip()  # sacct's last record of the job (a requeued job has several)


def set_accounting_admin_comment(job_id: str, text: str, *, sacctmgr: str, timeout: float) -> bool:
    """``sacctmgr -i modify job where jobid=<id> set AdminComment=<text>``: the job's record in
    slurmdbd, which (unlike slurmctld) still takes it after the job ended.

    False when Slurm keeps no accounting database; CommandError when sacctmgr fails otherwise
    (slurmdbd down, or the job not in its database yet: "Nothing modified"). sacctmgr 22.05
    lowercases the value and stores quotes as backquotes; quotes are turned into backquotes here
    already, since a value that starts with one would be cut at the next.
    """
    main, sep, _task = check_job_id(job_id).partition("_")
    if sep:  # sacctmgr takes plain job ids only; the epilog always has one
        raise InputError(f"sacctmgr needs a plain job id, not {job_id!r}", source="SLURM_JOB_ID")
    line = " ".join("".join(c if c.isprintable() else " " for c in text).split())
    line = line.replace('"', "`").replace("'", "`")
    if len(line) > MAX_ADMIN_COMMENT:
        line = line[: MAX_ADMIN_COMMENT - 3] + "..."
    argv = [sacctmgr, "-i", "modify", "job", "where", f"jobid={main}", "set", f"AdminComment={line}"]
    result = run_command(argv, timeout=timeout, check=False)
    said = f"{result.stdout}\n{result.stderr}"
    if result.returncode != 0 and any(m in said for m in NO_ACCOUNTING):
        return False
    if result.returncode != 0 or "Modified jobs" not in result.stdout:
        last = " ".join(said.split())[-300:]
        raise CommandError(f"sacctmgr modify job {main} failed ({result.returncode}): {last}",
                           tuple(argv), result.returncode, result.stderr)
    return True


def refuse_job(job_id: str, reason: str, *, scontrol: str, scancel: str = "/usr/bin/scancel",
               timeout: float) -> str:
    """Stop a job that a prolog refuses for its own input, without touching the node; what was done.

    Slurm 22.05 drains the node for any non-zero Prolog exit, so a prolog that refuses a job
    for what its user asked must do it itself and exit 0. Tested in the real cluster from a
    Prolog: ``scontrol update JobId=<id> Comment=<reason>`` then ``scontrol requeuehold <id>``
    leaves the job PENDING, Reason ``job_requeued_in_held_state``, its Comment saying why, the
    batch script never started and the node IDLE. A job Slurm cannot requeue (``--no-requeue``,
    an ``srun``/``salloc`` allocation) is cancelled instead (``scancel``). CommandError when
    neither worked.
    """
    return _requeue_or_cancel(job_id, reason, "requeuehold", "requeued and held", scontrol=scontrol,
                              scancel=scancel, timeout=timeout)


def requeue_job(job_id: str, reason: str, *, scontrol: str, scancel: str = "/usr/bin/scancel",
                timeout: float) -> str:
    """Requeue a job its node cannot serve (a GPU failed under it), not held; what was done.

    As :func:`refuse_job`, from the prolog, which then exits 0 so that the node is not drained:
    the Comment says why, ``scontrol requeue`` puts the job back as PENDING to run elsewhere (or
    here once the node serves its other GPUs). A job Slurm cannot requeue (``--no-requeue``, an
    ``srun``/``salloc`` allocation) is cancelled. CommandError when neither worked.
    """
    return _requeue_or_cancel(job_id, reason, "requeue", "requeued", scontrol=scontrol, scancel=scancel,
                              timeout=timeout)


def _requeue_or_cancel(job_id: str, reason: str, verb: str, done: str, *, scontrol: str, scancel: str,
                       timeout: float) -> str:
    """The job's Comment set to ``reason``, then ``scontrol <verb>`` (``done``), or ``scancel``
    where Slurm cannot requeue it (``cancelled``)."""
    check_job_id(job_id)
    run_command([scontrol, "update", f"JobId={job_id}", f"Comment={clean_reason(reason)}"],
                timeout=timeout, check=False)  # best effort: the requeue matters, the words help
    try:
        run_command([scontrol, verb, job_id], timeout=timeout)
        return done
    except CommandError:
        run_command([scancel, job_id], timeout=timeout)
        return "cancelled"
