"""Health while jobs run: each monitor cycle, live faults through the prolog's policy, then acted on.

Sources: the kernel log's Xid lines (:class:`gpuslurm.hw.live.kmsg.KmsgReader`), mapped to a GPU by
bus id; NVML's Xid, double-bit ECC and GPU-unavailable events, queued by a thread
(:class:`gpuslurm.hw.live.nvml_events.NvmlEvents`); and the facts NVML (or the replay scenario) gives
now: ECC, pending row remaps and retired pages, temperature, hardware clock slowdowns, a lost
GPU. An Xid stays on its GPU until the monitor restarts or the GPU is brought back online (a
fault does not heal because time passed). The same Xid from two sources, or logged twice, counts
once.

Each GPU in service is checked with :func:`gpuslurm.policy.health.running_faults` (the prolog's
checks, without leftover processes, which are the running jobs'), and each fault gets its check's
configured action: ``gpu_out`` records the GPU out of service (by ``monitor``) and has the
scheduler stop giving it out; ``drain`` drains the node; ``log`` says it once. GPUs already out of
service are not checked again. A GPU NVML already answered GPU_IS_LOST for when the node was read
has no UUID: its ``lost_gpu`` fault is named by its index, and ``gpu_out`` drains the node
instead. The scheduler is brought to the out-of-service record every cycle
(its graceful path moves on when the node's jobs end), and the kernel-log cursor is committed only
after the faults were acted on.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING

from gpuslurm.errors import GpuslurmError
from gpuslurm.policy.fault_response import LAST_IN_SERVICE, respond
from gpuslurm.policy.health import Fault, drain_reason, gpu_label, running_faults
from gpuslurm.samples import ScanProblem
from gpuslurm.state.out_of_service import OutOfServiceStore, take_out_decided

if TYPE_CHECKING:
    from gpuslurm.config import HealthConfig
    from gpuslurm.hw.live.kmsg import KmsgReader
    from gpuslurm.hw.live.nvml_events import NvmlEvents
    from gpuslurm.hw.model.health import GpuHealth
    from gpuslurm.hw.model.node import Gpu, Node
    from gpuslurm.state.scheduler import Scheduler

PROBLEM_KIND = "health"
HealthReader = Callable[[Sequence["Gpu"]], Mapping[str, "GpuHealth"]]
RECONCILE_S = 20.0


class HealthWatch:
    """Checks and acts once per cycle: call :meth:`check` with the cycle's time."""

    def __init__(self, node: Node, cfg: HealthConfig, read: HealthReader, store: OutOfServiceStore,
                 node_name: str, *, scheduler: Scheduler | None = None, kmsg: KmsgReader | None = None,
                 events: NvmlEvents | None = None, warn: Callable[[str], None] = lambda m: None) -> None:
        self.node = node
        self.cfg = cfg
        self.read = read
        self.store = store
        self.node_name = node_name
        self.scheduler = scheduler
        self.kmsg = kmsg
        self.events = events
        self.warn = warn
        self.by_bus = {g.bus_id.upper(): g for g in node.gpus}
        self.xids: dict[str, set[int]] = {}  # live Xids per GPU UUID
        self.lost: set[str] = set()  # GPUs an NVML event said fell off the bus
        self._said: set[tuple[str, str, str]] = set()  # (uuid, check, message) already acted on
        self._last_state = ""
        self._was_out: set[str] = set()
        self._applied: Mapping[str, object] = {}
        self._applied_at = float("-inf")
        self._out: frozenset[str] = frozenset()  # the record as this cycle read it

    def check(self, now: float) -> tuple[ScanProblem, ...]:
        problems: list[ScanProblem] = []

        def problem(subject: str, detail: str) -> None:
            self.warn(f"{subject}: {detail}")
            problems.append(ScanProblem(now, PROBLEM_KIND, subject, detail))

        self._poll_kmsg(problem)
        self._poll_events(problem)
        try:
            out = self.store.read()
        except GpuslurmError as exc:  # a corrupt record: say so, take nothing out blindly
            problem("out-of-service", str(exc))
            return tuple(problems)
        self._out = frozenset(out)
        in_service = [g for g in self.node.gpus if g.uuid not in out]
        for uuid in self._was_out - set(out):  # brought back online: a clean slate
            self.xids.pop(uuid, None)
            self.lost.discard(uuid)
            self._said = {k for k in self._said if k[0] != uuid}
        self._was_out = set(out)
        try:
            facts = self.read(in_service)
        except GpuslurmError as exc:
            problem("health", f"cannot read GPU health: {exc}")
            facts = {}
        faults: list[Fault] = []
        for gpu in in_service:
            fact = facts.get(gpu.uuid)
            if fact is None:
                continue
            live = self.xids.get(gpu.uuid)
            if live:
                fact = fact._replace(xid=tuple(sorted(set(fact.xid) | live)))
            if gpu.uuid in self.lost:
                fact = fact._replace(lost=True)
            faults += running_faults(fact, self.cfg)
        if self.cfg.lost_gpu.action != "off":  # lost before the node was read: no UUID to name it
            faults += [Fault(f"index:{i}", "lost_gpu", self.cfg.lost_gpu.action,
                             "GPU is lost (NVML answers GPU_IS_LOST: it cannot be read or named)")
                       for i in self.node.lost if i not in {r.index for r in out.values()}]
        self._act(faults, now, problem)
        self._reconcile(now, problem)
        if self.kmsg is not None:
            try:
                self.kmsg.commit()
            except (GpuslurmError, OSError) as exc:
                problem("kmsg", f"cannot write the kernel-log cursor: {exc}")
        return tuple(problems)

    def _poll_kmsg(self, problem: Callable[[str, str], None]) -> None:
        if self.kmsg is None:
            return
        polled = self.kmsg.poll()
        for why in polled.problems:
            problem("kmsg", why)
        for line in polled.xids:
            gpu = self.by_bus.get(line.bus_id.upper())
            if gpu is None:
                problem("kmsg", f"Xid {line.code} on {line.bus_id}, which is not one of this node's GPUs")
                continue
            self.xids.setdefault(gpu.uuid, set()).add(line.code)
            self.warn(f"kernel log: Xid {line.code} on GPU index {gpu.index} ({gpu.uuid}): {line.text}")

    def _poll_events(self, problem: Callable[[str, str], None]) -> None:
        if self.events is None:
            return
        events, problems = self.events.drain()
        for why in problems:
            problem("nvml-events", why)
        known = {g.uuid for g in self.node.gpus}
        for ev in events:
            if ev.uuid not in known:
                continue
            if ev.lost:
                self.lost.add(ev.uuid)
                self.warn(f"NVML event: {ev.uuid} is unavailable (fell off the bus)")
                continue
            self.xids.setdefault(ev.uuid, set()).add(ev.code)
            where = "" if ev.gpu_instance is None else f" (MIG GPU instance {ev.gpu_instance})"
            self.warn(f"NVML event: Xid {ev.code} on {ev.uuid}{where}")

    def _act(self, faults: list[Fault], now: float, problem: Callable[[str, str], None]) -> None:
        """Act on the cycle's faults as :func:`respond` decides, each once: a fault seen in an
        earlier cycle drains the node no more (an admin's resume stands until a new fault)."""
        labels = {g.uuid: gpu_label(g.index, g.minor, g.uuid) for g in self.node.gpus}
        labels.update({f"index:{i}": f"index {i} (lost)" for i in self.node.lost})
        new = {f for f in faults if (f.uuid, f.check, f.message) not in self._said}
        self._said.update((f.uuid, f.check, f.message) for f in faults)
        try:
            response = take_out_decided(self.store, lambda out: respond(faults, self.node.gpus, out),
                                        "monitor", now=now, out=self._out)
        except GpuslurmError as exc:  # the record cannot be written: nothing taken out blindly
            problem("out-of-service", f"cannot take GPUs out of service: {exc}; draining the node instead")
            response = respond(faults, self.node.gpus, self._out).unrecorded()
        for d in response.take_outs:
            self.warn(f"GPU {labels[d.uuid]} taken out of service: {d.reason}")
        drains: list[Fault] = []
        for d in response.drains:
            if not new.intersection(d.acted):
                continue
            drains += d.acted
            if d.why == LAST_IN_SERVICE:
                problem(d.uuid, f"GPU {labels[d.uuid]} is the last GPU in service on this node: "
                                "draining the node instead of taking it out")
        for fault in faults:
            if fault.action == "log" and fault in new:
                problem(fault.uuid, f"{fault.check}: {fault.message} (action log)")
        if drains and self.scheduler is not None:
            reason = drain_reason(drains, labels)
            try:
                self.scheduler.drain_node(self.node_name, reason)
                self.warn(f"drained {self.node_name}: {reason}")
            except GpuslurmError as exc:
                problem(self.node_name, f"cannot drain: {exc}")

    def _reconcile(self, now: float, problem: Callable[[str, str], None]) -> None:
        """Bring the scheduler to the record when it changed, else every RECONCILE_S while any GPU
        is out (its graceful path waits for jobs to end); a node with all GPUs in service costs
        no scheduler command."""
        if self.scheduler is None:
            return
        try:
            out = self.store.read()
        except GpuslurmError as exc:
            problem("out-of-service", str(exc))
            return
        if out == self._applied and (not out or now - self._applied_at < RECONCILE_S):
            return
        try:
            state = self.scheduler.apply_gpus_out(self.node_name, self.node, out)
            self._applied, self._applied_at = out, now
        except GpuslurmError as exc:
            problem(self.node_name, f"cannot apply the out-of-service GPUs: {exc}")
            return
        if state != self._last_state:
            self.warn(state)
            self._last_state = state
