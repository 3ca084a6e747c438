"""The actions carried out for real: processes killed (or not), a webhook server, a sendmail
stand-in, a syslog socket, the JSON action log, and the monitor surviving failing channels."""

from __future__ import annotations

import http.server
import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import pytest

from gpuslurm.config import ActConfig, ActIdle, ActRogue, Config, PathsConfig
from gpuslurm.errors import InputError
from gpuslurm.hw.live.procfs import ProcIdentity, read_identity, start_time
from gpuslurm.hw.source import load_node
from gpuslurm.samples import Allocation, Cycle, ProcSample, Violation
from gpuslurm.watch.act import Actor

NOBODY = 65534
GPU = load_node("dgx-h100").gpus[1].uuid

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="running a process as nobody needs root")


def config(tmp: Path, **act: Any) -> Config:
    return Config(paths=PathsConfig(state_dir=str(tmp / "state")),
                  act=ActConfig(syslog="", **act))


def as_nobody(script: str) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen(["/bin/sh", "-c", script], user=NOBODY, group=NOBODY, extra_groups=[])
    deadline = time.monotonic() + 5
    while True:  # until the shell has exec'd sleep, so the start time the cycle sees stays true
        ident = read_identity(proc.pid)
        if isinstance(ident, ProcIdentity) and ident.comm == "sleep":
            return proc
        assert time.monotonic() < deadline, "the process never started"
        time.sleep(0.01)


@pytest.fixture
def procs() -> Iterator[list[subprocess.Popen[bytes]]]:
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for p in started:
        if p.poll() is None:
            p.kill()
        p.wait()


def cycle_with(pid: int, user: str = "nobody", ts: float = 1000.0,
               started: float | None = None) -> tuple[Cycle, Violation]:
    ident = read_identity(pid)
    assert isinstance(ident, ProcIdentity)
    when = start_time(ident.start_ticks) if started is None else started
    sample = ProcSample(ts, GPU, pid, name="sleep", uid=NOBODY, user=user, started=when)
    v = Violation("rogue", "n1", user, None, pid, "sleep", GPU, ts, 0.0, f"sleep (PID {pid}) on {GPU}",
                  "critical")
    return Cycle(ts, "n1", (), (sample,), ()), v


def records(cfg: Config) -> list[dict[str, Any]]:
    path = Path(cfg.paths.state_dir) / "actions.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


@needs_root
def test_a_rogue_process_of_nobody_is_killed_when_enabled(tmp_path: Path, procs: list[Any]) -> None:
    p = as_nobody("exec /bin/sleep 300")
    procs.append(p)
    cfg = config(tmp_path, dry_run=False, rogue=ActRogue(kill=True, kill_grace_s=5))
    cycle, v = cycle_with(p.pid)
    problems = Actor(cfg, "n1").act(cycle, [v])
    assert problems == ()
    assert p.wait(timeout=5) == -15  # SIGTERM was enough
    kill = [r for r in records(cfg) if r["action"] == "kill"]
    assert [(r["outcome"], r["dry_run"], r["violation"]["pid"]) for r in kill] == \
        [("exited after SIGTERM", False, p.pid)]


@needs_root
def test_dry_run_leaves_it_alone_and_says_would_kill(tmp_path: Path, procs: list[Any]) -> None:
    p = as_nobody("exec /bin/sleep 300")
    procs.append(p)
    cfg = config(tmp_path, rogue=ActRogue(kill=True, kill_grace_s=0))  # dry_run is the default
    actor = Actor(cfg, "n1")
    for t in (1000.0, 1010.0):
        cycle, v = cycle_with(p.pid, ts=t)
        assert actor.act(cycle, [v._replace(start=1000.0)]) == ()
    time.sleep(0.2)
    assert p.poll() is None
    kill = [r for r in records(cfg) if r["action"] == "kill"]
    assert len(kill) == 1 and kill[0]["dry_run"] and kill[0]["outcome"].startswith("would kill (dry run)")


@needs_root
def test_a_sigterm_ignoring_process_is_sigkilled(tmp_path: Path, procs: list[Any]) -> None:
    p = as_nobody("trap '' TERM; exec /bin/sleep 300")  # an ignored signal stays ignored across exec
    procs.append(p)
    cfg = config(tmp_path, dry_run=False, rogue=ActRogue(kill=True, kill_grace_s=0.5))
    cycle, v = cycle_with(p.pid)
    t0 = time.monotonic()
    assert Actor(cfg, "n1").act(cycle, [v]) == ()
    assert time.monotonic() - t0 >= 0.45  # it waited out the grace
    assert p.wait(timeout=5) == -9
    assert [r["outcome"] for r in records(cfg) if r["action"] == "kill"] == ["killed with SIGKILL"]


