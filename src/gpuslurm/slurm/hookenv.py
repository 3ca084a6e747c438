"""The environment Slurm gives a prolog, epilog or task prolog, and the GPUs it names.

Pure: ``HookEnv.from_environ`` takes a mapping (``os.environ`` in production) and
``resolve_job_gpus`` a ``HookEnv`` and a ``Node``; neither touches the system.

Which GPUs a job has, in this order (see ``resolve_job_gpus``):

1. Neither ``SLURM_STEP_GPUS`` nor ``SLURM_JOB_GPUS`` set: the job has no GPUs here. A
   ``CUDA_VISIBLE_DEVICES`` alone is ignored, since a user can export one into a job that has
   no GPUs.
2. ``CUDA_VISIBLE_DEVICES`` made only of UUIDs (``GPU-…``, ``MIG-…``, or the old
   ``MIG-GPU-<uuid>/<gi>/<ci>``), as Slurm writes for MIG and from 25.11: those devices.
3. Otherwise the numbers of ``SLURM_STEP_GPUS`` (a step's own GPUs), else ``SLURM_JOB_GPUS``.
   They are Slurm's GRES indices: the position of the device among the ``Name=gpu`` lines of
   gres.conf. gpuslurm writes those lines in PCI bus order, a MIG-mode GPU contributing one line
   per MIG device in the node's order and none if it has no instances; ``gres_devices`` lists
   the node's devices in exactly that order. Numeric ``CUDA_VISIBLE_DEVICES`` is never used:
   with ``ConstrainDevices=yes`` Slurm renumbers it from 0 inside the job.
"""

from __future__ import annotations

from gpuslurm.errors import InputError
from gpuslurm.state.job import GpuClaim, HookJob, JobDevice, is_uuid, node_devices, resolve_devices
from gpuslurm.tuples import TYPE_CHECKING, NamedTuple

if TYPE_CHECKING:
    from collections.abc import Mapping

    from gpuslurm.hw.model.node import Node

# What Slurm writes into CUDA_VISIBLE_DEVICES when a GRES has no device files.
NO_DEV_FILES = "NoDevFiles"


class HookEnv(NamedTuple):
    """What a hook learns from its environment; ``None`` where the variable is absent."""

    job_id: str | None = None  # SLURM_JOB_ID
    uid: int | None = None  # SLURM_JOB_UID
    user: str | None = None  # SLURM_JOB_USER
    job_gpus: tuple[int, ...] | None = None  # SLURM_JOB_GPUS: GRES indices
    step_gpus: tuple[int, ...] | None = None  # SLURM_STEP_GPUS: GRES indices
    cuda_visible_devices: tuple[str, ...] | None = None  # indices or UUIDs, as written
    context: str | None = None  # SLURM_SCRIPT_CONTEXT: prolog_slurmd, epilog_slurmd, …
    node_name: str | None = None  # SLURMD_NODENAME
    step_id: str | None = None  # SLURM_STEP_ID
    array_job_id: str | None = None  # SLURM_ARRAY_JOB_ID
    array_task_id: str | None = None  # SLURM_ARRAY_TASK_ID
    comment: str | None = None  # SLURM_JOB_COMMENT (where Slurm provides it)
    constraints: str | None = None  # SLURM_JOB_CONSTRAINTS (where Slurm provides it)

    @classmethod
    def from_environ(cls, environ: Mapping[str, str]) -> HookEnv:
        """Parse Slurm's variables; a malformed one is an InputError naming it."""

        def text(name: str) -> str | None:
            value = environ.get(name, "").strip()
            return value or None

        cvd = text("CUDA_VISIBLE_DEVICES")
        return cls(
            job_id=_digits(text("SLURM_JOB_ID"), "SLURM_JOB_ID", "a job id"),
            uid=_uid(text("SLURM_JOB_UID")),
            user=text("SLURM_JOB_USER"),
            job_gpus=parse_index_list(text("SLURM_JOB_GPUS"), "SLURM_JOB_GPUS"),
            step_gpus=parse_index_list(text("SLURM_STEP_GPUS"), "SLURM_STEP_GPUS"),
            cuda_visible_devices=(None if cvd is None or cvd == NO_DEV_FILES
                                  else tuple(p.strip() for p in cvd.split(",") if p.strip())),
            context=text("SLURM_SCRIPT_CONTEXT"),
            node_name=text("SLURMD_NODENAME"),
            step_id=text("SLURM_STEP_ID"),
            array_job_id=_digits(text("SLURM_ARRAY_JOB_ID"), "SLURM_ARRAY_JOB_ID", "a job id"),
            array_task_id=_digits(text("SLURM_ARRAY_TASK_ID"), "SLURM_ARRAY_TASK_ID", "a task id"),
            comment=text("SLURM_JOB_COMMENT"),
            constraints=text("SLURM_JOB_CONSTRAINTS"),
        )

    def require_job(self) -> tuple[str, int, str]:
        """Job id, uid and user, which every job hook needs; InputError naming what is missing."""
        for name, value in (("SLURM_JOB_ID", self.job_id), ("SLURM_JOB_UID", self.uid),
                            ("SLURM_JOB_USER", self.user)):
            if value is None:
                raise InputError("is not set: not running as a Slurm job hook?", source=name)
        assert self.job_id is not None and self.uid is not None and self.user is not None
        return self.job_id, self.uid, self.user


