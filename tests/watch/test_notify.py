"""End-of-job messages (watch/notify.py): sent by the monitor when it sees a job's allocation end,
off its sampling thread, at most so many per user, to the address of the job's uid.

The attacker is the job's user: a job name or comment that writes mail headers (``Bcc:``), a job
whose reported user name is someone else's, jobs ended in a burst to flood an inbox (and the
monitor restarted to reset the count), a slow webhook that would stall the monitor.
The monitor itself runs end to end on a replayed bundle, its webhook received by a real HTTP
server on 127.0.0.1 and its mail by a stand-in sendmail at the configured path.
"""

from __future__ import annotations

import email
import json
import os
import signal
import stat
import threading
import time
from collections.abc import Iterator
from email import policy
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from tests.helpers.recording_scheduler import RecordingScheduler

from gpuslurm.config import Config, MonitorConfig, NotifyConfig, PathsConfig, parse_config
from gpuslurm.errors import InputError
from gpuslurm.hw.source import hardware_source, load_node
from gpuslurm.report.jobstats import Settings
from gpuslurm.report.notify_render import JobText
from gpuslurm.samples import Allocation, Cycle, GpuSample
from gpuslurm.state.jobmap import JobMap, MappedDevice, remove_map, write_map
from gpuslurm.state.store import Store
from gpuslurm.watch.notify import SENT_FILE, SentLog, check_notify_config, notifier_for
from gpuslurm.watch.run import MonitorParts, run_monitor

PACKAGING = Path(__file__).resolve().parents[2] / "packaging" / "notify"
NOBODY = 65534
T0 = 1_700_000_000.0
G0 = "GPU-00000000-aaaa"
HEADERS = "x\nBcc: victim@example.org\nSubject: pay now\n\nforged body"


class Hook(BaseHTTPRequestHandler):
    """Records each POST; holds its answer until ``release`` is set."""

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        self.server.bodies.append((self.headers["Content-Type"], body))  # type: ignore[attr-defined]
        self.server.arrived.set()  # type: ignore[attr-defined]
        self.server.release.wait(120)  # type: ignore[attr-defined]
        self.send_response(200)
        self.end_headers()
        self.wfile.write(b"ok")

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def hook() -> Iterator[ThreadingHTTPServer]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), Hook)
    server.bodies = []  # type: ignore[attr-defined]
    server.arrived = threading.Event()  # type: ignore[attr-defined]
    server.release = threading.Event()  # type: ignore[attr-defined]
    server.release.set()  # type: ignore[attr-defined]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.release.set()  # type: ignore[attr-defined]
    server.shutdown()
    server.server_close()


def fake_sendmail(tmp_path: Path, rc: int = 0) -> tuple[str, Path]:
    """A sendmail that keeps each message it is given (its argv on the first line)."""
    out = tmp_path / "mail"
    out.mkdir(exist_ok=True)
    script = tmp_path / "sendmail"
    script.write_text(f'#!/bin/sh\nf=$(mktemp {out}/m.XXXXXX)\necho "$@" > "$f"\ncat >> "$f"\nexit {rc}\n')
    script.chmod(0o755)
    return str(script), out


def mails(out: Path) -> list[tuple[str, email.message.EmailMessage]]:
    found = []
    for f in sorted(out.iterdir()):
        argv, _, text = f.read_text().partition("\n")
        found.append((argv, email.message_from_string(text, policy=policy.default)))
    return found  # type: ignore[return-value]


def config(tmp_path: Path, sendmail: str, **notify: object) -> Config:
    n = {"enabled": True, "min_job_s": 0.0, "mail_domain": "example.org", "timeout_s": 60.0, **notify}
    return Config(paths=PathsConfig(state_dir=str(tmp_path / "state"), sendmail=sendmail,
                                    run_dir=str(tmp_path / "run"), violations_dir=str(tmp_path / "v")),
                  monitor=MonitorConfig(node_name="n1"), notify=NotifyConfig(**n))  # type: ignore[arg-type]


def idle_job(store: Store, job: str, uid: int, user: str, t0: float) -> list[Cycle]:
    """Ten idle samples of ``job``, then the cycle that sees it gone."""
    cycles = []
    for i in range(10):
        gpu = GpuSample(t0 + 10 * i, G0, util_pct=0.0, mem_used_mib=500.0, mem_total_mib=81559.0,
                        power_w=70.0)
        cycles.append(Cycle(t0 + 10 * i, "n1", (gpu,), (), (Allocation(job, user, uid, (G0,), t0),)))
    cycles.append(Cycle(t0 + 100, "n1", (), (), ()))
    for c in cycles:
        store.write_cycle(c)
    return cycles


