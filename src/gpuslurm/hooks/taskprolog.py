"""The task-start step, as the job's user before each task: the environment the task should get.

:func:`task_exports` is neutral (a job's GPU claim in, ``NAME=value`` pairs out);
:func:`task_start` is the failure policy. Slurm's TaskProlog (:mod:`gpuslurm.slurm.hooks`) prints
them as lines Slurm applies; PBS's execjob_launch sets them in the task's environment.

Slurm reads ``export NAME=value`` and ``unset NAME`` lines from a TaskProlog's standard output
and changes the task's environment accordingly. What we print:

* ``CUDA_VISIBLE_DEVICES``: Slurm's value is kept when it set one (with ``ConstrainDevices`` it
  is ``0..n-1`` inside the job's device cgroup, which is right there and only there). When it is
  unset although the job has GPUs, we export the devices' UUIDs in Slurm's order: a UUID names
  the same device whatever the numbering.
* ``CUDA_DEVICE_ORDER=PCI_BUS_ID`` unless the user chose an order: CUDA then numbers the job's
  GPUs in bus order, which is the order of Slurm's GRES indices and of ``nvidia-smi``.
* Hints for binding a task near its GPU, for ``numactl``/``taskset``/``OMP_PLACES`` in the job
  script (we do not set binding ourselves: Slurm's CPU binding and cgroup decide what is
  allowed). Task ``SLURM_LOCALID`` = k is matched to the job's GPU k mod n:
  ``GPUSLURM_GPU_UUIDS`` (all of the job's devices), ``GPUSLURM_LOCAL_GPU`` (k mod n, a CUDA
  ordinal under the order above), ``GPUSLURM_GPU_UUID``, ``GPUSLURM_NUMA_NODE`` (the GPU's NUMA
  node, when known) and ``GPUSLURM_GPU_CPUS`` (its OS CPUs close to it, e.g. ``0-55,112-167``).
* ``CUDA_MPS_PIPE_DIRECTORY`` and ``CUDA_MPS_LOG_DIRECTORY`` when the prolog started an MPS
  daemon for the job (``gpuslurm.isolate.mps``): CUDA then connects the task to that daemon.

It never fails the task for its hints: any error there is one line on stderr and the exit code
is 0. The one exception is device isolation (``gpuslurm.isolate.cgroup_v1``): when the
prolog made a devices cgroup for the job and the task cannot be moved into it, the task prolog
exits ``EXIT_NOT_ISOLATED``; slurmstepd then logs "TaskProlog failed" and the task never runs
(a batch job ends FAILED with that exit code; the node is not drained).
"""

from __future__ import annotations

from gpuslurm.errors import EXIT_NOT_ISOLATED
from gpuslurm.tuples import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence
    from typing import TextIO

    from gpuslurm.hooks.log import HookLog
    from gpuslurm.hw.model.node import Node
    from gpuslurm.state.job import GpuClaim
    from gpuslurm.state.taskinfo import TaskDevice, TaskInfo


def task_exports(claim: GpuClaim | None, job_id: str | None, *, local_id: str = "0",
                 keep_cuda_visible_devices: bool = False, keep_device_order: bool = False,
                 node: Callable[[], Node], run_dir: str, uid: int | None,
                 info: TaskInfo | None = None) -> list[tuple[str, str]]:
    """The ``(name, value)`` pairs for a task of the job (none for a task without GPUs).

    The job's devices come from the task file the prolog wrote (:mod:`gpuslurm.state.taskinfo`,
    checked to be root's and to name job ``job_id`` of ``uid``); ``node()`` is read only for a job
    whose prolog wrote none (started before an upgrade). ``local_id`` is the task's rank on the
    node (Slurm's ``SLURM_LOCALID``; not a number: 0); ``keep_*`` say the task already has its own
    ``CUDA_VISIBLE_DEVICES`` / ``CUDA_DEVICE_ORDER``; ``info``: the task file, when the caller
    has read it already. Values that are not one printable line are
    left out (they would smuggle in another command).
    """
    if claim is None:
        return []
    devices = task_devices(claim, job_id, node=node, run_dir=run_dir, uid=uid, info=info)
    if not devices:
        return []
    pairs = task_values(devices, _local(local_id), run_dir=run_dir, job_id=job_id,
                        set_visible=not keep_cuda_visible_devices, set_order=not keep_device_order)
    return [(name, value) for name, value in pairs if value.isprintable() and "\n" not in value]


