"""``gpuslurm mig apply``: drain the node, reconfigure MIG, regenerate gres.conf, resume.

The sequence, and what happens when a step fails:

1. Plan from the node as it is now (only GPUs that differ are touched); render gres.conf once
   from the current node so that a broken template fails before anything changes.
2. Drain the node (reason ``gpuslurm: MIG reconfiguration``) and wait until ``squeue`` lists no
   job on it. Timeout: resume the node (nothing was changed) and fail.
3. Run the plan's ``nvidia-smi`` commands; after a mode change, check the mode took effect (a
   GPU may need a reset first: "reset pending").
4. Read the node again and check it matches the layout; write gres.conf atomically;
   ``scontrol reconfigure``; resume the node.

A failure in 3 or 4 leaves the node drained with a reason saying what failed: it is never
resumed in a MIG state nobody checked. A node that was already drained by someone else is left
drained at the end, its reason untouched unless a step fails.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple, TextIO

from gpuslurm.config import PathsConfig
from gpuslurm.errors import CommandError, GpuslurmError, HardwareError, InputError
from gpuslurm.gres.records import GresOptions
from gpuslurm.hw.model.node import Node
from gpuslurm.isolate.mig import (
    GpuChange,
    Layout,
    MigStep,
    WantedGpu,
    diff_lines,
    format_plan,
    plan_changes,
    resolve_layout,
)
from gpuslurm.runner import run_command
from gpuslurm.slurm.scontrol import check_node_name, clean_reason, drain_node, resume_node

DRAIN_REASON = "gpuslurm: MIG reconfiguration"
IDLE_JOB_STATES = frozenset({"PENDING", "PD"})  # listed by squeue -w but holding nothing on it
_FIELD = r"\b{}=(.*?)(?= [A-Za-z]+=|$)"


class ApplyOptions(NamedTuple):
    node_name: str  # the Slurm NodeName to drain and resume
    drain: bool = True
    wait_s: float = 600.0  # how long running jobs may take to finish
    poll_s: float = 2.0
    gres_conf: Path | None = None  # regenerate this file (and scontrol reconfigure)
    gres: GresOptions = GresOptions()
    gres_template: Path | None = None
    smi_timeout_s: float = 120.0  # a mode change may reset the GPU
    slurm_timeout_s: float = 10.0


def node_field(show_node: str, name: str) -> str:
    """A field of ``scontrol -o show node`` output (``State``, ``Reason``); "" when absent."""
    match = re.search(_FIELD.format(re.escape(name)), show_node.strip())
    return match.group(1).strip() if match else ""


def is_drained(state: str) -> bool:
    """Whether a Slurm node state (``IDLE+DRAIN``, ``MIXED+DRAIN``…) carries the drain flag."""
    return "DRAIN" in state.upper().split("+")


def busy_jobs(squeue_out: str) -> list[str]:
    """Job ids from ``squeue -h -o '%i %T'`` lines whose jobs hold or may hold the node."""
    jobs = []
    for line in squeue_out.splitlines():
        fields = line.split()
        if len(fields) >= 2 and fields[1].upper() not in IDLE_JOB_STATES:
            jobs.append(fields[0])
    return jobs


def mode_query(out: str) -> tuple[bool | None, bool | None]:
    """(current, pending) from ``--query-gpu=mig.mode.current,mig.mode.pending --format=csv,noheader``."""
    words = [w.strip().lower() for w in out.strip().splitlines()[0].split(",")] if out.strip() else []

    def flag(w: str) -> bool | None:
        return True if w == "enabled" else False if w == "disabled" else None

    return (flag(words[0]) if words else None, flag(words[1]) if len(words) > 1 else None)


def write_atomic(path: Path, text: str, mode: int = 0o644) -> None:
    """Replace ``path`` atomically (see :func:`gpuslurm.safedir.replace_file`); slurmd and
    slurmctld both read gres.conf, so the mode is exactly ``mode``, not the umask's."""
    from gpuslurm.safedir import replace_file

    try:
        replace_file(str(path), text.encode("utf-8"), mode)
    except OSError as exc:
        raise InputError(f"cannot write: {exc.strerror}", path) from None


