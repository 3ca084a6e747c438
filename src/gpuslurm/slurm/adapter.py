"""Slurm behind :class:`gpuslurm.state.scheduler.Scheduler`: squeue for the jobs on a node, scontrol to
drain and resume it, scancel, the job's cgroups (each release's layout: :mod:`gpuslurm.slurm.cgroup_v2`)
and GPUs (its hook environment). The one squeue wrapper the monitor and the live view share."""

from __future__ import annotations

import os

from gpuslurm.tuples import TYPE_CHECKING

if TYPE_CHECKING:  # the hooks build this adapter on every job: keep its imports to os
    from collections.abc import Mapping

    from gpuslurm.config import Config, GpuOutConfig
    from gpuslurm.hw.model.node import Node
    from gpuslurm.samples import Allocation
    from gpuslurm.state.cgroup import CgroupJob
    from gpuslurm.state.job import HookJob
    from gpuslurm.state.out_of_service import OutOfService
    from gpuslurm.state.running import JobDetail


def devices_cgroup_v1_dirs(job_id: str, uid: int, node: str) -> tuple[str, ...]:
    """Where Slurm keeps a job's processes in the v1 ``devices`` hierarchy: its cgroup/v1 plugin
    with ``ConstrainDevices=yes`` limits the job there, and its extern step (``PrologFlags=Contain``:
    made before the prolog runs) is where processes started for the job outside any step belong, as
    pam_slurm_adopt's do. ``slurm_<node>`` is the layout of several slurmd on one host. Nothing for
    an id that is not Slurm's."""
    from gpuslurm.jobid import valid_job_id

    if not (valid_job_id(job_id) and job_id.isascii() and job_id.isdigit()):
        return ()
    return tuple(f"{top}/uid_{uid}/job_{job_id}/step_extern" for top in (f"slurm_{node}", "slurm"))


