"""Whether a job asked for MPS, and where its daemon's directories are: the light part of MPS.

The prolog asks every job and the task prolog exports the pipe directory, so this module keeps to
the standard library's cheapest imports; starting and stopping daemons is in
:mod:`gpuslurm.isolate.mps`.

What asks for MPS (``[mps] triggers``), as Slurm 22.05 shows it to the prolog (observed in the
test cluster; none of it needs an extra command):

* ``gres``: a job with ``--gres=mps:N``. Slurm puts ``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`` (the
  job's share of the GPU, N out of the GPU's mps count, in percent) into the prolog's
  environment, beside ``SLURM_JOB_GPUS``/``CUDA_VISIBLE_DEVICES`` for the GPU. There is no
  ``SLURM_JOB_GRES``. That share becomes the daemon's active thread percentage. On PBS the
  job-wide boolean resource ``gpuslurm_mps`` (``qsub -l gpuslurm_mps=true``) is the scheduler's
  MPS resource: the PBS adapter gives it ``[mps] active_thread_percentage`` as its share.
* ``comment``: ``SLURM_JOB_COMMENT`` (the job's ``--comment``) contains ``comment_token`` as a
  word (words are separated by blanks, commas and semicolons), or ``<comment_token>=N`` for an
  active thread percentage N (1-100) of the job's own; any other value after ``=`` is a malformed
  request, which fails the job (never the node: see docs/hooks.md).
* ``feature``: ``SLURM_JOB_CONSTRAINTS`` (the job's ``--constraint``, verbatim, e.g. ``mps&ib``)
  names ``feature``; a name after ``!`` does not count.
"""

from __future__ import annotations

import os
import stat

from gpuslurm.errors import InputError
from gpuslurm.tuples import TYPE_CHECKING, NamedTuple

if TYPE_CHECKING:
    from gpuslurm.config import MpsConfig

GRES_VAR = "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"
PIPE_VAR = "CUDA_MPS_PIPE_DIRECTORY"
LOG_VAR = "CUDA_MPS_LOG_DIRECTORY"
_WORD_SEPARATORS = str.maketrans(",;", "  ")
_CONSTRAINT_OPERATORS = str.maketrans("&|,[]()", "       ")


class MpsRequest(NamedTuple):
    """A job's request for MPS: what asked for it and the active thread percentage to set."""

    trigger: str  # "gres", "comment" or "feature"
    active_thread_percentage: int


class MpsDirs(NamedTuple):
    job: str  # <run_dir>/mps/<jobid>, root's
    pipe: str  # CUDA_MPS_PIPE_DIRECTORY, the user's
    log: str  # CUDA_MPS_LOG_DIRECTORY, the user's


def mps_request(share: str | None, comment: str | None, features: str | None,
                cfg: MpsConfig) -> MpsRequest | None:
    """Whether a job asked for MPS, and by which trigger: ``share`` is the MPS share the scheduler
    gave it (Slurm's ``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE``), ``comment`` and ``features`` what its
    user wrote (Slurm's ``--comment`` and ``--constraint``). InputError for a malformed request."""
    if "gres" in cfg.triggers and share and share.strip():
        return MpsRequest("gres", parse_percentage(share.strip()))
    if "comment" in cfg.triggers and cfg.comment_token and comment:
        token = cfg.comment_token
        for word in sorted(comment_words(comment)):
            if word == token:
                return MpsRequest("comment", cfg.active_thread_percentage)
            if word.startswith(token + "="):  # the job's own share: <token>=<1-100>
                return MpsRequest("comment", parse_percentage(word[len(token) + 1:], "the job's comment"))
    if "feature" in cfg.triggers and cfg.feature and cfg.feature in constraint_features(features or ""):
        return MpsRequest("feature", cfg.active_thread_percentage)
    return None


def parse_percentage(text: str, source: str = GRES_VAR) -> int:
    """Slurm's ``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`` (an integer 1-100; a decimal is rounded up)."""
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not 0 < value <= 100:
        raise InputError(f"not a percentage between 1 and 100: {text!r}", source=source)
    import math  # here: every prolog imports this module, few jobs ask for a percentage

    return math.ceil(value)


def comment_words(comment: str) -> set[str]:
    return set(comment.translate(_WORD_SEPARATORS).split())


def constraint_features(constraints: str) -> set[str]:
    """Feature names a ``--constraint`` expression asks for (counts ``*N`` and ``!name`` dropped)."""
    names = set()
    for word in constraints.translate(_CONSTRAINT_OPERATORS).split():
        if word.startswith("!"):
            continue
        names.add(word.partition("*")[0])
    return names - {""}


def job_dirs(run_dir: str, job_id: str) -> MpsDirs:
    job = os.path.join(run_dir, "mps", check_job_id(job_id))
    return MpsDirs(job, os.path.join(job, "pipe"), os.path.join(job, "log"))


# (uid_t)-1 and (gid_t)-1 mean "leave unchanged" to setuid/setgid/setresuid: a daemon "dropped"
# to them stays root. Anything above does not fit in an id at all.
MAX_ID = 2**32 - 2


def check_id(value: int, source: str) -> int:
    """``value`` if a process can really run as it; InputError for (uid_t)-1 and out-of-range ids."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_ID:
        raise InputError(f"impossible id {value!r} (must be 0..{MAX_ID})", source=source)
    return value


def job_gid(gid: int | None, uid: int) -> int:
    """The job's primary group: ``gid`` as the scheduler gave it, else the user's from the
    password database; InputError for an impossible id or a uid without a passwd entry."""
    check_id(uid, "the job's uid")
    if gid is not None:
        return check_id(gid, "the job's gid")
    import pwd

    try:
        return pwd.getpwuid(uid).pw_gid
    except KeyError:
        raise InputError(f"uid {uid} has no passwd entry and the scheduler gave no gid",
                         source="the job's gid") from None


def check_job_id(job_id: str) -> str:
    """``job_id`` if it is a Slurm (``123``, ``123_4``) or PBS (``123.server``, ``123[4].server``)
    job id (:func:`gpuslurm.jobid.valid_job_id`): it becomes a directory name."""
    from gpuslurm.jobid import check_job_id as check

    return check(job_id)


def mps_exports(run_dir: str, job_id: str | None, uid: int | None = None) -> list[tuple[str, str]]:
    """Task prolog: the MPS variables for a job whose daemon the prolog started, else none.

    The pipe directory must exist and be owned by ``uid`` (default: ours, the job's user); only
    root can create it, under a directory only root can write.
    """
    if job_id is None:
        return []
    try:
        dirs = job_dirs(run_dir, job_id)
        st = os.lstat(dirs.pipe)
    except (InputError, OSError):
        return []
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != (os.getuid() if uid is None else uid):
        return []
    return [(PIPE_VAR, dirs.pipe), (LOG_VAR, dirs.log)]
