"""``gpuslurm task-prolog``: runs as the job's user before each task; prints lines Slurm applies.

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
is 0. The one exception is device isolation (``gpuslurm.isolate.devices``, cgroup v1): when the
prolog made a devices cgroup for the job and the task cannot be moved into it, the task prolog
exits ``EXIT_NOT_ISOLATED``; slurmstepd then logs "TaskProlog failed" and the task never runs
(a batch job ends FAILED with that exit code; the node is not drained).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, TextIO

from gpuslurm.hooks.prolog import HookLog

if TYPE_CHECKING:
    from gpuslurm.state.job import JobDevice

EXIT_NOT_ISOLATED = 3  # the task could not join its devices cgroup: Slurm refuses the task


def task_prolog_lines(environ: Mapping[str, str]) -> list[str]:
    """The ``export`` lines for this task (none for a task without GPUs)."""
    from gpuslurm.hw.source import load_node
    from gpuslurm.slurm.hookenv import HookEnv, resolve_job_gpus

    env = HookEnv.from_environ(environ)
    if env.job_gpus is None and env.step_gpus is None:
        return []
    devices = resolve_job_gpus(env, load_node(environ.get("GPUSLURM_CAPTURE") or None, links=False))
    if not devices:
        return []
    from gpuslurm.config import load_config

    local = environ.get("SLURM_LOCALID", "0").strip()
    values = task_values(devices, int(local) if local.isascii() and local.isdigit() else 0,
                         run_dir=load_config(environ=environ).paths.run_dir, job_id=env.job_id,
                         set_visible=not environ.get("CUDA_VISIBLE_DEVICES", "").strip(),
                         set_order=not environ.get("CUDA_DEVICE_ORDER", "").strip())
    # Slurm takes the value to the end of the line: a newline would smuggle in another command.
    return [f"export {name}={value}" for name, value in values
            if value.isprintable() and "\n" not in value]


def task_values(devices: Sequence[JobDevice], local: int, *, run_dir: str, job_id: str | None,
                set_visible: bool = True, set_order: bool = True,
                uid: int | None = None) -> list[tuple[str, str]]:
    """The variables a task of a job holding ``devices`` gets (see the module docstring), whatever
    the scheduler: the task is the job's ``local``-th on this node; ``set_visible``/``set_order``
    say whether CUDA_VISIBLE_DEVICES/CUDA_DEVICE_ORDER are to be set; ``uid`` owns the MPS pipe
    directory (default: the caller, the job's user)."""
    from gpuslurm.isolate.mps_request import mps_exports
    from gpuslurm.ranges import format_ranges

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
    if mine.gpu.numa_node is not None:
        values.append(("GPUSLURM_NUMA_NODE", str(mine.gpu.numa_node)))
    if mine.gpu.cpu_affinity:
        values.append(("GPUSLURM_GPU_CPUS", format_ranges(mine.gpu.cpu_affinity)))
    return values + mps_exports(run_dir, job_id, uid)


def run_task_prolog(environ: Mapping[str, str], out: TextIO, log: HookLog | None = None) -> int:
    """Print the lines to ``out``; 0 unless the task could not join its devices cgroup."""
    log = log or HookLog("task-prolog", use_syslog=False)
    try:  # isolation first: it is the one step allowed to refuse the task
        from gpuslurm.isolate.devices import join_job_cgroup

        join_job_cgroup(environ)
    except Exception as exc:
        log.error(f"cannot join the job's devices cgroup, refusing to start the task: {exc}")
        return EXIT_NOT_ISOLATED
    try:
        lines = task_prolog_lines(environ)
    except Exception as exc:  # GpuslurmError or a bug alike: the job runs, without our hints
        log.error(f"no GPU hints for this task: {exc}")
        return 0
    try:
        for line in lines:
            out.write(line + "\n")
        out.flush()
    except (OSError, ValueError) as exc:
        log.error(f"cannot write the task prolog's output: {exc}")
    return 0