def run_jobs(cfg: Config, tmp_path: Path, jobs: list[tuple[str, int, str]], warnings: list[str],
             job_text: JobText | None = None) -> None:
    """Each job idle in turn, seen ending by one notifier; then the notifier's sends are awaited."""
    os.makedirs(cfg.paths.state_dir, exist_ok=True)
    store = Store.open(str(tmp_path / "state" / "m.db"))
    try:
        notifier = notifier_for(cfg, store, Settings(), job_text=lambda job: job_text or JobText(),
                                warn=warnings.append)
        assert notifier is not None
        for k, (job, uid, user) in enumerate(jobs):
            for c in idle_job(store, job, uid, user, T0 + 1000 * k):
                notifier(c)
        notifier.close()
    finally:
        store.close()


def test_the_job_name_and_comment_never_reach_the_mail_headers(tmp_path: Path) -> None:
    """The user's name and comment carry ``\\nBcc:``: the headers are the monitor's own (To the
    uid's user, a fixed subject); their text is in the body, after the blank line."""
    sendmail, out = fake_sendmail(tmp_path)
    warnings: list[str] = []
    run_jobs(config(tmp_path, sendmail), tmp_path, [("41", NOBODY, "nobody")], warnings,
             JobText(HEADERS, HEADERS))
    [(argv, msg)] = mails(out)
    assert argv == "-t -oi"
    assert sorted(msg.keys()) == ["Auto-Submitted", "Content-Type", "Subject", "To"]
    assert msg["To"] == "nobody@example.org" and msg["Subject"] == "GPU use of your job 41 on n1"
    body = msg.get_content()
    assert "Bcc: victim@example.org" in body and "victim" not in str(msg["To"])
    assert warnings == []


def test_the_address_is_the_uids_user_not_the_name_the_job_reports(tmp_path: Path) -> None:
    """A job reporting the user ``root@example.org\\nBcc: x`` (a forged job map or squeue line)
    mails the passwd name of its uid; an address table entry wins over the domain."""
    sendmail, out = fake_sendmail(tmp_path)
    cfg = config(tmp_path, sendmail, addresses=(("nobody", "nobody.here@lab.example.org"),))
    run_jobs(cfg, tmp_path, [("42", NOBODY, "root@example.org\nBcc: x@y")], [])
    [(_, msg)] = mails(out)
    assert msg["To"] == "nobody.here@lab.example.org" and "Bcc" not in msg


