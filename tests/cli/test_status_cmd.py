"""``gpuslurm status`` and ``watch`` as whole processes on a replayed node with real processes.

The GPU activity is a replay scenario; the process on a GPU is a real ``sleep`` (read through
/proc like the monitor does), the job map is written by the prolog's writer, and the monitor's
store is a real SQLite store holding an idle finding.
"""

from __future__ import annotations

import fcntl
import io
import json
import os
import pty
import select
import signal
import struct
import subprocess
import sys
import termios
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuslurm.cli import status_cmd
from gpuslurm.hw.source import load_node
from gpuslurm.samples import Allocation, Cycle, GpuSample, Violation
from gpuslurm.state.jobmap import JobMap, MappedDevice, write_map
from gpuslurm.state.store import Store

NODE = load_node("dgx-h100")
U = [g.uuid for g in sorted(NODE.gpus, key=lambda g: g.index)]
HOST = NODE.hostname  # a replay is of the captured node, whatever [monitor] node_name names this machine


class Site:
    def __init__(self, root: Path, pid: int) -> None:
        self.root = root
        self.db = root / "state" / "monitor.db"
        (root / "state").mkdir()
        self.config = root / "gpuslurm.toml"
        self.config.write_text(
            f'[paths]\nrun_dir = "{root / "run"}"\nstate_dir = "{root / "state"}"\n'
            f'squeue = "{root / "no-squeue"}"\n[monitor]\nnode_name = "testnode"\n')
        self.scenario = root / "scenario.json"
        gpus = {U[0]: {"util": 97, "mem_mib": 5000}, U[1]: {"util": 0}, U[2]: {"util": 1}}
        procs = [{"pid": pid, "gpu": U[0], "mem_mib": 5000, "sm": 97}]
        self.scenario.write_text(json.dumps({"gpus": gpus, "procs": procs}))
        devices = (MappedDevice(U[1], NODE.gpus[1].minor, 1), MappedDevice(U[2], NODE.gpus[2].minor, 2))
        write_map(JobMap("812", "root", 0, devices, time.time() - 4000), str(root / "run" / "jobs"))

    def env(self, **extra: str) -> dict[str, str]:
        return {**os.environ, "GPUSLURM_CONFIG": str(self.config), "GPUSLURM_SCENARIO": str(self.scenario),
                "COLUMNS": "80", **extra}

    def store_idle_finding(self, *, ended_ago: float = 0.0) -> None:
        now = time.time() - ended_ago
        v = Violation("idle", HOST, "root", "812", None, None, U[1], now - 3000, 3000.0,
                      f"job 812 of root holds {U[1]} at 0 % on average over the last 30 min "
                      "(idle at or below 5 %); no process of the job ran on it in that time")
        with Store.open(str(self.db)) as store:
            cycle = Cycle(now, HOST, (GpuSample(now, U[1], None, 0.0),), (),
                          (Allocation("812", "root", 0, (U[1], U[2]), now - 4000),))
            store.write_cycle(cycle, [v])

    def run(self, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "gpuslurm", *args, "--from", "dgx-h100"],
                              capture_output=True, text=True, timeout=timeout, env=self.env())


@pytest.fixture
def site(tmp_path: Path) -> Iterator[Site]:
    proc = subprocess.Popen(["/bin/sleep", "300"])
    try:
        yield Site(tmp_path, proc.pid)
    finally:
        proc.kill()
        proc.wait()


def line_with(text: str, *needles: str) -> str:
    found = [line for line in text.splitlines() if all(n in line for n in needles)]
    assert found, (needles, text)
    return found[0]


def test_status_shows_the_rogue_process_the_idle_job_and_the_stored_finding(site: Site) -> None:
    site.store_idle_finding()
    res = site.run("status")
    assert res.returncode == 0, res.stderr
    out = res.stdout
    assert all(len(line) <= 80 for line in out.splitlines())
    assert out.splitlines()[0].startswith(f"{HOST} ")
    rogue = line_with(out, "sleep")
    assert rogue.rstrip().endswith("ROGUE") and rogue.split()[0] == "0" and "root" in rogue
    job = line_with(out, "812", "root", "1,2")
    assert job.rstrip().endswith("IDLE")
    gpu0 = line_with(out, "   0 H100 80GB… 1B:00.0")
    assert "97%" in gpu0 and gpu0.rstrip().endswith("-")  # busy, but in nobody's job
    assert line_with(out, "   1 H100 80GB… 43:00.0").rstrip().endswith("812 root")
    assert "violations: monitor store" in out
    body = out[out.index("VIOLATIONS (2)"):]
    assert "ROGUE" in body and "it is in no job" in body and "IDLE for 50 min: job 812" in body