@needs_root
def test_real_uid_root_and_a_reused_pid_are_never_signalled(tmp_path: Path, procs: list[Any]) -> None:
    mine = subprocess.Popen(["/bin/sleep", "300"])  # root's, whatever the violation says
    procs.append(mine)
    other = as_nobody("exec /bin/sleep 300")
    procs.append(other)
    cfg = config(tmp_path, dry_run=False, rogue=ActRogue(kill=True, kill_grace_s=0))
    actor = Actor(cfg, "n1")
    time.sleep(0.05)
    c1, v1 = cycle_with(mine.pid, user="alice")
    c2, v2 = cycle_with(other.pid, started=time.time() - 3600)  # the cycle saw an older process
    actor.act(c1._replace(procs=c1.procs + c2.procs), [v1, v2])
    time.sleep(0.2)
    assert mine.poll() is None and other.poll() is None
    outcomes = {r["violation"]["pid"]: r["outcome"] for r in records(cfg) if r["action"] == "kill"}
    assert outcomes == {mine.pid: "not killed: it runs as root (kill_root = false)",
                        other.pid: "not killed: the PID now names another process"}


@needs_root
def test_exempt_users_are_checked_against_the_real_uid(tmp_path: Path, procs: list[Any]) -> None:
    p = as_nobody("exec /bin/sleep 300")
    procs.append(p)
    cfg = config(tmp_path, dry_run=False, exempt_users=("nobody",), rogue=ActRogue(kill=True))
    cycle, v = cycle_with(p.pid, user="mallory")  # the detector's name for it is not trusted
    Actor(cfg, "n1").act(cycle, [v])
    assert p.poll() is None
    assert [r["outcome"] for r in records(cfg) if r["action"] == "kill"] == \
        ["not killed: nobody is in exempt_users"]


class Hook(http.server.BaseHTTPRequestHandler):
    received: ClassVar[list[dict[str, Any]]] = []
    status = 200

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        type(self).received.append({"type": self.headers["Content-Type"], "doc": json.loads(body)})
        self.send_response(type(self).status)
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def webhook() -> Iterator[tuple[str, type[Hook]]]:
    handler = type("H", (Hook,), {"received": [], "status": 200})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/hook", handler
    server.shutdown()
    server.server_close()


def test_webhook_receives_json_once_per_violation_per_period(tmp_path: Path,
                                                             webhook: tuple[str, type[Hook]]) -> None:
    url, handler = webhook
    cfg = config(tmp_path, webhook=url, alert_interval_s=60)
    actor = Actor(cfg, "n1")
    v = Violation("rogue", "n1", "alice", "7", 4242, "python", GPU, 100.0, 0.0, "python on a GPU", "critical")
    for t in (100.0, 110.0, 120.0, 170.0):
        assert actor.act(Cycle(t, "n1", (), (), ()), [v]) == ()
    assert len(handler.received) == 2
    first = handler.received[0]
    assert first["type"] == "application/json"
    assert first["doc"]["violation"]["user"] == "alice" and first["doc"]["violation"]["pid"] == 4242
    assert (first["doc"]["action"], first["doc"]["event"]) == ("alert", "new")
    assert handler.received[1]["doc"]["event"] == "ongoing"


def test_a_failing_webhook_is_a_problem_not_a_crash_and_not_retried_every_cycle(
        tmp_path: Path, webhook: tuple[str, type[Hook]]) -> None:
    url, handler = webhook
    handler.status = 500
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed = f"http://127.0.0.1:{s.getsockname()[1]}/"  # nothing listens once closed
    v = Violation("idle", "n1", "bob", "12", None, None, GPU, 0.0, 0.0, "idle")
    for target, why in ((url, "HTTP 500"), (closed, "cannot post")):
        warned: list[str] = []
        actor = Actor(config(tmp_path, webhook=target, alert_interval_s=3600), "n1", warn=warned.append)
        problems = actor.act(Cycle(1.0, "n1", (), (), ()), [v])
        assert [(p.kind, p.subject) for p in problems] == [("action", "job 12")]
        assert why in problems[0].detail and warned
        assert actor.act(Cycle(2.0, "n1", (), (), ()), [v]) == ()  # the period holds after a failure
    assert len(handler.received) == 1