def hook_job(environ: Mapping[str, str]) -> HookJob:
    """The neutral job the hooks run on, from Slurm's hook environment; InputError naming a
    variable that is missing or malformed."""
    env = HookEnv.from_environ(environ)
    job_id, uid, user = env.require_job()
    start = environ.get("SLURM_JOB_START_TIME", "").strip()  # 23.02 and later
    return HookJob(
        scheduler="slurm", job_id=job_id, uid=uid, user=user, node_name=node_name(environ),
        gpus=gpu_claim(env), gid=_gid(environ.get("SLURM_JOB_GID", "").strip() or None),
        account=environ.get("SLURM_JOB_ACCOUNT", "").strip() or None,
        start=float(start) if start.isascii() and start.isdigit() and len(start) <= 10 else None,
        comment=env.comment, features=env.constraints,
        mps_share=environ.get("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "").strip() or None,
        sluid=job_sluid(environ))


def job_sluid(environ: Mapping[str, str]) -> str | None:
    """``SLURM_JOB_SLUID`` (Slurm 25.11+ gives it to Prolog and Epilog; slurmd's environment, not
    the job's), None when unset; InputError (exit 2) when it is not a SLUID as Slurm prints one."""
    from gpuslurm.jobid import valid_sluid

    text = environ.get("SLURM_JOB_SLUID", "").strip()
    if not text:
        return None
    if not valid_sluid(text):
        raise InputError(f"not a SLUID: {text[:40]!r}", source="SLURM_JOB_SLUID")
    return text


def node_name(environ: Mapping[str, str]) -> str:
    """The Slurm name of this node: ``SLURMD_NODENAME``, else the short host name."""
    import os

    return environ.get("SLURMD_NODENAME", "").strip() or os.uname().nodename.split(".")[0]


def gres_devices(node: Node) -> tuple[JobDevice, ...]:
    """The node's gpu GRES in gres.conf order, so position ``i`` is Slurm's index ``i``."""
    return node_devices(node)


def gpu_claim(env: HookEnv) -> GpuClaim | None:
    """The job's (or step's) GPUs as Slurm names them; None when it has none here (rule above)."""
    var, indices = ("SLURM_STEP_GPUS", env.step_gpus) if env.step_gpus is not None \
        else ("SLURM_JOB_GPUS", env.job_gpus)
    if indices is None:
        return None
    cvd = env.cuda_visible_devices
    if cvd and all(is_uuid(item) for item in cvd):
        return GpuClaim(indices, tuple(cvd), "CUDA_VISIBLE_DEVICES")
    return GpuClaim(indices, (), var)


def resolve_job_gpus(env: HookEnv, node: Node) -> tuple[JobDevice, ...]:
    """The devices the job (or step) was given, in the order Slurm listed them.

    The rule is in the module docstring. Repeats are dropped; an index out of range or an
    unknown UUID is an InputError naming the variable.
    """
    claim = gpu_claim(env)
    return () if claim is None else resolve_devices(claim, node)


def parse_index_list(text: str | None, var: str) -> tuple[int, ...] | None:
    """Slurm's ``0,1,2`` (ranges such as ``0-3`` accepted too); None when absent."""
    if text is None:
        return None
    from gpuslurm.ranges import MAX_GPUS, range_bounds

    try:
        bounds = range_bounds(text, MAX_GPUS)  # bounded before anything is expanded
    except ValueError as exc:
        raise InputError(f"not a list of GPU indices: {text!r}: {exc}", source=var) from None
    return tuple(i for first, last, _ in bounds for i in range(first, last + 1))


def _digits(value: str | None, var: str, what: str) -> str | None:
    if value is not None and not (value.isascii() and value.isdigit()):
        raise InputError(f"not {what}: {value!r}", source=var)
    return value


def _uid(value: str | None) -> int | None:
    if value is None:
        return None
    if not (value.isascii() and value.isdigit()):
        raise InputError(f"not a numeric uid: {value!r}", source="SLURM_JOB_UID")
    if len(value) > 10 or int(value) > 2**32 - 2:  # (uid_t)-1 is "unchanged" to setuid
        raise InputError(f"impossible uid: {value!r}", source="SLURM_JOB_UID")
    return int(value)


def _gid(value: str | None) -> int | None:
    if value is None:
        return None
    if not (value.isascii() and value.isdigit()) or len(value) > 10 or int(value) > 2**32 - 2:
        raise InputError(f"not a possible gid: {value!r}", source="SLURM_JOB_GID")
    return int(value)


def join_task_cgroup(environ: Mapping[str, str]) -> str | None:
    """The TaskProlog's join (cgroup v1, :func:`gpuslurm.isolate.cgroup_v1.join_job_cgroup`): job
    ``SLURM_JOB_ID``'s task ``SLURM_TASK_PID`` (the task prolog's parent when that is unset or not
    a number); None outside a job."""
    import os

    from gpuslurm.isolate.cgroup_v1 import join_job_cgroup

    job_id = environ.get("SLURM_JOB_ID", "").strip()
    if not job_id:
        return None
    task = environ.get("SLURM_TASK_PID", "").strip()
    return join_job_cgroup(job_id, int(task) if task.isascii() and task.isdigit() else os.getppid())
