"""The metrics port attacked by a local user, against a real ``gpuslurm monitor`` process.

The monitor runs as root under ``prlimit --nofile=256`` (the limit scaled down from a node's 1024),
replaying the DGX H100 bundle every 0.2 s with ``--prometheus-port`` on 127.0.0.1 and a 1 s
connection deadline. ``nobody`` then holds 300 idle connections open (reopening each one the
monitor closes), trickles a request one byte at a time, or hangs up before the answer. The
monitor must keep cycling, cut every connection at its deadline, serve a scrape once the attack
stops, print no traceback, and exit 0 on SIGTERM. Its store must be root's alone.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import stat
import struct
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import NamedTuple

import pytest
from tests.helpers.prom_helpers import free_port

NOBODY = 65534
# the monitor's per-connection deadline here: long enough that the attacker, opening eight at a
# time, holds the cap (64) before the first is cut even on a loaded machine (at 1 s it peaked at
# 46 once in CI, beside the Slurm tests)
DEADLINE_S = 3.0
pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="plays root (the monitor) and nobody")

# Run by nobody with the system python: opens connections to PORT (at most 8 being made at once,
# each given 2 s) and sends nothing, until 300 are open or were opened in all (each one the server
# closes is reopened at once); then says "held" and goes on until a line arrives on stdin. It then
# prints what happened as JSON and holds what it has, reopening nothing, until stdin ends.
ATTACKER = r"""
import json, selectors, socket, sys, time
port, n = int(sys.argv[1]), int(sys.argv[2])
sel = selectors.DefaultSelector()
sel.register(sys.stdin, selectors.EVENT_READ, "stdin")
stats = {"established": 0, "cut": 0, "refused": 0, "slow": 0, "peak_open": 0}
open_now, connecting = set(), {}
give_up, said = time.monotonic() + 120, False
while True:
    now = time.monotonic()
    for s, t in list(connecting.items()):
        if now - t > 2:
            stats["slow"] += 1
            sel.unregister(s)
            s.close()
            del connecting[s]
    while len(connecting) < 8 and len(open_now) + len(connecting) < n:
        s = socket.socket()
        s.setblocking(False)
        s.connect_ex(("127.0.0.1", port))
        sel.register(s, selectors.EVENT_WRITE, "connecting")
        connecting[s] = now
    if not said and (stats["established"] >= n or now > give_up):
        print("held", flush=True)
        said = True
    for key, _ in sel.select(0.1):
        s = key.fileobj
        if key.data == "stdin":
            sys.stdin.readline()
            print(json.dumps(stats), flush=True)
            sys.stdin.read()  # hold every socket until the test lets go
            sys.exit(0)
        elif key.data == "connecting":
            sel.unregister(s)
            del connecting[s]
            if s.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR):
                stats["refused"] += 1
                s.close()
                continue
            stats["established"] += 1
            open_now.add(s)
            stats["peak_open"] = max(stats["peak_open"], len(open_now))
            sel.register(s, selectors.EVENT_READ, "open")
        else:
            try:
                data = s.recv(4096)
            except OSError:
                data = b""
            if data:
                continue
            stats["cut"] += 1
            open_now.discard(s)
            sel.unregister(s)
            s.close()
"""


class Monitor(NamedTuple):
    proc: subprocess.Popen[str]
    port: int
    state: Path
    stdout: Path
    stderr: Path


@pytest.fixture
def site() -> Iterator[Path]:
    base = Path(tempfile.mkdtemp(prefix="gpuslurm-exporter-attack-", dir="/tmp"))
    base.chmod(0o755)  # like /var/lib: nobody may look in; the store's own mode must keep them out
    try:
        yield base
    finally:
        shutil.rmtree(base)


def _start(site: Path) -> Monitor:
    port = free_port()
    config = site / "gpuslurm.toml"
    config.write_text(
        f'[paths]\nrun_dir = "{site / "run"}"\nstate_dir = "{site / "state"}"\n'
        f'violations_dir = "{site / "violations"}"\nsqueue = "{site / "no-squeue"}"\n'
        f'[monitor]\nnode_name = "attacked"\nprometheus_timeout_s = {DEADLINE_S}\n')
    env = {**os.environ, "GPUSLURM_CONFIG": str(config)}
    env.pop("GPUSLURM_SCENARIO", None)
    out, err = site / "monitor.out", site / "monitor.err"
    proc = subprocess.Popen(
        ["/usr/bin/prlimit", "--nofile=256:256", "--", sys.executable, "-m", "gpuslurm", "monitor",
         "--from", "dgx-h100", "--interval", "0.2", "--json", "--prometheus-port", str(port)],
        env=env, stdout=out.open("w"), stderr=err.open("w"), text=True, cwd="/")
    monitor = Monitor(proc, port, site / "state", out, err)
    _wait_for(lambda: _cycles(monitor) >= 2, monitor, "the monitor's first cycles")
    _scrape(monitor)
    return monitor


def _cycles(m: Monitor) -> int:
    return m.stdout.read_text().count("\n")


def _wait_for(ready: Callable[[], bool], m: Monitor, what: str, limit_s: float = 60.0) -> None:
    end = time.monotonic() + limit_s
    while not ready():
        tail = m.stderr.read_text()[-2000:]
        assert m.proc.poll() is None, f"the monitor exited {m.proc.returncode}: {tail}"
        assert time.monotonic() < end, f"no {what} in {limit_s:g} s: {tail}"
        time.sleep(0.05)


def _scrape(m: Monitor) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{m.port}/metrics", timeout=30) as resp:
        return str(resp.read().decode())


def _stop(m: Monitor) -> str:
    """SIGTERM; the monitor's stderr, once it has exited 0."""
    m.proc.send_signal(signal.SIGTERM)
    try:
        m.proc.wait(timeout=30)
    finally:
        if m.proc.poll() is None:
            m.proc.kill()
            m.proc.wait()
    err = m.stderr.read_text()
    assert m.proc.returncode == 0, err[-2000:]
    return err