def test_a_finding_that_ended_long_ago_is_not_current(site: Site) -> None:
    site.store_idle_finding(ended_ago=3600)
    out = site.run("status").stdout
    assert "IDLE" not in out and "VIOLATIONS (1)" in out  # only the live rogue finding


def test_status_json(site: Site) -> None:
    site.store_idle_finding()
    res = site.run("status", "--json")
    assert res.returncode == 0, res.stderr
    data = json.loads(res.stdout)
    assert data["node"] == HOST and len(data["gpus"]) == 8
    proc = next(p for p in data["processes"] if p["name"] == "sleep")
    assert proc["marks"] == ["rogue"] and proc["job_id"] is None and proc["mem_mib"] == 5000
    job = next(j for j in data["jobs"] if j["job_id"] == "812")
    assert job["marks"] == ["idle"] and job["gpus"] == ["1", "2"] and job["util_pct"] == 0.5


def test_an_unusable_store_is_said_and_the_view_goes_on(site: Site) -> None:
    site.db.write_text("not a database")
    res = site.run("status")
    assert res.returncode == 0, res.stderr
    assert "monitor store unreadable" in " ".join(res.stdout.split()) and "ROGUE" in res.stdout
    problems = res.stdout[res.stdout.index("PROBLEMS (1)"):]
    assert "store-unreadable:" in problems and "not an SQLite database" in problems


def test_watch_without_a_terminal_prints_one_frame_per_interval(site: Site) -> None:
    start = time.monotonic()
    res = site.run("watch", "--interval", "0.3", "--count", "3")
    assert res.returncode == 0, res.stderr
    assert res.stdout.count(f"{HOST} ") == 3 and "\x1b[" not in res.stdout
    assert time.monotonic() - start >= 0.6


def test_watch_exits_0_on_ctrl_c_without_a_terminal(site: Site) -> None:
    argv = [sys.executable, "-m", "gpuslurm", "watch", "--from", "dgx-h100", "--interval", "30"]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=site.env())
    assert proc.stdout is not None
    first = proc.stdout.readline()
    assert first.startswith(f"{HOST} ")
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=20)
    assert proc.returncode == 0, err
    assert "Traceback" not in err and "aborted" not in err


def test_watch_stops_on_a_ctrl_c_that_comes_just_before_it_clears_its_wakeup(
        site: Site, monkeypatch: pytest.MonkeyPatch) -> None:
    """Ctrl-C between the loop's test of ``stopped`` and its ``clear()`` of the wakeup pipe: the
    clear ate the handler's byte, and watch slept out a whole interval before it left (hit by the
    resize storm below on Python 3.14, a 60 s interval against the test's 20 s)."""
    for name, value in site.env().items():
        monkeypatch.setenv(name, value)
    cleared: list[int] = []
    waits: list[float] = []
    real_clear = status_cmd._Wakeup.clear

    def clear_after_ctrl_c(self: status_cmd._Wakeup) -> None:
        if not cleared:
            os.kill(os.getpid(), signal.SIGINT)  # handled here, before the real clear below
        cleared.append(1)
        real_clear(self)

    def wait(self: status_cmd._Wakeup, timeout: float) -> bool:
        waits.append(timeout)
        return False  # an interval that passed, without sleeping it

    monkeypatch.setattr(status_cmd._Wakeup, "clear", clear_after_ctrl_c)
    monkeypatch.setattr(status_cmd._Wakeup, "wait", wait)
    live = status_cmd._open("dgx-h100", str(site.db))
    try:
        frames = status_cmd.run_watch(live, io.StringIO(), 30.0)
    finally:
        live.close()
    assert frames == 1 and cleared == [1]
    assert waits == []  # it left after the frame, without waiting out the interval


def test_watch_wakes_for_a_ctrl_c_that_another_thread_receives(
        site: Site, monkeypatch: pytest.MonkeyPatch) -> None:
    """The kernel hands a process's signal to any thread; the main thread asleep in ``select``
    learns of it only from the wakeup fd. The same race as a signal between the interpreter's
    last check and the ``select`` call: a handler that wrote the wakeup byte itself ran only after
    the whole interval."""
    for name, value in site.env().items():
        monkeypatch.setenv(name, value)
    waiting = threading.Event()
    woke: list[bool] = []
    real_wait = status_cmd._Wakeup.wait

    def wait(self: status_cmd._Wakeup, timeout: float) -> bool:
        waiting.set()
        woke.append(real_wait(self, timeout))
        return woke[-1]

    def ctrl_c() -> None:  # this thread takes SIGINT: the main thread blocks it
        waiting.wait(30)
        time.sleep(0.2)  # the main thread is in select by now
        os.kill(os.getpid(), signal.SIGINT)

    monkeypatch.setattr(status_cmd._Wakeup, "wait", wait)
    live = status_cmd._open("dgx-h100", str(site.db))
    sender = threading.Thread(target=ctrl_c)
    sender.start()  # before the main thread blocks SIGINT: a new thread inherits the mask
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        frames = status_cmd.run_watch(live, io.StringIO(), 10.0)
    finally:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
        sender.join()
        live.close()
    assert frames == 1
    assert woke == [True]  # woken by the Ctrl-C, not by the end of the interval


