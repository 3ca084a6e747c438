"""A Scheduler that records every call and answers as told: the job-start and job-end steps, the
monitor's actions and the live view are tested with it directly, as one more implementation of
:class:`gpuslurm.state.scheduler.Scheduler` (the contract test runs it too)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from gpuslurm.errors import CommandError

if TYPE_CHECKING:
    from gpuslurm.config import Config
    from gpuslurm.hw.model.node import Node
    from gpuslurm.samples import Allocation
    from gpuslurm.state.cgroup import CgroupJob
    from gpuslurm.state.job import HookJob
    from gpuslurm.state.out_of_service import OutOfService
    from gpuslurm.state.running import JobDetail


class RecordingScheduler:
    """Records ``(method, args)`` in :attr:`calls`; ``fail`` names the actions that raise a
    CommandError (as a scheduler command that failed); what it answers is set on the instance."""

    name = "recording"
    title = "the recording scheduler"

    def __init__(self, *, fail: tuple[str, ...] = (), constrains: bool = True,
                 allocations: tuple[Allocation, ...] = (), cgroup_v2: tuple[str, ...] | None = None,
                 sluids: Mapping[str, str] | None = None, listing: str | None = None,
                 no_actions: str | None = None) -> None:
        self.calls: list[tuple[str, tuple[Any, ...]]] = []
        self.fail = fail
        self.constrains = constrains
        self.allocations = allocations
        self.cgroup_v2 = cgroup_v2
        self.sluids = dict(sluids or {})
        self.listing = listing  # why it lists no jobs (None: it lists them)
        self.no_actions = no_actions  # why its node actions cannot run (None: they can)

    def _record(self, method: str, *args: Any) -> None:
        self.calls.append((method, args))
        if method in self.fail:
            raise CommandError(f"{method} failed (told to)")

    def called(self, method: str) -> list[tuple[Any, ...]]:
        """The arguments of each call of ``method``, in order."""
        return [args for name, args in self.calls if name == method]

    def why_no_job_list(self) -> str | None:
        return self.listing

    def node_allocations(self, node_name: str, node: Node) -> tuple[Allocation, ...]:
        self._record("node_allocations", node_name)
        return self.allocations

    def sessions(self) -> Mapping[int, str] | None:
        return None

    def running_job_details(self, node_name: str) -> tuple[JobDetail, ...] | None:
        return None

    def job_of_sluid(self, sluid: str) -> str | None:
        self._record("job_of_sluid", sluid)
        return self.sluids.get(sluid)

    def job_of_cgroup(self, cgroup_text: str) -> CgroupJob | None:
        """Lines ``recording:<job id>`` name that job (gpuslurm's own job cgroups too), as a third
        scheduler's layout would."""
        from gpuslurm.state.cgroup import CgroupJob, job_of_file, job_of_path

        def layout(parts: Sequence[str]) -> CgroupJob | None:
            top = parts[1] if len(parts) > 1 else ""
            return CgroupJob(top[10:]) if top.startswith("recording:") and top[10:] else None

        return job_of_file(cgroup_text, lambda path: job_of_path(path, layout))

    def job_gpus_from_env(self, environ: Mapping[str, str], node: Node) -> tuple[str, ...] | None:
        named = environ.get("RECORDING_GPUS")
        return None if named is None else tuple(u for u in named.split(",") if u)

    def constrains_devices(self, cfg: Config) -> bool:
        self._record("constrains_devices")
        return self.constrains

    def job_cgroup_v2(self, job: HookJob, cfg: Config) -> tuple[str, ...] | None:
        self._record("job_cgroup_v2", job.job_id)
        return self.cgroup_v2

    def existing_job_cgroup_v2(self, job: HookJob, cfg: Config) -> tuple[str, ...]:
        self._record("existing_job_cgroup_v2", job.job_id, job.sluid)
        return ()

    def devices_cgroup_v1_dirs(self, job: HookJob) -> tuple[str, ...]:
        return ()

    def why_no_node_actions(self) -> str | None:
        return self.no_actions

    def drain_node(self, node_name: str, reason: str) -> None:
        self._record("drain_node", node_name, reason)

    def resume_node(self, node_name: str) -> None:
        self._record("resume_node", node_name)

    def refuse_job(self, job_id: str, reason: str) -> str:
        self._record("refuse_job", job_id, reason)
        return "refused"

    def cancel_job(self, job_id: str) -> str:
        self._record("cancel_job", job_id)
        return "cancelled"

    def set_admin_comment(self, job_id: str, text: str) -> None:
        self._record("set_admin_comment", job_id, text)

    def why_no_running_comments(self) -> None:
        return None

    def set_running_comment(self, job_id: str, text: str) -> bool:
        self._record("set_running_comment", job_id, text)
        return True

    def requeue_job(self, job_id: str, reason: str) -> str:
        self._record("requeue_job", job_id, reason)
        return "requeued"

    def set_final_comment(self, job_id: str, text: str) -> str:
        self._record("set_final_comment", job_id, text)
        return f"final comment: {text}"

    def apply_gpus_out(self, node_name: str, node: Node, out: Mapping[str, OutOfService]) -> str:
        self._record("apply_gpus_out", node_name, tuple(sorted(out)))
        return "applied"