def test_at_most_per_user_max_messages_per_user_and_a_restart_does_not_reset_the_count(
        tmp_path: Path) -> None:
    """Five idle jobs in a burst, then three more after a monitor restart: two mails in all, and
    the count is a root-only file."""
    sendmail, out = fake_sendmail(tmp_path)
    cfg = config(tmp_path, sendmail, per_user_max=2, per_user_window_s=7 * 86400.0)
    warnings: list[str] = []
    run_jobs(cfg, tmp_path, [(str(50 + k), NOBODY, "nobody") for k in range(5)], warnings)
    assert len(mails(out)) == 2
    assert sum("not told: uid 65534 already had 2 message(s)" in w for w in warnings) == 3
    run_jobs(cfg, tmp_path, [(str(60 + k), NOBODY, "nobody") for k in range(3)], warnings)
    assert len(mails(out)) == 2
    st = os.lstat(tmp_path / "state" / SENT_FILE)
    assert stat.S_ISREG(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o600 and st.st_uid == os.geteuid()


def test_a_failing_sendmail_is_one_line_and_the_next_job_is_still_told(tmp_path: Path) -> None:
    sendmail, out = fake_sendmail(tmp_path, rc=75)
    warnings: list[str] = []
    run_jobs(config(tmp_path, sendmail), tmp_path, [("43", NOBODY, "nobody"), ("44", 0, "root")],
             warnings)
    assert len(mails(out)) == 2
    failed = [w for w in warnings if "failed" in w]
    assert len(failed) == 2 and all("\n" not in w for w in failed)
    assert failed[0].startswith("[notify] job 43: mail to nobody@example.org failed: sendmail exited 75")


def test_a_slow_webhook_never_holds_the_monitor(tmp_path: Path, hook: ThreadingHTTPServer) -> None:
    """The webhook answers only when the test says so: the cycle that sees the job end returns
    while the POST still waits (it would hang for the whole timeout if sent in the monitor's loop)."""
    secret = tmp_path / "url"  # the URL from a root-only file, as a site keeps a Slack URL
    secret.write_text(f"http://127.0.0.1:{hook.server_address[1]}/hook\n")
    secret.chmod(0o600)
    cfg = config(tmp_path, "/nonexistent/sendmail", channels=("webhook",), webhook_url_file=str(secret),
                 webhook_template=str(PACKAGING / "slack.json.j2"))
    hook.release.clear()  # type: ignore[attr-defined]
    os.makedirs(cfg.paths.state_dir)
    store = Store.open(str(tmp_path / "state" / "m.db"))
    warnings: list[str] = []
    notifier = notifier_for(cfg, store, Settings(), job_text=None, warn=warnings.append)
    assert notifier is not None
    try:
        for c in idle_job(store, "45", NOBODY, "nobody", T0):
            notifier(c)  # the last one queues the message and returns
        assert hook.arrived.wait(60)  # type: ignore[attr-defined]
        assert not hook.release.is_set()  # type: ignore[attr-defined]  # the POST is still held
    finally:
        hook.release.set()  # type: ignore[attr-defined]
        notifier.close()
        store.close()
    [(ctype, body)] = hook.bodies  # type: ignore[attr-defined]
    assert ctype == "application/json" and json.loads(body)["blocks"][0]["type"] == "header"
    assert warnings == []


@pytest.mark.parametrize(("notify", "match"), [
    ({"channels": ("mail",), "mail_domain": ""}, "mail needs mail_domain or addresses"),
    ({"mail_domain": "example.org\nBcc: x"}, "not a domain"),
    ({"addresses": (("a", "a@b\nBcc: c@d"),)}, "not a mail address"),
    ({"mail_from": "x@y, z@w"}, "mail_from is not a mail address"),
    ({"channels": ("webhook",), "webhook_url": "file:///etc/shadow",
      "webhook_template": "/x"}, "http:// or https://"),
    ({"channels": ("webhook",), "webhook_template": "/x"}, "one of webhook_url and webhook_url_file"),
    ({"channels": ("webhook",), "webhook_url": "http://127.0.0.1:1/"}, "needs webhook_template"),
])
def test_a_notify_setting_that_cannot_work_stops_the_monitor_with_one_line(
        tmp_path: Path, notify: dict[str, object], match: str) -> None:
    with pytest.raises(InputError, match=match):
        check_notify_config(config(tmp_path, "/usr/sbin/sendmail", **notify))


def test_a_webhook_template_printing_the_name_raw_stops_the_monitor_at_start(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json.j2"
    bad.write_text('{"text": "{{ job.name }}"}')
    cfg = config(tmp_path, "/usr/sbin/sendmail", channels=("webhook",), webhook_url="http://127.0.0.1:1/",
                 webhook_template=str(bad))
    with pytest.raises(InputError, match="without tojson"):
        check_notify_config(cfg)


def test_notify_is_off_by_default_and_its_keys_are_checked() -> None:
    assert Config().notify.enabled is False
    with pytest.raises(InputError, match="verdicts"):
        parse_config('[notify]\nverdicts = ["bad"]\n')
    with pytest.raises(InputError, match="channels"):
        parse_config('[notify]\nchannels = ["sms"]\n')


DGX = hardware_source("dgx-h100")


def test_the_monitor_tells_the_user_of_an_idle_job_when_it_ends(tmp_path: Path, hook: ThreadingHTTPServer,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """End to end: a real monitor run on the replayed DGX bundle; the job's map is removed after
    three cycles; the cycle that sees it gone sends the Slack body to the local server and the
    mail to the stand-in sendmail, with the job's name as the scheduler gives it."""
    gpu = load_node("dgx-h100").gpus[3].uuid
    sendmail, out = fake_sendmail(tmp_path)
    cfg = config(tmp_path, sendmail, channels=("mail", "webhook"),
                 webhook_url=f"http://127.0.0.1:{hook.server_address[1]}/hook",
                 webhook_template=str(PACKAGING / "slack.json.j2"))
    (tmp_path / "scenario.json").write_text(json.dumps({"gpus": {gpu: {"util": 0}}}))
    monkeypatch.setenv("GPUSLURM_SCENARIO", str(tmp_path / "scenario.json"))
    write_map(JobMap("77", "nobody", NOBODY, (MappedDevice(gpu, 3),), time.time() - 5), cfg.paths.jobs_dir)
    asked: list[tuple[str, float]] = []
    name = 'train "big"\n{{ 7*7 }}\x1b[31m'

    def job_text(timeout: float):  # type: ignore[no-untyped-def]
        def text(job: str) -> JobText:
            asked.append((job, timeout))
            return JobText(name, "see\nBcc: x@y")
        return text

    parts = MonitorParts(scheduler_for=lambda timeout: RecordingScheduler(),
                         publish=lambda directory, node, found: None,
                         comment_text=lambda n, figures: "", job_text=job_text)
    seen: list[Cycle] = []

    def on_cycle(cycle: Cycle) -> None:
        seen.append(cycle)
        if len(seen) == 3:
            remove_map("77", cfg.paths.jobs_dir)
        if len(seen) == 5:
            os.kill(os.getpid(), signal.SIGINT)  # the monitor's own way to stop

    warnings: list[str] = []
    run_monitor(cfg, DGX, parts, interval=0.05, on_cycle=on_cycle, warn=warnings.append)
    assert [bool(c.allocations) for c in seen] == [True, True, True, False, False]
    assert asked == [("77", cfg.monitor.command_timeout_s)]
    [(_, body)] = hook.bodies  # type: ignore[attr-defined]
    doc = json.loads(body)
    assert doc["text"] == "GPU job 77 on n1: idle GPUs"
    fields = doc["blocks"][1]["fields"]
    assert fields[1]["text"] == name and fields[3]["text"] == "nobody"
    [(_, msg)] = mails(out)
    assert msg["To"] == "nobody@example.org" and "Bcc" not in msg
    assert 'Your job 77 ("train "big"\n{{ 7*7 }}?[31m") on n1' in msg.get_content()
    assert not [w for w in warnings if "notify" in w]


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.binary(max_size=300) | st.recursive(
    st.none() | st.booleans() | st.floats() | st.integers() | st.text(max_size=10),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=5), inner, max_size=4),
    max_leaves=20).map(lambda v: json.dumps({"sent": v}).encode()))