def sendmail_standin(tmp: Path, exit_code: int = 0) -> tuple[Path, Path]:
    out = tmp / "mail.log"
    script = tmp / "sendmail"
    script.write_text(f'#!/bin/sh\necho "ARGS $*" >> {out}\ncat >> {out}\necho "--END--" >> {out}\n'
                      f"exit {exit_code}\n")
    script.chmod(0o755)
    return script, out


def test_sendmail_gets_the_alert_for_admins_and_the_user(tmp_path: Path) -> None:
    script, out = sendmail_standin(tmp_path)
    cfg = config(tmp_path, mail_to=("hpc@example.org",), mail_from="gpuslurm@n1", user_domain="example.org",
                 rogue=ActRogue(alert_user=True))
    cfg = cfg._replace(paths=cfg.paths._replace(sendmail=str(script)))
    v = Violation("rogue", "n1", "alice", "7", 4242, "python", GPU, 100.0, 30.0, "python (PID 4242) on a GPU",
                  "critical")
    assert Actor(cfg, "n1").act(Cycle(100.0, "n1", (), (), ()), [v]) == ()
    mail = out.read_text()
    assert mail.startswith("ARGS -t -oi\n")
    assert "To: hpc@example.org, alice@example.org\n" in mail and "From: gpuslurm@n1\n" in mail
    assert "Subject: gpuslurm: rogue on n1: alice job 7\n" in mail
    assert "python (PID 4242) on a GPU" in mail
    alerts = [r for r in records(cfg) if r["action"] == "alert"]
    assert alerts[0]["outcome"] == "mailed hpc@example.org, alice@example.org"


def test_a_failing_or_hanging_sendmail_is_a_problem(tmp_path: Path) -> None:
    script, _ = sendmail_standin(tmp_path, exit_code=75)
    hang = tmp_path / "hang"
    hang.write_text("#!/bin/sh\nexec /bin/sleep 30\n")
    hang.chmod(0o755)
    v = Violation("rogue", "n1", "alice", "7", 4242, "python", GPU, 100.0, 30.0, "e", "critical")
    for prog, why in ((script, "exited 75"), (hang, "timed out")):
        cfg = config(tmp_path, mail_to=("hpc@example.org",), timeout_s=0.5)
        cfg = cfg._replace(paths=cfg.paths._replace(sendmail=str(prog)))
        t0 = time.monotonic()
        problems = Actor(cfg, "n1").act(Cycle(1.0, "n1", (), (), ()), [v])
        assert time.monotonic() - t0 < 5
        assert len(problems) == 1 and why in problems[0].detail, problems


def test_syslog_line_per_new_violation_and_a_missing_socket_is_one_problem(tmp_path: Path) -> None:
    path = str(tmp_path / "log.sock")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(path)
    sock.settimeout(2)
    cfg = config(tmp_path)._replace(act=ActConfig(syslog=path, log_interval_s=5))
    actor = Actor(cfg, "n1")
    v = Violation("rogue", "n1", "alice", "7", 4242, "python", GPU, 100.0, 0.0, "python on a GPU", "critical")
    try:
        for t in (100.0, 101.0, 110.0):  # new, nothing, ongoing: one syslog line only
            assert actor.act(Cycle(t, "n1", (), (), ()), [v]) == ()
        line = sock.recv(9000).decode()
        assert line == f"<28>gpuslurm-monitor[{os.getpid()}]: rogue violation on n1: python on a GPU"
        sock.settimeout(0.2)
        with pytest.raises(TimeoutError):
            sock.recv(9000)
    finally:
        sock.close()
    os.unlink(path)
    other = v._replace(pid=4243)
    p1 = actor.act(Cycle(120.0, "n1", (), (), ()), [v, other])
    p2 = actor.act(Cycle(130.0, "n1", (), (), ()), [v, other._replace(pid=4244)])
    assert [p.subject for p in p1] == [path] and p2 == ()
    events = [(r["event"], r["violation"]["pid"]) for r in records(cfg) if r["action"] == "log"]
    assert events == [("new", 4242), ("ongoing", 4242), ("ongoing", 4242), ("new", 4243),
                      ("ongoing", 4242), ("new", 4244), ("ended", 4243)]


