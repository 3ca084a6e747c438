"""Job ids, the one validator: Slurm's and PBS's ids, and nothing a path could be built from.

A job id becomes a file name (job maps, summaries) and a command argument (scancel), so every
caller checks it here. Accepted forms:

- Slurm: ``123``, ``123_4`` (an array task);
- PBS: ``123.host``, ``123[4].host``, ``123[].host`` (a job, an array subjob, an array job),
  the server part optional, made of host-name labels (letters, digits, inner hyphens).

Anything else is refused: ``/``, ``..``, NUL, whitespace, a leading ``-`` or ``.``, signs,
non-ASCII digits. Only ``str`` methods are used: the hooks import this on every job.

Slurm 25.11+ also names each job by a SLUID (``SLURM_JOB_SLUID``, ``scontrol show job``'s
``SLUID=``, and from 26.05 the job's cgroup/v2 directory): :func:`valid_sluid`.
"""

from __future__ import annotations

MAX_DIGITS = 10  # Slurm ids are uint32; PBS sequence numbers are smaller still
MAX_LENGTH = 255  # a file name's limit, with room for the suffixes gpuslurm adds


def _number(text: str, *, empty_ok: bool = False) -> bool:
    if not text:
        return empty_ok
    return len(text) <= MAX_DIGITS and text.isascii() and text.isdigit()


def _host_label(text: str) -> bool:
    return (0 < len(text) <= 63 and text.isascii() and text.replace("-", "").isalnum()
            and not text.startswith("-") and not text.endswith("-"))


def valid_job_id(text: str) -> bool:
    """Whether ``text`` is a Slurm or PBS job id (see the module's docstring)."""
    if not 0 < len(text) <= MAX_LENGTH - 20:
        return False
    head, dot, server = text.partition(".")
    if dot and not all(_host_label(label) for label in server.split(".")):
        return False
    if head.endswith("]"):  # PBS array: 123[4] or 123[]
        seq, bracket, index = head[:-1].partition("[")
        return bool(bracket) and _number(seq) and _number(index, empty_ok=True)
    if dot:
        return _number(head)  # PBS: 123.server
    seq, under, task = head.partition("_")
    return _number(seq) and (not under or _number(task))


# Slurm's src/common/sluid.c: a lower-case "s", then the 64-bit value in Crockford's Base32, most
# significant digit first, 13 digits (the first carries the top 4 bits only, so it is 0-F).
SLUID_DIGITS = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"
SLUID_LENGTH = 14


def valid_sluid(text: str) -> bool:
    """Whether ``text`` is a SLUID in the canonical form Slurm prints (``s6Z5M8CB6N7P00``).

    Stricter than Slurm's own ``str2sluid``, which also takes lower case and O/I/L for 0/1/1:
    gpuslurm reads SLUIDs only where Slurm printed them, so any other spelling is not Slurm's.
    The value 0 is Slurm's "no SLUID" and is refused too.
    """
    return (len(text) == SLUID_LENGTH and text[0] == "s" and text[1] in SLUID_DIGITS[:16]
            and all(c in SLUID_DIGITS for c in text[2:]) and text[1:] != "0" * 13)


def check_job_id(text: str) -> str:
    """``text`` if it is a job id; else InputError (exit 2) naming it."""
    if not valid_job_id(text):
        from gpuslurm.errors import InputError

        raise InputError(f"not a Slurm job id (nor a PBS one): {text!r}", source="job id")
    return text


def job_sort_key(job_id: str) -> tuple[int, int, str]:
    """Order valid job ids by number, then array index (a whole array first), then server."""
    head, _, server = job_id.partition(".")
    if head.endswith("]"):
        seq, _, index = head[:-1].partition("[")
    else:
        seq, _, index = head.partition("_")
    return int(seq), int(index) if index else -1, server
