"""The monitor's actions: log, alert, kill a rogue process, scancel an idle job (see docs/monitor.md).

:class:`gpuslurm.policy.act.Planner` decides; this module does, and never raises: whatever fails
(a mail, a webhook, a signal, ``scancel``) comes back as an ``action`` :class:`ScanProblem` that the
monitor stores with its next cycle. Every step taken is also one record of the local JSON-lines
action log, so what was done (or, in a dry run, would have been) can be audited on the node.
"""

from __future__ import annotations

import json
import os
import pwd
import re
import socket
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from gpuslurm.config import Config
from gpuslurm.errors import CommandError, GpuslurmError, InputError
from gpuslurm.hw.live.procfs import PROC_ROOT, ProcessProblem, read_process, start_time
from gpuslurm.isolate.kill import SURVIVED, Target, kill_processes  # the epilog's pidfd killing
from gpuslurm.jobid import valid_job_id
from gpuslurm.policy.act import Planner, Step
from gpuslurm.policy.wording import span
from gpuslurm.runner import run_command
from gpuslurm.samples import Cycle, ProcSample, ScanProblem, Violation

if TYPE_CHECKING:
    from gpuslurm.state.scheduler import Scheduler

PROBLEM_KIND = "action"
LOG_NAME = "actions.jsonl"
SYSLOG_PRI = 3 * 8 + 4  # LOG_DAEMON, LOG_WARNING
START_SLACK_S = 0.5  # the process's start time must match the one the cycle saw
_ADDRESS = re.compile(r"[^\s<>,;:\"\\()\[\]]+(@[A-Za-z0-9.-]+)?")


def action_log_path(cfg: Config) -> str:
    """The JSON-lines action log: ``[act] log_file``, else ``<state_dir>/actions.jsonl``."""
    return cfg.act.log_file or os.path.join(cfg.paths.state_dir, LOG_NAME)


def check_act_config(cfg: Config) -> None:
    """InputError for an [act] setting that cannot work (checked when the monitor starts)."""
    a = cfg.act
    for key, path in (("log_file", a.log_file), ("syslog", a.syslog)):
        if path and not path.startswith("/"):
            raise InputError(f"{key} in [act] must be an absolute path, not {path!r}", source="act")
    if a.webhook and not a.webhook.startswith(("http://", "https://")):
        raise InputError(f"webhook in [act] must be an http:// or https:// URL, not {a.webhook!r}",
                         source="act")
    for addr in (*a.mail_to, a.mail_from):
        if addr and not _ADDRESS.fullmatch(addr):
            raise InputError(f"not a mail address in [act]: {addr!r}", source="act")
    if a.user_domain and not re.fullmatch(r"[A-Za-z0-9.-]+", a.user_domain):
        raise InputError(f"user_domain in [act] is not a domain: {a.user_domain!r}", source="act")


