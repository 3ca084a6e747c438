"""A SLUID's job id, from ``scontrol show -d job s<SLUID>`` (Slurm 26.05): the monitor's fallback
for a process in a SLUID-named cgroup whose job has no map on this node (pure parser, one call).

26.05's ``scontrol show job`` takes a SLUID where it takes a job id, and with ``-d`` prints the
record's SLUID on the line after the first (src/scontrol/info_job.c)::

    JobId=12 JobName=train
       SLUID=s6Z5M8CB6N7P00
       UserId=alice(1000) GroupId=alice(1000) MCS_label=N/A

The first line is Slurm's (a job name comes after ``JobId=`` on it), and the job id is its alone.
A name, comment or submit line holding a newline can add lines of its own, never remove one:
the record must hold the ``SLUID=`` line asked for, and other ``SLUID=`` lines are ignored.
Refusing them would let a job's name make its own SLUID unknown, and the monitor never judges a
process in an unknown SLUID's cgroup rogue. A forged line naming another SLUID is harmless:
slurmctld answers a SLUID with that SLUID's record, never one that merely prints it.
"""

from __future__ import annotations

import re

from gpuslurm.jobid import valid_sluid

_FIRST_RE = re.compile(r"JobId=(\d{1,10})(?: |$)")
_SLUID_RE = re.compile(r" {3}SLUID=(\S*)\s*")
MAX_OUTPUT = 1 << 20  # one job's record is a few kB


def job_of_sluid_text(text: str, sluid: str) -> str | None:
    """The job id ``scontrol show -d job <sluid>`` printed for ``sluid``; None when the text is
    not a job's record holding that SLUID's line."""
    if not valid_sluid(sluid) or len(text) > MAX_OUTPUT:
        return None
    lines = text.splitlines()
    first = _FIRST_RE.match(lines[0]) if lines else None
    seen = {m.group(1) for line in lines[1:] if (m := _SLUID_RE.fullmatch(line))}
    if first is None or sluid not in seen:
        return None
    return first.group(1)


def job_of_sluid(sluid: str, *, scontrol: str, timeout: float) -> str | None:
    """Ask slurmctld which job ``sluid`` is; None when it knows none (ended, or not 26.05).
    CommandError when scontrol cannot be run or times out."""
    from gpuslurm.runner import run_command

    if not valid_sluid(sluid):  # checked before it becomes an argument
        return None
    result = run_command([scontrol, "-d", "show", "job", sluid], timeout=timeout, check=False)
    if result.returncode != 0:
        return None
    return job_of_sluid_text(result.stdout, sluid)
