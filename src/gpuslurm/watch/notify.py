"""End-of-job messages (``[notify]``, docs/notify.md): when the monitor sees a job's allocation end
(the cycle that writes the job's last ``jobstats`` file), it computes the job's figures from its
store and, for a job below the site's efficiency, queues one message to the job's user.

Who gets it: the name of the job's uid (the passwd database, never the name a job reports) at
``mail_domain``, or the address ``addresses`` gives that name. At most ``per_user_max`` messages
per uid in ``per_user_window_s``, and one per job, kept in a root-only file so a restart resets
nothing.

Sending is never the monitor loop's: a bounded queue feeds one sender thread, which asks the
scheduler for the job's name and comment, renders the templates (report/notify_render.py) and
runs ``sendmail -t -oi`` (runner.py, with a timeout) and/or POSTs the webhook (with a timeout). A
full queue drops the message; every failure is one line through ``warn``, and never reaches the
monitor's sampling.
"""

from __future__ import annotations

import json
import os
import pwd
import queue
import re
import stat
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, NamedTuple

from gpuslurm.errors import GpuslurmError, InputError
from gpuslurm.jobid import valid_job_id
from gpuslurm.report.jobstats import JobStats, Settings, compute
from gpuslurm.report.notify_render import (
    MAIL_TEMPLATE,
    JobText,
    Rule,
    check_templates,
    context,
    render_mail,
    render_webhook,
    wants_message,
)
from gpuslurm.runner import run_command
from gpuslurm.safedir import read_private_file, read_regular_text, write_private_file
from gpuslurm.samples import Cycle

if TYPE_CHECKING:
    from gpuslurm.config import Config
    from gpuslurm.state.store import Store

Warn = Callable[[str], None]
JobTextFn = Callable[[str], JobText]  # the scheduler's name and comment of a job (may be slow)

SENT_FILE = "notify-sent.json"
MAX_SENT_BYTES = 4 << 20
MAX_TEMPLATE_BYTES = 256 * 1024
MAX_TRACKED = 100_000  # jobs seen running, and jobs already told: bounded
# an address a header can carry whole: no space, comma, angle bracket, quote or line break
ADDRESS = re.compile(r"[A-Za-z0-9._%+=-]{1,64}@[A-Za-z0-9-]{1,63}(\.[A-Za-z0-9-]{1,63})*")
_HOST = re.compile(r"[^A-Za-z0-9._-]")


class Message(NamedTuple):
    """One queued message: the job's figures, and who gets it."""

    stats: JobStats
    address: str | None  # None: no mail for this user (no domain, no entry in addresses)


class SentLog:
    """Which uids were sent how many messages when (and for which jobs), kept in a root-only file."""

    def __init__(self, state_dir: str, most: int, window_s: float, warn: Warn) -> None:
        self.state_dir = state_dir
        self.most = most
        self.window_s = window_s
        self.warn = warn
        self.sent: list[tuple[int, float, str]] = []  # (uid, ts, job)
        try:
            data = read_private_file(state_dir, SENT_FILE, MAX_SENT_BYTES)
            if data is not None:
                self.sent = [(int(u), float(t), str(j)) for u, t, j in json.loads(data)["sent"]]
        except (GpuslurmError, OSError, ValueError, KeyError, TypeError, ArithmeticError) as exc:
            warn(f"[notify] starts a new count of messages sent: {os.path.join(state_dir, SENT_FILE)}: {exc}")

    def allow(self, uid: int, job: str, now: float) -> bool:
        """Whether ``uid`` may get one more message now (for a job not told yet); if so, count it."""
        self.sent = [s for s in self.sent if now - s[1] < self.window_s]
        if any(j == job for _, _, j in self.sent) or sum(u == uid for u, _, _ in self.sent) >= self.most:
            return False
        self.sent = [*self.sent[-(MAX_TRACKED - 1):], (uid, now, job)]  # the file stays under its bound
        try:
            write_private_file(self.state_dir, SENT_FILE, json.dumps({"sent": self.sent}).encode())
        except (GpuslurmError, OSError) as exc:
            self.warn(f"[notify] cannot keep the count of messages sent: {exc}")
        return True