class Actor:
    """Carries out the planner's steps for one node; :meth:`act` runs once per cycle."""

    def __init__(self, cfg: Config, node: str, *, proc_root: str = PROC_ROOT,
                 warn: Callable[[str], None] = lambda message: None,
                 scheduler: Scheduler | None = None) -> None:
        check_act_config(cfg)
        self.cfg = cfg
        self.node = node
        self.scheduler = scheduler  # cancels idle jobs (none: a cancel fails, and says so)
        self.proc_root = proc_root
        self.warn = warn
        self.planner = Planner(cfg.act)
        self.log_path = action_log_path(cfg)
        self._syslog_broken = False  # one problem per outage, not one per line

    def act(self, cycle: Cycle, violations: Sequence[Violation]) -> tuple[ScanProblem, ...]:
        """Plan and carry out this cycle's steps; what failed, as problems."""
        held = {a.job_id: a.uuids for a in cycle.allocations}
        problems: list[ScanProblem] = []
        records: list[dict[str, Any]] = []
        for step in self.planner.plan(cycle.ts, violations, held):
            try:
                outcome = self._do(step, cycle)
            except Exception as exc:  # one step's failure (or a bug) must not stop the others
                outcome = f"failed: {exc}" if isinstance(exc, GpuslurmError | OSError) \
                    else f"failed: internal error: {type(exc).__name__}: {exc}"
                self.planner.failed(step)
            if "failed" in outcome or outcome.startswith(("not signalled", SURVIVED)):
                problems.append(ScanProblem(cycle.ts, PROBLEM_KIND, _subject(step),
                                            f"{step.action}: {outcome}"))
            records.append(_record(cycle.ts, self.node, step, outcome))
            if step.action in ("kill", "scancel") or (step.action == "log" and step.event == "new"):
                problems += self._syslog(cycle.ts, _syslog_line(step, outcome))
        problems += self._append(cycle.ts, records)
        for p in problems:
            self.warn(f"action failed for {p.subject}: {p.detail}")
        return tuple(problems)

    # --- the steps ---------------------------------------------------------------------------------

    def _do(self, step: Step, cycle: Cycle) -> str:
        if step.action == "log":
            return "logged"
        if step.action == "alert":
            return self._alert(step, _alert_text(step))
        if step.action == "warn":
            return self._alert(step, _warn_text(step, self.cfg))
        if step.action == "kill":
            return self._kill(step, cycle)
        if step.action == "scancel":
            return self._scancel(step)
        raise InputError(f"unknown action {step.action!r}", source="act")

    def _alert(self, step: Step, text: tuple[str, str]) -> str:
        a = self.cfg.act
        subject, body = text
        done: list[str] = []
        failed: list[str] = []
        to = list(a.mail_to)
        if step.notify_user and step.violation.user:
            to.append(f"{step.violation.user}@{a.user_domain}" if a.user_domain else step.violation.user)
        if to:
            try:
                self._mail(to, subject, body)
                done.append(f"mailed {', '.join(to)}")
            except (GpuslurmError, OSError) as exc:
                failed.append(f"mail: {exc}")
        if a.webhook:
            try:
                self._post(step, subject, body)
                done.append("posted")
            except (GpuslurmError, OSError) as exc:
                failed.append(f"webhook: {exc}")
        if failed:
            return "failed: " + "; ".join(failed + done)
        return "; ".join(done) if done else "no alert channel configured"

    def _mail(self, to: Sequence[str], subject: str, body: str) -> None:
        bad = [t for t in to if not _ADDRESS.fullmatch(t)]
        if bad:  # a user name from the passwd database could still break the headers
            raise InputError(f"not a mail address: {bad[0]!r}", source="act")
        head = [f"To: {', '.join(to)}", f"Subject: {_one_line(subject)}",
                "Content-Type: text/plain; charset=utf-8", "Auto-Submitted: auto-generated"]
        if self.cfg.act.mail_from:
            head.insert(0, f"From: {self.cfg.act.mail_from}")
        run_command([self.cfg.paths.sendmail, "-t", "-oi"], timeout=self.cfg.act.timeout_s,
                    input_text="\n".join(head) + "\n\n" + body + "\n")

    def _post(self, step: Step, subject: str, body: str) -> None:
        import urllib.error  # urllib.request costs the monitor ~0.1 s: only with a webhook
        import urllib.request

        doc = {"node": self.node, "action": step.action, "event": step.event, "dry_run": step.dry_run,
               "subject": subject, "text": body, "violation": step.violation._asdict()}
        url = self.cfg.act.webhook  # http(s) only: checked when the actor was made
        req = urllib.request.Request(url, data=json.dumps(doc).encode(), method="POST",  # noqa: S310
                                     headers={"Content-Type": "application/json",
                                              "User-Agent": "gpuslurm-monitor"})
        try:
            with urllib.request.urlopen(req, timeout=self.cfg.act.timeout_s) as resp:  # noqa: S310 - scheme checked
                resp.read(65536)
        except urllib.error.HTTPError as exc:
            raise InputError(f"HTTP {exc.code} {exc.reason}", source=self.cfg.act.webhook) from None
        except (urllib.error.URLError, TimeoutError, OSError) as exc:
            why = getattr(exc, "reason", exc)
            raise InputError(f"cannot post: {why}", source=self.cfg.act.webhook) from None

    def _kill(self, step: Step, cycle: Cycle) -> str:
        v = step.violation
        assert v.pid is not None
        sample = next((p for p in cycle.procs if p.pid == v.pid), None)
        target = self._kill_target(v, sample)
        if isinstance(target, str):
            return target
        if step.dry_run:
            return f"would kill (dry run): PID {v.pid} of {v.user}"
        outcome = kill_processes([Target(v.gpu_uuid or "", v.pid, v.user, target)],
                                 self.cfg.act.rogue.kill_grace_s, self.proc_root)
        return outcome.get(v.pid, "not signalled")

    def _kill_target(self, v: Violation, sample: ProcSample | None) -> int | str:
        """The process's start ticks when it may be signalled; else why not (``not killed: …``)."""
        assert v.pid is not None
        if sample is None or sample.started is None:
            return "not killed: its start time is unknown, so a reused PID cannot be ruled out"
        if v.pid == os.getpid():
            return "not killed: it is the monitor itself"
        facts = read_process(v.pid, self.proc_root)
        if isinstance(facts, ProcessProblem):
            return f"not killed: {facts.detail}"
        if abs(start_time(facts.start_ticks, self.proc_root) - sample.started) > START_SLACK_S:
            return "not killed: the PID now names another process"
        if facts.uid == 0 and not self.cfg.act.rogue.kill_root:
            return "not killed: it runs as root (kill_root = false)"
        try:
            owner = pwd.getpwuid(facts.uid).pw_name
        except KeyError:
            owner = str(facts.uid)
        if owner in self.cfg.act.exempt_users or str(facts.uid) in self.cfg.act.exempt_users:
            return f"not killed: {owner} is in exempt_users"
        return facts.start_ticks

    def _scancel(self, step: Step) -> str:
        job = step.violation.job_id or ""
        if not valid_job_id(job):  # a job id from squeue or a map, never an option
            raise InputError(f"not a job id: {job!r}", source="scancel")
        if step.dry_run:
            done = f"would scancel (dry run) job {job} {step.event}"
        elif self.scheduler is None:
            raise CommandError(f"no scheduler here to cancel job {job} with")
        else:
            self.scheduler.cancel_job(job)
            done = f"cancelled job {job} {step.event}"
        told = self._alert(step, _cancel_text(step))
        return f"{done}; notice: {told}"

    # --- the logs ----------------------------------------------------------------------------------

    def _append(self, now: float, records: Sequence[dict[str, Any]]) -> list[ScanProblem]:
        if not records:
            return []
        data = "".join(json.dumps(r, sort_keys=True, separators=(",", ":")) + "\n" for r in records)
        try:
            os.makedirs(os.path.dirname(self.log_path), mode=0o755, exist_ok=True)
            fd = os.open(self.log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC,
                         0o640)
            try:
                os.write(fd, data.encode())  # one write: whole lines even with a second writer
            finally:
                os.close(fd)
        except OSError as exc:
            return [ScanProblem(now, PROBLEM_KIND, self.log_path,
                                f"log: cannot append {len(records)} record(s): {exc.strerror or exc}")]
        return []

    def _syslog(self, now: float, line: str) -> list[ScanProblem]:
        path = self.cfg.act.syslog
        if not path:
            return []
        msg = f"<{SYSLOG_PRI}>gpuslurm-monitor[{os.getpid()}]: {_one_line(line)}"
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
                s.settimeout(1.0)
                s.sendto(msg.encode("utf-8", "replace")[:8000], path)
        except OSError as exc:
            if self._syslog_broken:
                return []
            self._syslog_broken = True
            return [ScanProblem(now, PROBLEM_KIND, path, f"syslog: {exc.strerror or exc}")]
        self._syslog_broken = False
        return []


