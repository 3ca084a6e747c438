"""What the neutral core asks of a scheduler, as one typed interface every adapter implements.

The hooks, watch/, report/ and the CLI never run a scheduler's commands nor branch on its name: an
entry point builds an adapter (:class:`gpuslurm.slurm.adapter.SlurmScheduler`;
:class:`gpuslurm.pbs.scheduler.PbsScheduler` for PBS's commands;
:class:`gpuslurm.pbs.answer.PbsHookActions` inside a PBS hook; see :mod:`gpuslurm.cli.schedulers`)
and passes it in. Where a scheduler has no such thing, its method says so with an empty value or
None, as documented below, never by being absent. tests/state/test_scheduler_contract.py runs every
implementation through this interface on outputs recorded from the real clusters; a third
scheduler is one more adapter and one more parameter there.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from collections.abc import Mapping

    from gpuslurm.config import Config
    from gpuslurm.hw.model.node import Node
    from gpuslurm.samples import Allocation
    from gpuslurm.state.cgroup import CgroupJob
    from gpuslurm.state.job import HookJob
    from gpuslurm.state.out_of_service import OutOfService
    from gpuslurm.state.running import JobDetail


class Scheduler(Protocol):
    """One scheduler's view of, and actions on, this node."""

    name: str  # "slurm", "pbs": for messages and records, never to branch on
    title: str  # "Slurm", "PBS": the scheduler as a sentence names it

    # --- what runs here --------------------------------------------------------------------------

    def why_no_job_list(self) -> str | None:
        """None when :meth:`node_allocations` can ask the scheduler; else why not (its command is
        missing), one line the monitor says once before attributing from the job maps alone."""
        ...

    def node_allocations(self, node_name: str, node: Node) -> tuple[Allocation, ...]:
        """The running jobs holding GPUs on ``node_name``, as the scheduler lists them (a PBS
        hook, acting on one job: none)."""
        ...

    def sessions(self) -> Mapping[int, str] | None:
        """Session id → job id of the jobs the last :meth:`node_allocations` found here, for a
        scheduler whose jobs' processes are told by their session (PBS); None for one that puts
        them in cgroups of its own (Slurm)."""
        ...

    def running_job_details(self, node_name: str) -> tuple[JobDetail, ...] | None:
        """Each running job on ``node_name`` with its CPUs and GPU indices there (the placement
        check's input); None when the scheduler details no job's CPUs (PBS). CommandError when its
        commands are missing or fail."""
        ...

    def job_of_sluid(self, sluid: str) -> str | None:
        """The id of the job named by ``sluid`` (Slurm 26.05's cgroup names); None when the
        scheduler knows none (and always for a scheduler without SLUIDs)."""
        ...

    def job_of_cgroup(self, cgroup_text: str) -> CgroupJob | None:
        """The job a ``/proc/PID/cgroup`` text puts its process in, read in this scheduler's cgroup
        layout (and gpuslurm's own job cgroups, :mod:`gpuslurm.state.cgroup`); None when none
        does. Pure: only the text, which root alone can make name a job."""
        ...

    def job_gpus_from_env(self, environ: Mapping[str, str], node: Node) -> tuple[str, ...] | None:
        """The UUIDs of the GPUs a process whose environment is ``environ`` may use, when it runs
        inside one of this scheduler's jobs (empty: none known); None when it does not."""
        ...

    # --- the job's cgroups -----------------------------------------------------------------------

    def constrains_devices(self, cfg: Config) -> bool:
        """Whether the scheduler itself limits its jobs' devices on this node (then ``[cgroup]
        devices = "auto"`` leaves isolation to it)."""
        ...

    def job_cgroup_v2(self, job: HookJob, cfg: Config) -> tuple[str, ...] | None:
        """Every cgroup v2 directory the scheduler may run ``job`` in (each gets gpuslurm's device
        program); None when the scheduler makes the job none, and gpuslurm makes its own
        (:func:`gpuslurm.isolate.cgroup_v2.v2_pbs_dir`). GpuslurmError when it cannot tell."""
        ...

    def existing_job_cgroup_v2(self, job: HookJob, cfg: Config) -> tuple[str, ...]:
        """Those of the scheduler's cgroup v2 directories of ``job`` that exist (the job-end step
        removes the empty ones); empty for a scheduler that makes none."""
        ...

    def devices_cgroup_v1_dirs(self, job: HookJob) -> tuple[str, ...]:
        """Where the scheduler itself keeps ``job``'s processes in the v1 ``devices`` hierarchy
        (relative to its mount), most specific first; empty for an id that is not the scheduler's."""
        ...

    # --- actions ---------------------------------------------------------------------------------

    def why_no_node_actions(self) -> str | None:
        """None when the node actions (drain, resume, GPUs out) can reach the scheduler; else why
        not (its command is missing), one line: the monitor then logs faults without telling it."""
        ...

    def drain_node(self, node_name: str, reason: str) -> None:
        """Take ``node_name`` out of service with ``reason`` (drain / offline)."""
        ...

    def resume_node(self, node_name: str) -> None:
        """Put ``node_name`` back into service."""
        ...

    def refuse_job(self, job_id: str, reason: str) -> str:
        """Keep ``job_id`` from running on this node for ``reason`` its user can read, without taking
        the node out of service (Slurm: requeue-hold with a Comment, else cancel); what was done."""
        ...

    def cancel_job(self, job_id: str) -> str:
        """End ``job_id`` for good (Slurm: scancel; PBS: qdel; a PBS hook: rejects its event); what
        was done. GpuslurmError when it failed."""
        ...

    def set_admin_comment(self, job_id: str, text: str) -> None:
        """Attach ``text`` to the running job where admins and accounting see it."""
        ...

    def why_no_running_comments(self) -> str | None:
        """None when :meth:`set_running_comment` can keep running jobs' comments current (the
        monitor's ``[epilog] admin_comment``); else why not, one line the monitor says once."""
        ...

    def set_running_comment(self, job_id: str, text: str) -> bool:
        """:meth:`set_admin_comment` from the monitor while ``job_id`` runs; False when the scheduler
        refused because the job has just ended (not a failure: the last comment stands).
        GpuslurmError when it failed."""
        ...

    def requeue_job(self, job_id: str, reason: str) -> str:
        """Put ``job_id`` back in the queue, not held, for ``reason`` (a GPU of this node failed
        under it, not its user's fault), without taking the node out of service; a job that cannot
        be requeued is cancelled. What was done."""
        ...

    def set_final_comment(self, job_id: str, text: str) -> str:
        """Attach ``text`` to ``job_id`` as it ends (the epilog's summary line), wherever this
        scheduler still takes it; what was done, for the log. GpuslurmError when it failed."""
        ...

    def apply_gpus_out(self, node_name: str, node: Node, out: Mapping[str, OutOfService]) -> str:
        """Bring the scheduler to the out-of-service record ``out`` (the GPUs of ``node`` it must not
        give to new jobs); safe to repeat. One line saying where the node stands."""
        ...