class Sender:
    """One thread sending queued messages; :meth:`submit` never blocks the monitor."""

    def __init__(self, cfg: Config, checked: Checked, job_text: JobTextFn | None, warn: Warn) -> None:
        self.cfg = cfg
        self.mail_template, self.webhook_template, self.url = checked
        self.job_text = job_text
        self.warn = warn
        self.queue: queue.Queue[Message | None] = queue.Queue(maxsize=cfg.notify.queue)
        self.thread = threading.Thread(target=self._run, name="gpuslurm-notify", daemon=True)
        self.thread.start()

    def submit(self, message: Message) -> bool:
        try:
            self.queue.put_nowait(message)
            return True
        except queue.Full:
            self.warn(f"[notify] job {message.stats.job.job_id}: not told, {self.cfg.notify.queue} "
                      "messages are already waiting")
            return False

    def close(self, wait_s: float) -> None:
        """Let the thread send what is queued, for at most ``wait_s``; say what was not sent."""
        try:
            self.queue.put(None, timeout=wait_s)
        except queue.Full:
            pass
        self.thread.join(wait_s)
        if self.thread.is_alive():
            self.warn(f"[notify] stopped with about {self.queue.qsize()} message(s) not sent")

    def _run(self) -> None:
        while (message := self.queue.get()) is not None:
            try:
                self.send(message)
            except Exception as exc:  # a bug in one message never ends the thread
                self.warn(f"[notify] job {message.stats.job.job_id}: {type(exc).__name__}: {exc}")

    def send(self, message: Message) -> None:
        n = self.cfg.notify
        job = message.stats.job.job_id
        text = JobText()
        if self.job_text is not None:
            try:
                text = self.job_text(job)
            except (GpuslurmError, OSError) as exc:
                self.warn(f"[notify] job {job}: its name and comment are not known: {exc}")
        if "mail" in n.channels and message.address is not None:
            try:
                self._mail(message, text)
            except (GpuslurmError, OSError) as exc:
                self.warn(f"[notify] job {job}: mail to {message.address} failed: {exc}")
        if "webhook" in n.channels and self.webhook_template is not None:
            try:
                self._post(message, text)
            except (GpuslurmError, OSError) as exc:
                self.warn(f"[notify] job {job}: webhook failed: {exc}")

    def _mail(self, message: Message, text: JobText) -> None:
        """``sendmail -t -oi``: headers of the monitor's own making; the user's text in the body only."""
        n = self.cfg.notify
        j = message.stats.job
        assert message.address is not None and ADDRESS.fullmatch(message.address)
        head = [f"To: {message.address}",
                f"Subject: GPU use of your job {j.job_id} on {_HOST.sub('?', j.node)[:64]}",
                "Content-Type: text/plain; charset=utf-8", "Auto-Submitted: auto-generated"]
        if n.mail_from:
            head.insert(0, f"From: {n.mail_from}")
        body = render_mail(self.mail_template or MAIL_TEMPLATE, context(message.stats, text, webhook=False))
        run_command([self.cfg.paths.sendmail, "-t", "-oi"], timeout=n.timeout_s,
                    input_text="\n".join(head) + "\n\n" + body.rstrip("\n") + "\n")

    def _post(self, message: Message, text: JobText) -> None:
        import urllib.error  # urllib.request costs the monitor ~0.1 s: only with a webhook
        import urllib.request

        n = self.cfg.notify
        assert self.webhook_template is not None
        body = render_webhook(self.webhook_template, context(message.stats, text, webhook=True))
        req = urllib.request.Request(self.url, data=body, method="POST",  # noqa: S310 - scheme checked
                                     headers={"Content-Type": "application/json",
                                              "User-Agent": "gpuslurm-monitor"})
        where = site_of(self.url)  # the rest of a Slack or Teams URL is its secret: never logged
        try:
            with urllib.request.urlopen(req, timeout=n.timeout_s) as resp:  # noqa: S310 - scheme checked
                resp.read(65536)
        except urllib.error.HTTPError as exc:
            raise InputError(f"HTTP {exc.code} {exc.reason}", source=where) from None
        except (urllib.error.URLError, TimeoutError, OSError) as exc:
            raise InputError(f"cannot post: {getattr(exc, 'reason', exc)}", source=where) from None


class Notifier:
    """Call with each stored cycle (beside :class:`~gpuslurm.watch.jobfiles.JobFiles`)."""

    def __init__(self, cfg: Config, store: Store, settings: Settings, sender: Sender,
                 sent: SentLog, warn: Warn,
                 uid_name: Callable[[int], str] = lambda uid: pwd.getpwuid(uid).pw_name) -> None:
        n = cfg.notify
        self.cfg = cfg
        self.store = store
        self.settings = settings
        self.rule = Rule(n.verdicts, n.below_util_pct, n.min_job_s)
        self.sender = sender
        self.sent = sent
        self.warn = warn
        self.uid_name = uid_name
        self._running: set[str] = set()

    def __call__(self, cycle: Cycle) -> None:
        current = {a.job_id for a in cycle.allocations}
        ended = sorted(self._running - current)
        self._running = current if len(current) <= MAX_TRACKED else set()
        for job in ended:
            try:
                self._ended(job, cycle.ts)
            except (GpuslurmError, OSError) as exc:
                self.warn(f"[notify] job {job}: {exc}")

    def _ended(self, job: str, now: float) -> None:
        if not valid_job_id(job):
            return
        record = self.store.job(job)
        if record is None:
            return
        st = compute(record, self.settings, running=False)
        if not wants_message(st, self.rule):
            return
        address = self.address(record.uid)
        if not self.sent.allow(record.uid, job, now):
            self.warn(f"[notify] job {job}: not told: uid {record.uid} already had "
                      f"{self.cfg.notify.per_user_max} message(s) in the last "
                      f"{self.cfg.notify.per_user_window_s:g} s, or this job's")
            return
        self.sender.submit(Message(st, address))

    def address(self, uid: int) -> str | None:
        """The mail address of ``uid``'s user: by the passwd name of the uid, never a job's text."""
        n = self.cfg.notify
        if "mail" not in n.channels:
            return None
        try:
            name = self.uid_name(uid)
        except KeyError:
            self.warn(f"[notify] uid {uid} has no user name here: no mail")
            return None
        addr = dict(n.addresses).get(name) or (f"{name}@{n.mail_domain}" if n.mail_domain else None)
        if addr is not None and not ADDRESS.fullmatch(addr):
            self.warn(f"[notify] uid {uid}: {addr[:80]!r} is not a mail address: no mail")
            return None
        return addr

    def close(self) -> None:
        self.sender.close(2 * self.cfg.notify.timeout_s + 1)