def task_devices(claim: GpuClaim, job_id: str | None, *, node: Callable[[], Node], run_dir: str,
                 uid: int | None, info: TaskInfo | None = None) -> tuple[TaskDevice, ...]:
    """The devices of ``claim`` for a task of job ``job_id``: from the prolog's task file
    (``info``, else read from ``run_dir``) when there is one (a device outside the job is an
    InputError), else from ``node()``."""
    from gpuslurm.state.taskinfo import claimed_devices, read_task_info, task_device

    if info is None and job_id is not None:
        info = read_task_info(run_dir, job_id, uid)
    if info is not None:
        return claimed_devices(info, claim)
    from gpuslurm.state.job import resolve_devices

    return tuple(task_device(d) for d in resolve_devices(claim, node()))


def task_values(devices: Sequence[TaskDevice], local: int, *, run_dir: str, job_id: str | None,
                set_visible: bool = True, set_order: bool = True,
                uid: int | None = None) -> list[tuple[str, str]]:
    """The variables a task of a job holding ``devices`` gets (see the module docstring), whatever
    the scheduler: the task is the job's ``local``-th on this node; ``set_visible``/``set_order``
    say whether CUDA_VISIBLE_DEVICES/CUDA_DEVICE_ORDER are to be set; ``uid`` owns the MPS pipe
    directory (default: the caller, the job's user)."""
    from gpuslurm.isolate.mps_request import mps_exports

    uuids = ",".join(d.uuid for d in devices)
    values: list[tuple[str, str]] = []
    if set_visible:
        values.append(("CUDA_VISIBLE_DEVICES", uuids))
    if set_order:
        values.append(("CUDA_DEVICE_ORDER", "PCI_BUS_ID"))
    values.append(("GPUSLURM_GPU_UUIDS", uuids))
    k = local % len(devices)
    mine = devices[k]
    values += [("GPUSLURM_LOCAL_GPU", str(k)), ("GPUSLURM_GPU_UUID", mine.uuid)]
    if mine.numa_node is not None:
        values.append(("GPUSLURM_NUMA_NODE", str(mine.numa_node)))
    if mine.cpus:
        values.append(("GPUSLURM_GPU_CPUS", mine.cpus))
    return values + mps_exports(run_dir, job_id, uid)


def _local(text: str) -> int:
    """The task's rank on the node from its text (Slurm's SLURM_LOCALID); 0 when not a number."""
    local = text.strip()
    return int(local) if local.isascii() and local.isdigit() and len(local) < 8 else 0


def task_start(join: Callable[[], object], lines: Callable[[], list[str]], out: TextIO,
               log: HookLog) -> int:
    """Join the job's device limits (``join``), then write ``lines()`` to ``out``: 0 unless the
    task could not join (EXIT_NOT_ISOLATED); an error in ``lines`` only costs the task its hints."""
    try:  # isolation first: it is the one step allowed to refuse the task
        join()
    except Exception as exc:
        log.error(f"cannot join the job's devices cgroup, refusing to start the task: {exc}")
        return EXIT_NOT_ISOLATED
    try:
        text = lines()
    except Exception as exc:  # GpuslurmError or a bug alike: the job runs, without our hints
        log.error(f"no GPU hints for this task: {exc}")
        return 0
    try:
        for line in text:
            out.write(line + "\n")
        out.flush()
    except (OSError, ValueError) as exc:
        log.error(f"cannot write the task prolog's output: {exc}")
    return 0