def test_idle_warnings_then_dry_run_scancel_is_only_said(tmp_path: Path) -> None:
    script, out = sendmail_standin(tmp_path)
    cfg = config(tmp_path, mail_to=("hpc@example.org",),
                 idle=ActIdle(scancel=True, warnings=2, warning_interval_s=10, alert_user=True))
    cfg = cfg._replace(paths=cfg.paths._replace(sendmail=str(script), scancel="/nonexistent/scancel"))
    actor = Actor(cfg, "n1")
    v = Violation("idle", "n1", "bob", "12", None, None, GPU, 0.0, 0.0, "job 12 idle")
    alloc = Allocation("12", "bob", 1000, (GPU,), 0.0)
    for t in range(0, 50, 5):
        assert actor.act(Cycle(float(t), "n1", (), (), (alloc,)), [v]) == ()
    acts = [(r["action"], r["outcome"].split(";")[0]) for r in records(cfg) if r["action"] != "log"]
    assert acts == [("warn", "mailed hpc@example.org"), ("warn", "mailed hpc@example.org"),
                    ("scancel", "would scancel (dry run) job 12 after 2 warning(s)")]
    mail = out.read_text()
    assert mail.count("--END--") == 3 and "bob" not in mail.split("To:")[1].splitlines()[0]
    assert "warning 1/2" in mail and "dry run" in mail


def test_an_idle_job_is_cancelled_through_the_scheduler_or_says_there_is_none(tmp_path: Path) -> None:
    """The Actor runs no scancel of its own: the adapter cancels (Slurm's scancel, PBS's qdel)."""
    from tests.helpers.recording_scheduler import RecordingScheduler

    script, _ = sendmail_standin(tmp_path)
    cfg = config(tmp_path, dry_run=False, mail_to=("hpc@example.org",),
                 idle=ActIdle(scancel=True, warnings=1, warning_interval_s=10))
    cfg = cfg._replace(paths=cfg.paths._replace(sendmail=str(script), scancel="/nonexistent/scancel"))
    v = Violation("idle", "n1", "bob", "12", None, None, GPU, 0.0, 0.0, "job 12 idle")
    alloc = Allocation("12", "bob", 1000, (GPU,), 0.0)
    sched = RecordingScheduler()
    actor = Actor(cfg, "n1", scheduler=sched)
    for t in range(0, 30, 5):
        actor.act(Cycle(float(t), "n1", (), (), (alloc,)), [v])
    assert sched.called("cancel_job") == [("12",)]
    done = [r["outcome"] for r in records(cfg) if r["action"] == "scancel"]
    assert done and done[0].startswith("cancelled job 12 ")
    bare = Actor(cfg._replace(paths=cfg.paths._replace(state_dir=str(tmp_path / "bare"))), "n1")
    problems = [p for t in range(0, 30, 5) for p in bare.act(Cycle(float(t), "n1", (), (), (alloc,)), [v])]
    assert any("no scheduler here to cancel job 12" in p.detail for p in problems)


def test_bad_act_settings_are_refused_at_start(tmp_path: Path) -> None:
    for act in (ActConfig(webhook="file:///etc/passwd"), ActConfig(mail_to=("a@b>\nBcc: x",)),
                ActConfig(log_file="relative.jsonl")):
        with pytest.raises(InputError):
            Actor(Config(act=act), "n1")


@needs_root
def test_the_monitor_kills_a_rogue_process_end_to_end(tmp_path: Path, procs: list[Any]) -> None:
    """``gpuslurm monitor --once``: a replayed GPU process of nobody, in no job, is killed."""
    p = as_nobody("exec /bin/sleep 300")
    procs.append(p)
    scenario = tmp_path / "scenario.json"
    scenario.write_text(json.dumps({"procs": [{"pid": p.pid, "gpu": GPU, "mem_mib": 100, "sm": 50}]}))
    conf = tmp_path / "gpuslurm.toml"
    conf.write_text(f'[paths]\nrun_dir = "{tmp_path / "run"}"\nstate_dir = "{tmp_path / "state"}"\n'
                    f'violations_dir = "{tmp_path / "violations"}"\nsqueue = "{tmp_path / "no-squeue"}"\n'
                    f'[act]\ndry_run = false\nsyslog = ""\n[act.rogue]\nkill = true\nkill_grace_s = 2\n')
    env = {**os.environ, "GPUSLURM_CONFIG": str(conf), "GPUSLURM_SCENARIO": str(scenario),
           "GPUSLURM_CAPTURE": "dgx-h100"}
    out = subprocess.run([sys.executable, "-m", "gpuslurm", "monitor", "--once", "--db",
                          str(tmp_path / "state" / "monitor.db")], env=env, capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    assert p.wait(timeout=5) == -15
    log = [json.loads(line) for line in (tmp_path / "state" / "actions.jsonl").read_text().splitlines()]
    assert [(r["action"], r["event"]) for r in log] == [("log", "new"), ("alert", "new"), ("kill", "")]
    assert log[2]["outcome"] == "exited after SIGTERM" and log[2]["violation"]["user"] == "nobody"