def site_of(url: str) -> str:
    """``scheme://host[:port]/…`` of a webhook URL: what a log line may show of it."""
    scheme, _, rest = url.partition("://")
    return f"{scheme}://{rest.split('/', 1)[0].rpartition('@')[2]}/…"


class Checked(NamedTuple):
    mail_template: str | None  # None: the built-in text
    webhook_template: str | None  # None: no webhook
    url: str


def check_notify_config(cfg: Config) -> Checked:
    """The templates' text and the webhook's URL; InputError (exit 2) for a setting that cannot work."""
    n = cfg.notify
    if n.mail_from and not ADDRESS.fullmatch(n.mail_from):
        raise InputError(f"mail_from is not a mail address: {n.mail_from!r}", source="[notify]")
    for user, addr in n.addresses:
        if not ADDRESS.fullmatch(addr):
            raise InputError(f"addresses: {user!r} = {addr!r} is not a mail address", source="[notify]")
    if n.mail_domain and not re.fullmatch(r"[A-Za-z0-9-]{1,63}(\.[A-Za-z0-9-]{1,63})*", n.mail_domain):
        raise InputError(f"mail_domain is not a domain: {n.mail_domain!r}", source="[notify]")
    if "mail" in n.channels and not n.mail_domain and not n.addresses:
        raise InputError("channel mail needs mail_domain or addresses", source="[notify]")
    mail = _template(n.mail_template, "mail_template") if n.mail_template else None
    webhook = None
    url = ""
    if "webhook" in n.channels:
        if bool(n.webhook_url) == bool(n.webhook_url_file):
            raise InputError("channel webhook needs one of webhook_url and webhook_url_file",
                             source="[notify]")
        url = n.webhook_url or _secret_url(n.webhook_url_file)
        odd = any(c.isspace() or not c.isprintable() for c in url)
        if odd or not url.startswith(("http://", "https://")):
            raise InputError(f"the webhook URL must be an http:// or https:// URL, not {url[:8]!r}…",
                             source="[notify]")
        if not n.webhook_template:
            raise InputError("channel webhook needs webhook_template", source="[notify]")
        webhook = _template(n.webhook_template, "webhook_template")
    check_templates([(t, s, w) for t, s, w in ((mail, n.mail_template, False),
                                               (webhook, n.webhook_template, True)) if t is not None])
    return Checked(mail, webhook, url)


def _secret_url(path: str) -> str:
    """The URL in ``webhook_url_file``: a regular file of root's (ours) that no one else may read."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        raise InputError(f"webhook_url_file: cannot read: {exc.strerror}", source=path) from None
    with os.fdopen(fd, "rb") as fh:
        st = os.fstat(fh.fileno())
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o077:
            raise InputError("webhook_url_file must be a file of the monitor's user that no one else "
                             "may read or write (chmod 600)", source=path)
        data = fh.read(4097)
    try:
        text = data.decode("utf-8").strip()
    except UnicodeDecodeError:
        text = ""
    if not text or len(data) > 4096 or "\n" in text:
        raise InputError("webhook_url_file must hold one URL", source=path)
    return text


def _template(path: str, key: str) -> str:
    try:
        return read_regular_text(path, MAX_TEMPLATE_BYTES)
    except (OSError, ValueError) as exc:
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise InputError(f"{key}: cannot read: {why}", source=path) from None


def notifier_for(cfg: Config, store: Store, settings: Settings, *, job_text: JobTextFn | None,
                 warn: Warn) -> Notifier | None:
    """The configured notifier (its sender thread started), or None when ``[notify]`` is off."""
    if not cfg.notify.enabled:
        return None
    templates = check_notify_config(cfg)
    sent = SentLog(cfg.paths.state_dir, cfg.notify.per_user_max, cfg.notify.per_user_window_s, warn)
    return Notifier(cfg, store, settings, Sender(cfg, templates, job_text, warn), sent, warn)
