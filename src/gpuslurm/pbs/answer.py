"""What gpuslurm answers the PBS hook on stdout, and the Scheduler the neutral core acts through.

The answer (format 1) is one JSON object the hook applies in PBS's interpreter::

    {"format": 1, "accept": false, "message": "why, for the job's owner and the logs",
     "env": {"CUDA_VISIBLE_DEVICES": "GPU-…,GPU-…"},
     "vnodes": {"pbshost[0]": {"ncpus": 56, "mem": "1031680mb", "ngpus": 4}},
     "offline": {"pbshost[1]": "gpuslurm: GPU index 4 (/dev/nvidia4, GPU-…): Xid 79"}}

``env`` is for execjob_launch (``pbs.event().env``), ``vnodes`` for exechost_startup
(``vnode_list[name].resources_available``), ``offline`` for any event (the vnode's state and
comment; the hook falls back to ``pbsnodes -o -C``). The neutral core never sees PBS: it drains
and refuses through :class:`PbsHookActions`, which writes those actions into the answer.
"""

from __future__ import annotations

import json
from collections.abc import Mapping

from gpuslurm.errors import CommandError, one_line
from gpuslurm.pbs.facts import PbsJobFacts
from gpuslurm.tuples import TYPE_CHECKING

if TYPE_CHECKING:
    from typing import Any

    from gpuslurm.config import Config
    from gpuslurm.hw.model.node import Node
    from gpuslurm.samples import Allocation
    from gpuslurm.state.out_of_service import OutOfService

FORMAT = 1
MAX_COMMENT = 1000  # a vnode comment is read by people in pbsnodes; keep it one short line


def clean_comment(text: str) -> str:
    """``text`` as one printable line of at most MAX_COMMENT characters."""
    line = " ".join("".join(c if c.isprintable() else " " for c in one_line(text)).split())
    return line if len(line) <= MAX_COMMENT else line[: MAX_COMMENT - 3] + "..."


class HookAnswer:
    """The answer being built; :meth:`to_json` is what the hook reads."""

    def __init__(self) -> None:
        self.accept = True
        self.message = ""
        self.env: dict[str, str] = {}
        self.vnodes: dict[str, dict[str, Any]] = {}
        self.offline: dict[str, str] = {}

    def reject(self, message: str) -> None:
        """Refuse the event (the first reason given is kept; later ones are only logged)."""
        if self.accept:
            self.accept = False
            self.message = clean_comment(message)

    def take_offline(self, vnode: str, comment: str) -> None:
        self.offline[vnode] = clean_comment(comment)

    def to_dict(self) -> dict[str, Any]:
        doc: dict[str, Any] = {"format": FORMAT, "accept": self.accept}
        if self.message:
            doc["message"] = self.message
        for key in ("env", "vnodes", "offline"):
            if value := getattr(self, key):
                doc[key] = value
        return doc

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)


class PbsHookActions(PbsJobFacts):
    """:class:`gpuslurm.state.scheduler.Scheduler` inside a PBS hook: every action is written into
    the answer for the hook to apply. Draining takes the job's vnodes with GPUs on this host
    offline (the natural vnode when there are none); refusing rejects the event. ``pbs_cgroups``:
    whether PBS's cgroups hook is enabled on this host (the hook's request says)."""

    name = "pbs"

    def __init__(self, answer: HookAnswer, vnodes: tuple[str, ...] = (), *,
                 pbs_cgroups: bool = False) -> None:
        self.answer = answer
        self.vnodes = vnodes
        self.pbs_cgroups = pbs_cgroups

    def why_no_job_list(self) -> str:
        return "a PBS hook acts on one job: it lists none (qstat's view is gpuslurm.pbs.scheduler's)"

    def why_no_node_actions(self) -> None:
        return None  # the hook's answer carries them; pbs_mom applies it

    def node_allocations(self, node_name: str, node: Node) -> tuple[Allocation, ...]:
        return ()  # a hook acts on one job; qstat's view is gpuslurm.pbs.scheduler's

    def sessions(self) -> Mapping[int, str]:
        return {}  # no job list, so no sessions: PBS's jobs are told by session, as qstat gives them

    def constrains_devices(self, cfg: Config) -> bool:
        """Whether PBS's cgroups hook, enabled here, confines the job's devices."""
        return self.pbs_cgroups

    def cancel_job(self, job_id: str) -> str:
        raise CommandError("a PBS hook does not delete a job; use qdel")

    def drain_node(self, node_name: str, reason: str) -> None:
        for vnode in self.vnodes or (node_name,):
            self.answer.take_offline(vnode, reason)

    def resume_node(self, node_name: str) -> None:
        raise CommandError("a PBS hook does not put vnodes back online; use pbsnodes -r")

    def refuse_job(self, job_id: str, reason: str) -> str:
        self.answer.reject(reason)
        return "rejected on this host; PBS puts it back in the queue"

    def set_admin_comment(self, job_id: str, text: str) -> None:
        raise CommandError("PBS keeps no comment a hook can set on a finished job "
                           "(the summary file has the figures)")

    def why_no_running_comments(self) -> str:
        return "a PBS hook acts on its own event, never on running jobs' comments"

    def set_running_comment(self, job_id: str, text: str) -> bool:
        self.set_admin_comment(job_id, text)  # raises: PBS keeps no comment a hook can set
        return True

    def set_final_comment(self, job_id: str, text: str) -> str:
        return f"PBS keeps no final comment on a job; the summary file has it: {text}"

    def requeue_job(self, job_id: str, reason: str) -> str:
        self.answer.reject(reason)  # rejected at execjob_begin: PBS puts the job back in the queue
        return "rejected on this host; PBS puts it back in the queue"

    def apply_gpus_out(self, node_name: str, node: Node, out: Mapping[str, OutOfService]) -> str:
        raise CommandError("one GPU out of service is not applied on PBS yet: its vnode is taken "
                           "offline instead (docs/pbs.md)")