class MigApplier:
    """Carries out a MIG plan on one node; ``load`` re-reads the node's facts (NVML or a bundle)."""

    def __init__(self, paths: PathsConfig, opts: ApplyOptions, load: Callable[[], Node], out: TextIO,
                 sleep: Callable[[float], None] = time.sleep,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.paths = paths
        self.opts = opts
        self.load = load
        self.out = out
        self.sleep = sleep
        self.clock = clock

    def say(self, line: str) -> None:
        print(line, file=self.out, flush=True)

    # --- the sequence -------------------------------------------------------------------------

    def plan(self, layout: Layout) -> tuple[Node, tuple[WantedGpu, ...], tuple[GpuChange, ...]]:
        """Read the node, check the layout against it and print what would change."""
        node = self.load()
        wanted = resolve_layout(layout, node)
        changes = plan_changes(node, wanted)
        for line in format_plan(node, changes, self.paths.nvidia_smi):
            self.say(line)
        return node, wanted, changes

    def apply(self, wanted: tuple[WantedGpu, ...], node: Node, changes: tuple[GpuChange, ...]) -> None:
        """Run the whole sequence for a plan made by :meth:`plan`; raises on failure."""
        check_node_name(self.opts.node_name)
        if not changes:
            return
        old_gres = None
        if self.opts.gres_conf is not None:
            self._render(node)  # a broken template or option fails now, before anything changes
            old_gres = self._gres_summary(node)
        drained_before = False
        if self.opts.drain:
            drained_before = self._drain_and_wait()
        try:
            self._reconfigure(changes)
            node = self.load()
            problems = diff_lines(node, wanted)
            if problems:
                raise HardwareError(f"after reconfiguring, {problems[0]}")
            self.say(f"{node.hostname}: MIG layout verified")
            if self.opts.gres_conf is not None:
                self._write_gres(node, old_gres)
        except GpuslurmError as exc:
            if self.opts.drain:
                self._leave_drained(exc)
            raise
        if self.opts.drain:
            if drained_before:
                self.say(f"{self.opts.node_name}: left drained, as it was before mig apply")
            else:
                resume_node(self.opts.node_name, scontrol=self.paths.scontrol,
                            timeout=self.opts.slurm_timeout_s)
                self.say(f"{self.opts.node_name}: resumed")

    # --- Slurm --------------------------------------------------------------------------------

    def _scontrol(self, *args: str) -> str:
        return run_command([self.paths.scontrol, *args], timeout=self.opts.slurm_timeout_s).stdout

    def _drain_and_wait(self) -> bool:
        """Drain (unless someone else already did) and wait for the jobs; True if drained before."""
        node = self.opts.node_name
        shown = self._scontrol("-o", "show", "node", node)
        state, reason = node_field(shown, "State"), node_field(shown, "Reason")
        # A drain of ours left by an earlier failed apply is the normal way back: finish the job.
        drained_before = is_drained(state) and not reason.startswith(DRAIN_REASON)
        if drained_before:
            self.say(f"{node}: already drained ({reason or 'no reason'}); keeping that drain")
        else:
            drain_node(node, DRAIN_REASON, scontrol=self.paths.scontrol, timeout=self.opts.slurm_timeout_s)
            self.say(f"{node}: drained ({DRAIN_REASON})")
        try:
            self._wait_for_jobs()
        except GpuslurmError:
            if not drained_before:  # nothing was changed yet: give the node back
                try:
                    resume_node(node, scontrol=self.paths.scontrol, timeout=self.opts.slurm_timeout_s)
                    self.say(f"{node}: resumed; MIG left unchanged")
                except CommandError as exc:
                    self.say(f"{node}: could not resume it: {exc}")
            raise
        return drained_before

    def _wait_for_jobs(self) -> None:
        deadline = self.clock() + self.opts.wait_s
        announced = False
        while True:
            out = run_command([self.paths.squeue, "-h", "-w", self.opts.node_name, "-o", "%i %T"],
                              timeout=self.opts.slurm_timeout_s).stdout
            jobs = busy_jobs(out)
            if not jobs:
                return
            if self.clock() >= deadline:
                raise CommandError(f"{self.opts.node_name}: jobs {','.join(jobs)} still run after "
                                   f"{self.opts.wait_s:g} s; MIG not changed (raise --wait-s)")
            if not announced:
                self.say(f"{self.opts.node_name}: waiting for jobs {','.join(jobs)} to end "
                         f"(at most {self.opts.wait_s:g} s)")
                announced = True
            self.sleep(min(self.opts.poll_s, max(0.0, deadline - self.clock())))

    def _leave_drained(self, exc: GpuslurmError) -> None:
        reason = clean_reason(f"{DRAIN_REASON} failed: {exc}")
        try:
            drain_node(self.opts.node_name, reason, scontrol=self.paths.scontrol,
                       timeout=self.opts.slurm_timeout_s)
            self.say(f"{self.opts.node_name}: left DRAINED (reason: {reason})")
        except CommandError as again:
            self.say(f"{self.opts.node_name}: could not set the drain reason ({again}); the node "
                     "stays drained from before")

    # --- nvidia-smi ---------------------------------------------------------------------------

    def _reconfigure(self, changes: tuple[GpuChange, ...]) -> None:
        for change in changes:
            for step in change.steps:
                self._run_step(step)

    def _run_step(self, step: MigStep) -> None:
        argv = [self.paths.nvidia_smi, *step.args]
        self.say("run: " + " ".join(argv))
        try:
            run_command(argv, timeout=self.opts.smi_timeout_s)
        except CommandError as exc:
            raise CommandError(f"GPU {step.index}: {step.kind} failed: {exc}", exc.argv, exc.returncode,
                               exc.stderr) from exc
        if step.kind == "mode":
            self._check_mode(step)

    def _check_mode(self, step: MigStep) -> None:
        out = run_command([self.paths.nvidia_smi, "-i", str(step.index),
                           "--query-gpu=mig.mode.current,mig.mode.pending", "--format=csv,noheader"],
                          timeout=self.opts.smi_timeout_s).stdout
        current, pending = mode_query(out)
        if current is not step.mode:
            want = "enabled" if step.mode else "disabled"
            raise HardwareError(f"GPU {step.index}: MIG mode {want} is pending a GPU reset (current "
                                f"{_word(current)}, pending {_word(pending)}); reset the GPU or "
                                "reboot, then run mig apply again")

    # --- gres.conf ----------------------------------------------------------------------------

    def _render(self, node: Node) -> str:
        from gpuslurm.gres.records import plan_gres
        from gpuslurm.gres.render import render_plan

        return render_plan(node, plan_gres(node, self.opts.gres), self.opts.gres, self.opts.gres_template)

    def _gres_summary(self, node: Node) -> str:
        from gpuslurm.gres.records import plan_gres
        from gpuslurm.gres.render import gres_summary

        return gres_summary(plan_gres(node, self.opts.gres))

    def _write_gres(self, node: Node, old_summary: str | None) -> None:
        path = self.opts.gres_conf
        assert path is not None
        write_atomic(path, self._render(node))
        self.say(f"wrote {path}")
        self._scontrol("reconfigure")
        self.say("scontrol reconfigure: done")
        new = self._gres_summary(node)
        if new != old_summary:
            # Slurm counts GRES from slurm.conf too; gpuslurm does not edit the cluster's file.
            self.say(f"slurm.conf: set Gres={new} on NodeName={self.opts.node_name} "
                     f"(it was Gres={old_summary})")


def _word(flag: bool | None) -> str:
    return "unknown" if flag is None else "enabled" if flag else "disabled"