class SlurmScheduler:
    """Slurm's commands at ``squeue`` and ``scontrol``, each bounded by ``timeout`` seconds."""

    name = "slurm"
    title = "Slurm"

    def __init__(self, *, squeue: str = "/usr/bin/squeue", scontrol: str = "/usr/bin/scontrol",
                 timeout: float = 10.0,
                 scancel: str = "/usr/bin/scancel", sacctmgr: str = "/usr/bin/sacctmgr",
                 gpu_out: GpuOutConfig | None = None) -> None:
        self.gpu_out = gpu_out
        self.squeue = squeue
        self.scontrol = scontrol
        self.scancel = scancel
        self.sacctmgr = sacctmgr
        self.timeout = timeout

    @classmethod
    def from_config(cls, cfg: Config) -> SlurmScheduler:
        """The commands ``[paths]`` names, bounded by ``[hooks] command_timeout_s``."""
        p = cfg.paths
        return cls(squeue=p.squeue, scontrol=p.scontrol, scancel=p.scancel, sacctmgr=p.sacctmgr,
                   timeout=cfg.hooks.command_timeout_s, gpu_out=cfg.gpu_out)

    def why_no_job_list(self) -> str | None:
        """None when squeue is there to run; else so (the monitor falls back to the job maps alone)."""
        if os.access(self.squeue, os.X_OK):
            return None
        return f"{self.squeue} is missing: jobs without a job map stay unattributed to GPUs"

    def node_allocations(self, node_name: str, node: Node) -> tuple[Allocation, ...]:
        from gpuslurm.samples import Allocation
        from gpuslurm.slurm.squeue import node_allocations

        found = node_allocations(self.squeue, node_name, node, timeout=self.timeout)
        return tuple(Allocation(j.job.job_id, j.job.user, j.job.uid, j.uuids, j.job.start, j.job.account,
                                source="squeue") for j in found)

    def sessions(self) -> None:
        """None: Slurm puts its jobs' processes in cgroups of its own (read from /proc)."""
        return None

    def running_job_details(self, node_name: str) -> tuple[JobDetail, ...]:
        """This node's running jobs from ``squeue --json``, each read with its own ``scontrol show -d
        job ID`` (a user's job name or comment cannot reach another job's record there)."""
        from gpuslurm.errors import CommandError
        from gpuslurm.runner import run_command
        from gpuslurm.slurm.job_detail import live_jobs
        from gpuslurm.slurm.squeue import parse_squeue_json

        if not (os.access(self.scontrol, os.X_OK) and os.access(self.squeue, os.X_OK)):
            raise CommandError(f"{self.scontrol} or {self.squeue} not found; record `scontrol show -d job` "
                               "and pass --input")
        listed = run_command([self.squeue, "--json", f"--nodelist={node_name}", "--states=RUNNING"],
                             timeout=self.timeout)
        return live_jobs(parse_squeue_json(listed.stdout), node_name,
                         lambda job_id: run_command([self.scontrol, "show", "-d", "job", job_id],
                                                    timeout=self.timeout).stdout)

    def job_gpus_from_env(self, environ: Mapping[str, str], node: Node) -> tuple[str, ...] | None:
        """Inside a Slurm job (``SLURM_JOB_ID`` set): ``GPUSLURM_GPU_UUIDS`` from the task prolog
        when set, else ``SLURM_STEP_GPUS``/``SLURM_JOB_GPUS`` (GRES indices) resolved against the
        node; under ConstrainDevices NVML shows only the job's GPUs, so when the node shows exactly
        as many GPUs as the job holds, those are the job's. None outside a Slurm job."""
        if not environ.get("SLURM_JOB_ID", "").strip():
            return None
        named = environ.get("GPUSLURM_GPU_UUIDS", "").strip()
        if named:
            return tuple(u.strip() for u in named.split(",") if u.strip())
        from gpuslurm.slurm.hookenv import HookEnv, resolve_job_gpus

        env = HookEnv.from_environ(environ)
        indices = env.step_gpus if env.step_gpus is not None else env.job_gpus
        if indices is None:
            return ()
        if node.source == "nvml" and len(node.gpus) == len(indices):
            return tuple(g.uuid for g in node.gpus)
        return tuple(d.uuid for d in resolve_job_gpus(env, node))

    def constrains_devices(self, cfg: Config) -> bool:
        """``ConstrainDevices=yes`` in Slurm's cgroup.conf (``[paths] slurm_cgroup_conf``; none: no)."""
        from gpuslurm.slurm.cgroup_v2 import read_constrains_devices

        return read_constrains_devices(cfg)

    def devices_cgroup_v1_dirs(self, job: HookJob) -> tuple[str, ...]:
        return devices_cgroup_v1_dirs(job.job_id, job.uid, job.node_name)

    def cancel_job(self, job_id: str) -> str:
        """``scancel JOB``."""
        from gpuslurm.runner import run_command
        from gpuslurm.slurm.scontrol import check_job_id

        run_command([self.scancel, check_job_id(job_id)], timeout=self.timeout)
        return "cancelled"

    def job_cgroup_v2(self, job: HookJob, cfg: Config) -> tuple[str, ...]:
        """The job's directory under slurmd's cgroup/v2 stepd scope, or every place slurmstepd may
        make it (:mod:`gpuslurm.slurm.cgroup_v2`); HardwareError naming what was looked for."""
        from gpuslurm.slurm.cgroup_v2 import job_cgroup

        return job_cgroup(cfg, job.node_name, job.job_id, job.sluid).paths

    def existing_job_cgroup_v2(self, job: HookJob, cfg: Config) -> tuple[str, ...]:
        """Those of the job's directories that exist (the epilog removes the empty ones)."""
        from gpuslurm.slurm.cgroup_v2 import existing_job_cgroup_dirs

        return existing_job_cgroup_dirs(cfg, job.node_name, job.job_id, job.sluid)

    def job_of_cgroup(self, cgroup_text: str) -> CgroupJob | None:
        """The Slurm job (or gpuslurm job cgroup) ``cgroup_text`` names, every release's layout
        (:mod:`gpuslurm.slurm.cgroup_paths`); on 26.05 maybe by its SLUID alone."""
        from gpuslurm.slurm.cgroup_paths import parse_cgroup

        return parse_cgroup(cgroup_text)

    def job_of_sluid(self, sluid: str) -> str | None:
        """The id of the job Slurm names ``sluid`` (26.05: ``scontrol show -d job s<SLUID>``); None
        when slurmctld knows none. CommandError when scontrol fails to run."""
        from gpuslurm.slurm.sluid import job_of_sluid

        return job_of_sluid(sluid, scontrol=self.scontrol, timeout=self.timeout)

    def drain_node(self, node_name: str, reason: str) -> None:
        from gpuslurm.slurm.scontrol import drain_node

        drain_node(node_name, reason, scontrol=self.scontrol, timeout=self.timeout)

    def resume_node(self, node_name: str) -> None:
        from gpuslurm.slurm.scontrol import resume_node

        resume_node(node_name, scontrol=self.scontrol, timeout=self.timeout)

    def requeue_job(self, job_id: str, reason: str) -> str:
        from gpuslurm.slurm.scontrol import requeue_job

        return requeue_job(job_id, reason, scontrol=self.scontrol, scancel=self.scancel, timeout=self.timeout)

    def refuse_job(self, job_id: str, reason: str) -> str:
        from gpuslurm.slurm.scontrol import refuse_job

        return refuse_job(job_id, reason, scontrol=self.scontrol, scancel=self.scancel, timeout=self.timeout)

    def set_admin_comment(self, job_id: str, text: str) -> None:
        """gpuslurm's payload in the job's AdminComment, unless another tool's content is there."""
        from gpuslurm.slurm.scontrol import set_own_admin_comment

        set_own_admin_comment(job_id, text, squeue=self.squeue, scontrol=self.scontrol, timeout=self.timeout)

    def why_no_node_actions(self) -> str | None:
        """None where scontrol is there to run."""
        return None if os.access(self.scontrol, os.X_OK) else f"{self.scontrol} is missing"

    def why_no_running_comments(self) -> str | None:
        """None where scontrol is there to run."""
        if os.access(self.scontrol, os.X_OK):
            return None
        return f"{self.scontrol} is missing: jobs' AdminComment is not kept current"

    def set_running_comment(self, job_id: str, text: str) -> bool:
        """:meth:`set_admin_comment`; False when slurmctld refuses because the job has finished."""
        from gpuslurm.errors import GpuslurmError
        from gpuslurm.slurm.scontrol import refused_as_finished

        try:
            self.set_admin_comment(job_id, text)
        except GpuslurmError as exc:
            if refused_as_finished(exc):
                return False
            raise
        return True

    def apply_gpus_out(self, node_name: str, node: Node, out: Mapping[str, OutOfService]) -> str:
        """Holder jobs on the GPUs out of service (:mod:`gpuslurm.slurm.gpu_out`), per ``[gpu_out]``."""
        from gpuslurm.config import GpuOutConfig
        from gpuslurm.slurm.gpu_out import GpuOutOptions, reconcile

        cfg = self.gpu_out or GpuOutConfig()
        opts = GpuOutOptions(node_name, scontrol=self.scontrol, squeue=self.squeue, sbatch=cfg.sbatch,
                             scancel=self.scancel, timeout_s=self.timeout, holder_mem_mib=cfg.holder_mem_mib,
                             job_on_gpu=cfg.job_on_gpu)
        return reconcile(node, out, opts)

    def set_final_comment(self, job_id: str, text: str) -> str:
        """The job's AdminComment as it ends; slurmctld refuses a finished job's (22.05), so then
        its record in slurmdbd, where there is one. What happened, for the log."""
        from gpuslurm.errors import GpuslurmError
        from gpuslurm.slurm.scontrol import (
            accounting_admin_comment,
            admin_comment_is_ours,
            own_admin_comment,
            refused_as_finished,
            set_accounting_admin_comment,
            set_own_admin_comment,
        )

        try:
            held = set_own_admin_comment(job_id, text, squeue=self.squeue, scontrol=self.scontrol,
                                         timeout=self.timeout)
            if held is None:
                return f"AdminComment: {own_admin_comment(text)}"
            return f"AdminComment left alone, it holds another tool's content: {held[:80]}"
        except GpuslurmError as exc:
            if not refused_as_finished(exc):
                raise
        stands = "Slurm does not update a finished job: the monitor's last AdminComment stands"
        sacct = os.path.join(os.path.dirname(self.sacctmgr), "sacct")
        if not (os.access(self.sacctmgr, os.X_OK) and os.access(sacct, os.X_OK)):
            return stands
        held = accounting_admin_comment(job_id, sacct=sacct, timeout=self.timeout)
        if held is not None and not admin_comment_is_ours(held):  # jobstats writes slurmdbd's copy
            return f"AdminComment in slurmdbd left alone, it holds another tool's content: {held[:80]}"
        if held is not None and set_accounting_admin_comment(job_id, own_admin_comment(text),
                                                             sacctmgr=self.sacctmgr, timeout=self.timeout):
            return f"AdminComment (in slurmdbd, the job has finished): {own_admin_comment(text)}"
        return stands  # no slurmdbd: slurmctld's copy is all there is
