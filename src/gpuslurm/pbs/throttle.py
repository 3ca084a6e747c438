"""The throttle on PBS: what ``plugins/pbs/gpuslurm_throttle.py`` (a pbs_server hook) decides for a job.

The same throttle file as ``plugins/job_submit.lua`` (format in :mod:`gpuslurm.slurm.throttle`,
parsed by :func:`gpuslurm.policy.throttle.parse_throttle_file`), with the same fail-open rules: a
missing, unreadable or oversized file, or a junk line naming the user, lets the job through. For a
throttled user's job that asks for GPUs (``ngpus`` in its select or job-wide resources):

- ``reject``: refused, saying why, until when and whom to ask;
- ``cap``: refused when it asks for more than ``value`` GPUs in all, or when its GPU count cannot be
  read (PBS's select cannot be cut down as Slurm's GRES string is: the user resubmits);
- ``priority``: its ``Priority`` (-1024..1023) is lowered by ``value``, at least to -1024 when the
  value is a Slurm-sized nice.

Jobs without GPUs pass. Pure apart from :func:`read_throttles`; imported by the hook inside
pbs_server's own interpreter, so it uses the standard library and gpuslurm's light modules only.
"""

from __future__ import annotations

import time
from typing import NamedTuple

from gpuslurm.policy.throttle import Throttle, ThrottleFile, parse_throttle_file

MAX_FILE_BYTES = 16 << 20  # as the Lua plugin: a larger file is not gpuslurm's, nobody throttled
MAX_SELECT = 64 << 10
MIN_PRIORITY = -1024  # PBS's job Priority range
MAX_PRIORITY = 1023
DEFAULT_CONTACT = "your cluster administrators"


class Decision(NamedTuple):
    action: str  # "pass", "reject", "priority"
    message: str = ""
    priority: int | None = None  # with "priority": the job's new Priority


def select_gpus(select: str) -> int | None:
    """GPUs in all in a select statement (``2:ncpus=4:ngpus=2+ngpus=1`` → 5); None when a chunk that
    names ngpus cannot be read."""
    if len(select) > MAX_SELECT:
        return None
    total = 0
    for chunk in select.split("+"):
        parts = chunk.strip().split(":")
        count = 1
        if parts and parts[0].isascii() and parts[0].isdigit():
            count = int(parts[0][:9])
            parts = parts[1:]
        for part in parts:
            name, eq, value = part.partition("=")
            if name.strip().lower() != "ngpus":
                continue
            value = value.strip()
            if not eq or not (value.isascii() and value.isdigit()) or len(value) > 9:
                return None
            total += count * int(value)
    return total


def job_gpus(select: str | None, ngpus: int | None) -> int | None:
    """The job's GPUs: the larger of its select's sum and its job-wide ``ngpus``; None: unreadable."""
    from_select = select_gpus(select) if select else 0
    if from_select is None:
        return None
    return max(from_select, ngpus or 0)


def throttle_for(tf: ThrottleFile, user: str, now: float) -> Throttle | None:
    """The user's throttle in force (the last unexpired line wins, as in the Lua plugin)."""
    found = None
    for t in tf.throttles:
        if t.user == user and t.active(now):
            found = t
    return found


def _tail(t: Throttle, contact: str) -> str:
    until = time.strftime("%Y-%m-%d %H:%M %Z", time.localtime(t.until))
    because = f" because of {t.reason}" if t.reason else ""
    return f"until {until}{because}. Ask {t.contact or contact or DEFAULT_CONTACT} to lift it."


def decide(t: Throttle | None, gpus: int | None, *, priority: int | None = None,
           contact: str = "") -> Decision:
    """What to do with a job of ``gpus`` GPUs (None: it asks for GPUs, how many is unreadable)
    whose owner has throttle ``t``."""
    if t is None or gpus == 0:
        return Decision("pass")
    tail = _tail(t, contact)
    if t.mode == "reject":
        return Decision("reject", f"gpuslurm: GPU jobs of user {t.user} are refused {tail} "
                                  "Jobs without GPUs are not affected.")
    if t.mode == "cap":
        if gpus is not None and gpus <= t.value:
            return Decision("pass")
        asked = "an unreadable number of" if gpus is None else str(gpus)
        return Decision("reject", f"gpuslurm: user {t.user} is limited to {t.value} GPU(s) per job, this "
                                  f"job asks for {asked}; ask for fewer (e.g. select=1:ngpus={t.value}) "
                                  f"{tail}")
    current = priority if priority is not None else 0
    lowered = max(MIN_PRIORITY, min(MAX_PRIORITY, current) - t.value)
    if lowered >= current:
        return Decision("pass")
    return Decision("priority", f"gpuslurm: your GPU job runs with Priority {lowered} (lower) {tail}",
                    lowered)


def read_throttles(path: str) -> ThrottleFile:
    """The throttle file at ``path`` (safedir's bounded read: never a FIFO or device); an empty one
    when it is missing. OSError/ValueError for the caller to fail open on."""
    from gpuslurm.safedir import read_regular

    try:
        data = read_regular(path, MAX_FILE_BYTES)
    except FileNotFoundError:
        return ThrottleFile((), (), exists=False)
    return parse_throttle_file(data.decode("utf-8", errors="replace"))