@pytest.fixture
def monitor(site: Path) -> Iterator[Monitor]:
    m = _start(site)
    try:
        yield m
    finally:
        if m.proc.poll() is None:
            m.proc.kill()
            m.proc.wait()


def _sockets(pid: int) -> int:
    """How many sockets process ``pid`` has open."""
    count = 0
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            count += os.readlink(f"/proc/{pid}/fd/{fd}").startswith("socket:")
        except FileNotFoundError:
            pass
    return count


def test_300_idle_connections_neither_stop_nor_stall_the_monitor(monitor: Monitor) -> None:
    attacker = subprocess.Popen(["/usr/bin/python3", "-c", ATTACKER, str(monitor.port), "300"],
                                user=NOBODY, group=NOBODY, extra_groups=[], cwd="/", text=True,
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, env={"PATH": "/usr/bin:/bin"})
    held: list[int] = []
    try:
        assert attacker.stdout is not None and attacker.stdin is not None
        assert attacker.stdout.readline() == "held\n"
        before = _cycles(monitor)

        def cycled() -> bool:
            held.append(_sockets(monitor.proc.pid))
            return _cycles(monitor) >= before + 10

        _wait_for(cycled, monitor, "cycles during the attack")
        attacker.stdin.write("stop\n")
        attacker.stdin.flush()
        result = json.loads(attacker.stdout.readline())
        # the attacker still holds every socket it has, reopening none: a scrape gets through
        # once the monitor has cut those it accepted (each at its deadline)
        scraped = _scrape(monitor)
    finally:
        if attacker.poll() is None:
            attacker.kill()
            attacker.wait()
    assert "gpuslurm_monitor_cycles_total" in scraped
    # the user held the monitor's connections (its cap of 64, the backlog beyond) ...
    assert result["peak_open"] >= 64, result
    # ... but the monitor never had more than its cap (+ the listener and its wake-up pair) ...
    assert max(held) <= 64 + 3, max(held)
    # ... and closed each one at its deadline
    assert result["cut"] >= 64, result
    err = _stop(monitor)
    assert "Traceback" not in err, err[-2000:]


def test_a_request_trickled_byte_by_byte_is_cut_at_the_deadline(monitor: Monitor) -> None:
    sent = 0
    request = b"GET /metrics HTTP/1.1\r\nX-Slow: " + b"a" * 200  # never ends: no blank line
    with socket.create_connection(("127.0.0.1", monitor.port), timeout=30) as s:
        try:
            for byte in request:  # one byte every 0.1 s: each read alone is quick
                s.sendall(bytes([byte]))
                sent += 1
                time.sleep(0.1)
                s.setblocking(False)
                try:
                    if s.recv(1) == b"":
                        break  # the monitor closed it
                except BlockingIOError:
                    pass
                finally:
                    s.setblocking(True)
        except OSError:  # reset: closed by the monitor
            pass
    # cut at the 1 s deadline, long before the client was done (plus the time sleep() overran)
    assert sent < len(request), "the trickling client was never cut"
    assert "gpuslurm_monitor_cycles_total" in _scrape(monitor)
    assert "Traceback" not in _stop(monitor)


def test_clients_that_hang_up_early_leave_no_traceback(monitor: Monitor) -> None:
    for i in range(300):
        s = socket.create_connection(("127.0.0.1", monitor.port), timeout=30)
        s.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        if i % 2:
            s.recv(10)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # reset, not FIN
        s.close()
    assert "gpuslurm_monitor_cycles_total" in _scrape(monitor)
    err = _stop(monitor)
    assert "Traceback" not in err and "Error" not in err, err[-2000:]


def test_the_store_is_root_only_after_a_real_run(monitor: Monitor) -> None:
    _stop(monitor)
    files = sorted(monitor.state.glob("monitor.db*"))
    assert files, "no store written"
    for f in files:
        assert stat.S_IMODE(f.stat().st_mode) == 0o600, f
    done = subprocess.run(["/usr/bin/python3", "-c", f"open({str(files[0])!r}, 'rb')"], user=NOBODY,
                          group=NOBODY, extra_groups=[], cwd="/", capture_output=True, text=True, timeout=60,
                          check=False)
    assert done.returncode != 0 and "PermissionError" in done.stderr, done.stderr