def _subject(step: Step) -> str:
    v = step.violation
    return f"job {v.job_id}" if step.action in ("warn", "scancel") else \
        f"PID {v.pid}" if v.pid is not None else f"job {v.job_id}" if v.job_id else (v.user or v.kind)


def _record(ts: float, node: str, step: Step, outcome: str) -> dict[str, Any]:
    return {"ts": ts, "node": node, "action": step.action, "event": step.event, "dry_run": step.dry_run,
            "outcome": outcome, "violation": step.violation._asdict()}


def _one_line(text: str) -> str:
    return " ".join("".join(c if c.isprintable() else " " for c in text).split())


def _syslog_line(step: Step, outcome: str) -> str:
    v = step.violation
    if step.action == "log":
        return f"{v.kind} violation on {v.node}: {v.evidence}"
    return f"{step.action} {_subject(step)} ({v.kind}, user {v.user}): {outcome}"


def _headline(v: Violation) -> str:
    who = f"{v.user}" if v.user else "unknown user"
    job = f" job {v.job_id}" if v.job_id else ""
    return f"{v.kind} on {v.node}: {who}{job}"


def _alert_text(step: Step) -> tuple[str, str]:
    v = step.violation
    again = " (still going on)" if step.event == "ongoing" else ""
    body = (f"{v.evidence}\n\nnode {v.node}, user {v.user}, job {v.job_id}, PID {v.pid} ({v.process}), "
            f"GPU {v.gpu_uuid}, for {span(v.duration_s)}.")
    return f"gpuslurm: {_headline(v)}{again}", body


def _warn_text(step: Step, cfg: Config) -> tuple[str, str]:
    v = step.violation
    number, _, total = step.event.partition("/")
    left = int(total) - int(number)
    when = span((left + 1) * cfg.act.idle.warning_interval_s)
    dry = " (dry run: it will not really be cancelled)" if step.dry_run else ""
    body = (f"Job {v.job_id} of {v.user} holds GPUs on {v.node} without using them.\n{v.evidence}\n\n"
            f"Warning {step.event}: unless its GPUs get busy, the job will be cancelled in about "
            f"{when}{dry}.")
    return f"gpuslurm: idle job {v.job_id} on {v.node}, warning {step.event}", body


def _cancel_text(step: Step) -> tuple[str, str]:
    v = step.violation
    if step.dry_run:
        return (f"gpuslurm: idle job {v.job_id} on {v.node} would be cancelled (dry run)",
                f"Job {v.job_id} of {v.user} would now be cancelled {step.event}, but [act] dry_run "
                f"is on.\n{v.evidence}")
    return (f"gpuslurm: idle job {v.job_id} on {v.node} was cancelled",
            f"Job {v.job_id} of {v.user} was cancelled {step.event}: its GPUs stayed idle.\n{v.evidence}")