def _read_until(fd: int, needle: bytes, timeout: float = 30.0) -> bytes:
    got = b""
    end = time.monotonic() + timeout
    while needle not in got:
        left = end - time.monotonic()
        if left <= 0:
            raise AssertionError(f"no {needle!r} in {got[-2000:]!r}")
        ready, _, _ = select.select([fd], [], [], left)
        if ready:
            try:
                chunk = os.read(fd, 65536)
            except OSError:  # EIO: the child closed the terminal
                break
            if not chunk:
                break
            got += chunk
    return got


def _watch_in_pty(site: Site) -> tuple[int, int]:
    """``gpuslurm watch`` in a new session whose controlling terminal is a pty, as in an admin's
    shell; skipped, saying why, where no pty can be made (no /dev/ptmx or devpts in a chroot)."""
    try:
        pid, fd = pty.fork()
    except OSError as exc:
        pytest.skip(f"no pseudo-terminal can be made here ({exc}): watch draws only on a terminal")
    if pid == 0:  # the child
        try:
            os.execve(sys.executable, [sys.executable, "-m", "gpuslurm", "watch", "--from", "dgx-h100",
                                       "--interval", "60"], site.env(TERM="xterm", COLUMNS=""))
        finally:
            os._exit(127)
    return pid, fd


def _set_size(fd: int, rows: int, cols: int) -> None:
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))


def test_watch_redraws_in_place_follows_a_resize_and_exits_0_on_ctrl_c(site: Site) -> None:
    pid, fd = _watch_in_pty(site)
    try:
        _set_size(fd, 50, 120)
        first = _read_until(fd, b"\x1b[J")
        assert b"\x1b[?1049h" in first and b"\x1b[H" in first  # alternate screen, drawn from home
        assert b"ROGUE" in first
        # a narrower terminal: the kernel sends SIGWINCH, the frame is drawn again at once, narrower
        _set_size(fd, 50, 60)
        resized = _read_until(fd, b"\x1b[J", timeout=10)
        frame = resized[resized.rindex(b"\x1b[H"):]
        rows = [_visible(r) for r in frame.replace(b"\r\n", b"\n").split(b"\x1b[K\n")]
        assert rows and max(len(r) for r in rows) <= 60 and any(len(r) == 60 for r in rows)
        os.kill(pid, signal.SIGINT)
        tail = _read_until(fd, b"\x1b[?1049l", timeout=10)
        assert b"\x1b[?25h" in tail  # the cursor is given back
    finally:
        status = _reap(pid)
        os.close(fd)
    assert os.waitstatus_to_exitcode(status) == 0


def test_watch_survives_a_storm_of_resizes_and_still_exits_0_on_ctrl_c(site: Site) -> None:
    """Signals that come at any point of the loop: a handler that took a lock the loop held (an
    Event's, in clear() or at the start of wait()) hung watch for good, Ctrl-C included."""
    pid, fd = _watch_in_pty(site)
    try:
        _set_size(fd, 50, 120)
        _read_until(fd, b"\x1b[J")
        for i in range(3000):  # resizes while it draws, clears and waits
            _set_size(fd, 50, 60 + i % 40)
            if i % 50 == 0:
                _drain(fd)
        os.kill(pid, signal.SIGINT)
        tail = _read_until(fd, b"\x1b[?1049l", timeout=20)
        assert b"\x1b[?25h" in tail
    finally:
        status = _reap(pid)
        os.close(fd)
    assert os.waitstatus_to_exitcode(status) == 0


def _drain(fd: int) -> None:
    while select.select([fd], [], [], 0)[0]:
        try:
            if not os.read(fd, 65536):
                return
        except OSError:
            return


def _reap(pid: int) -> int:
    """The child's wait status; killed if it has not exited within 10 s (a failed test must not hang)."""
    end = time.monotonic() + 10
    while time.monotonic() < end:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return status
        time.sleep(0.05)
    os.kill(pid, signal.SIGKILL)
    return os.waitpid(pid, 0)[1]


def _visible(raw: bytes) -> str:
    import re

    text = re.sub(rb"\x1b\[[0-9;?]*[A-Za-z]", b"", raw).decode("utf-8", "replace")
    return text.strip("\r\n")