@example(data=b'{"sent": [[Infinity, 0, "7"]]}')  # int() of it: OverflowError, once a traceback
@example(data=b'{"sent": [[65534, NaN, "7"], [65534, 1e999, "8"]]}')
def test_any_count_file_is_read_or_started_anew_with_one_line(tmp_path: Path, data: bytes) -> None:
    """The count file is root's, but a crash or a full disk can leave anything in it: the count
    starts anew with one line, or what it holds is used; the monitor never stops on it."""
    state = tmp_path / "state"
    state.mkdir(exist_ok=True)
    (state / SENT_FILE).write_bytes(data)
    (state / SENT_FILE).chmod(0o600)
    warnings: list[str] = []
    sent = SentLog(str(state), 2, 3600.0, warnings.append)
    assert len(warnings) <= 1 and all("\n" not in w for w in warnings)
    assert sent.allow(NOBODY, "new-job", T0) in (True, False)


def test_a_failed_post_names_the_webhook_s_host_never_its_secret_path(tmp_path: Path) -> None:
    cfg = config(tmp_path, "/nonexistent/sendmail", channels=("webhook",),
                 webhook_url="http://user:pw@127.0.0.1:1/services/T0/B0/SECRET",
                 webhook_template=str(PACKAGING / "teams.json.j2"))
    warnings: list[str] = []
    run_jobs(cfg, tmp_path, [("46", NOBODY, "nobody")], warnings)
    [line] = warnings
    assert line.startswith("[notify] job 46: webhook failed: http://127.0.0.1:1/…: cannot post")
    assert "SECRET" not in line and "pw" not in line


def test_a_webhook_url_file_others_could_read_or_swap_is_refused(tmp_path: Path) -> None:
    """The config is readable by every user (pick reads it), so a Slack or Teams URL, which lets
    whoever holds it post to the channel, goes in a file only root reads; one that others can
    read, a symlink, or one not root's stops the monitor with one line."""
    secret = tmp_path / "url"
    secret.write_text("https://hooks.example.org/services/T0/B0/SECRET\n")
    cfg = config(tmp_path, "/usr/sbin/sendmail", channels=("webhook",), webhook_url_file=str(secret),
                 webhook_template=str(PACKAGING / "teams.json.j2"))
    secret.chmod(0o640)
    with pytest.raises(InputError, match="no one else may read") as caught:
        check_notify_config(cfg)
    assert "SECRET" not in str(caught.value)
    secret.chmod(0o600)
    assert check_notify_config(cfg).url == "https://hooks.example.org/services/T0/B0/SECRET"
    link = tmp_path / "link"
    link.symlink_to(secret)
    with pytest.raises(InputError, match="cannot read"):
        check_notify_config(cfg._replace(notify=cfg.notify._replace(webhook_url_file=str(link))))
    os.chown(secret, NOBODY, NOBODY)
    with pytest.raises(InputError, match="no one else may read"):
        check_notify_config(cfg)
