"""The hook server (``gpuslurm hook-server``): the node's Prolog and Epilog, run by a resident
process that has already imported them.

A hook started by slurmd costs an interpreter start and the imports of its steps: on a replayed
node some 25 ms of CPU each, of which the work itself is under 2 ms (benchmarks/README.md). The
server pays the imports once: it imports everything the prolog and the epilog import
(:data:`WARM`), freezes the heap for the garbage collector, and then, for each request of the
thin client (:mod:`gpuslurm.slurm.hookclient`, the installed executables), forks a child that
takes the client's environment, umask and standard streams and runs
:func:`gpuslurm.slurm.entry.main`, the very function the hook runs without a server. The child's
exit code goes back to the client, which exits with it. One gate, one code path: only where it
runs differs.

Who may ask: the socket is root's (0600, in a directory only root may write) and every peer's
credentials (``SO_PEERCRED``) are checked, so only root, in practice slurmd's hooks, is served; a
peer that is not root is closed before anything is read. The client checks the server's
credentials the same way before it sends anything (a socket planted by someone else gets
nothing). The task prolog runs as the job's user and never asks (docs/hooks.md).

The parent reads nothing a client sends: it checks the peer, forks and goes back to accepting;
the child receives, validates (:func:`gpuslurm.slurm.hookclient.parse_request`: bounded, strict),
answers READY, and runs the hook only when the client answers GO. A client that sees no READY
(the connection closed: the server at ``max_children`` children, a fork that failed, a server
stopping or killed with requests queued; or none within its deadline) has not said GO, so
nothing runs there, and it runs the hook itself. Children outlive a stopping server (they finish
their job's hook); what a hook starts, such as an MPS daemon, is the job's, so the systemd unit
stops only the server (``KillMode=process``, packaging/gpuslurm-hook-server.service).
"""

from __future__ import annotations

import atexit
import gc
import importlib
import os
import signal
import socket
import stat
import sys
from collections.abc import Callable
from pathlib import Path

from gpuslurm.errors import EXIT_INTERNAL, InputError
from gpuslurm.slurm.hookclient import FDS, GO, MAX_REQUEST, READY, RequestError, parse_request

# What the prolog and the epilog import, replayed or live: imported once, before any fork. A test
# (tests/slurm/test_hook_server.py) runs a served prolog and epilog and checks they import no
# more.
WARM = (
    "gpuslurm.slurm.entry", "gpuslurm.slurm.hooks", "gpuslurm.slurm.adapter", "gpuslurm.slurm.hookenv",
    "gpuslurm.slurm.cgroup_v2", "gpuslurm.hooks.prolog", "gpuslurm.hooks.epilog", "gpuslurm.hooks.cache",
    "gpuslurm.hooks.log", "gpuslurm.config", "gpuslurm.hw.source", "gpuslurm.hw.health",
    "gpuslurm.hw.replay.bundle", "gpuslurm.hw.replay.bundlecache", "gpuslurm.hw.replay.health",
    "gpuslurm.hw.formats.smi_xml", "gpuslurm.hw.formats.topo_text", "gpuslurm.hw.formats.lscpu",
    "gpuslurm.hw.formats.health_json", "gpuslurm.hw.live.nvml_health", "gpuslurm.hw.live.procfs",
    "gpuslurm.isolate.cgroup_v1", "gpuslurm.isolate.devices", "gpuslurm.isolate.kill", "gpuslurm.isolate.mps",
    "gpuslurm.isolate.mps_request", "gpuslurm.policy.health", "gpuslurm.state.jobmap",
    "gpuslurm.state.taskinfo", "gpuslurm.state.out_of_service",
    "json", "tomllib", "syslog", "datetime", "pwd",
)
# Imported when present: the live node's NVML binding (a replayed node has no use for it).
WARM_OPTIONAL = ("gpuslurm.hw.live.nvml_lib",)
MAX_CHILDREN = 64
GO_TIMEOUT_S = 60.0  # a fork waits this long for the client's GO after READY
ACCEPT_POLL_S = 1.0  # how often the parent reaps its children when nobody asks


def warm() -> None:
    """Import :data:`WARM` (and what of :data:`WARM_OPTIONAL` imports), then freeze the heap so the
    children's collections do not touch (and copy) the parent's objects."""
    for name in WARM:
        importlib.import_module(name)
    for name in WARM_OPTIONAL:
        try:
            importlib.import_module(name)
        except ImportError:
            pass
    gc.collect()
    gc.freeze()


def check_socket_dir(path: Path) -> None:
    """Refuse a socket whose directory someone other than root could write (they could replace
    the socket), or whose path holds something other than a socket or nothing."""
    parent = path.parent
    try:
        os.makedirs(parent, 0o755, exist_ok=True)  # run_dir: the prolog makes it the same way
        st = os.stat(parent)
    except OSError as exc:
        raise InputError(f"its directory cannot be used: {exc.strerror}", str(path)) from None
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != 0 or st.st_mode & 0o022:
        raise InputError("its directory must be root's and writable by root alone", str(path))
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(st.st_mode):
        raise InputError("something other than a socket is there", str(path))


def listen(path: Path) -> socket.socket:
    """The server's socket at ``path`` (a stale one replaced, a live one refused), root's and 0600
    from its creation."""
    check_socket_dir(path)
    if path.exists():
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        probe.settimeout(2.0)
        try:
            probe.connect(str(path))
        except TimeoutError:
            raise InputError("another hook server listens there (its queue is full)", str(path)) from None
        except OSError:
            pass  # nobody listens: stale
        else:
            raise InputError("another hook server listens there", str(path))
        finally:
            probe.close()
    try:
        path.unlink()
    except FileNotFoundError:
        pass
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    old = os.umask(0o177)
    try:
        sock.bind(str(path))
    finally:
        os.umask(old)
    os.chmod(path, 0o600)
    sock.listen(128)
    return sock


def peer_uid(conn: socket.socket) -> int:
    cred = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12)
    return int.from_bytes(cred[4:8], sys.byteorder)


def serve(path: Path, say: Callable[[str], object], max_children: int = MAX_CHILDREN,
          ready: Callable[[], object] | None = None) -> int:
    """Serve hook requests at ``path`` until SIGTERM or SIGINT; 0 then."""
    if os.geteuid() != 0:
        raise InputError("the hook server runs as root (it runs root's hooks)", "gpuslurm hook-server")
    warm()
    sock = listen(path)
    ours = os.lstat(path)
    sock.settimeout(ACCEPT_POLL_S)
    stopping: list[int] = []

    def stop(signum: int, _frame: object) -> None:
        stopping.append(signum)

    old = {sig: signal.signal(sig, stop) for sig in (signal.SIGTERM, signal.SIGINT)}
    children: set[int] = set()
    done = Served()
    say(f"gpuslurm hook-server: serving the prolog and the epilog at {path}")
    if ready is not None:
        ready()
    try:
        while not stopping:
            _reap(children, done)
            try:
                conn, _ = sock.accept()
            except (TimeoutError, InterruptedError):
                continue
            except OSError as exc:  # EMFILE, ECONNABORTED: this client runs its hook itself
                say(f"gpuslurm hook-server: accept: {exc.strerror}")
                continue
            try:
                uid = peer_uid(conn)
                if uid != 0:
                    say(f"gpuslurm hook-server: refused a client of uid {uid} (only root's hooks are served)")
                    continue
                if len(children) >= max_children:
                    continue  # closed before READY: the client runs the hook itself
                for stream in (sys.stdout, sys.stderr):
                    stream.flush()
                try:
                    pid = os.fork()
                except OSError as exc:  # EAGAIN, ENOMEM: as busy
                    say(f"gpuslurm hook-server: fork: {exc.strerror}; the hook runs in its own process")
                    continue
                if pid == 0:  # pragma: no cover - the child; its effects are what the tests check
                    sock.close()
                    _child(conn)
                children.add(pid)
            finally:
                conn.close()
    finally:
        sock.close()
        try:
            if os.path.samestat(os.lstat(path), ours):  # not a successor's socket
                path.unlink()
        except OSError:
            pass
        for sig, handler in old.items():
            signal.signal(sig, handler)
    _reap(children, done)
    say(f"gpuslurm hook-server: stopped after {done.hooks} hook(s), {done.cpu_s:.3f} s of CPU in their "
        f"forks; {len(children)} still finishing on their own")
    return 0


class Served:
    """What the finished forks cost: their count and CPU time (user + system), for the figures."""

    def __init__(self) -> None:
        self.hooks = 0
        self.cpu_s = 0.0


def _reap(children: set[int], done: Served) -> None:
    for pid in list(children):
        try:
            finished, _, usage = os.wait4(pid, os.WNOHANG)
        except ChildProcessError:
            children.discard(pid)
            continue
        if finished:
            children.discard(pid)
            done.hooks += 1
            done.cpu_s += usage.ru_utime + usage.ru_stime


def _child(conn: socket.socket) -> None:  # pragma: no cover - runs in the fork
    """One request: receive and check it, say READY, and run the hook as the client would have
    only once the client answers GO (a client that gave up waiting has closed instead, and runs
    the hook itself); then answer its exit code. Any failure before GO leaves without running
    anything; after GO, without an answer, which the client turns into a failed hook."""
    try:
        _as_a_new_process()
        conn.settimeout(5.0)
        data, _, flags, _ = conn.recvmsg(MAX_REQUEST + 1)
        if flags & (socket.MSG_TRUNC | socket.MSG_CTRUNC):  # CTRUNC: descriptors sent with it
            raise RequestError("truncated, or carrying descriptors")
        hook, umask, environ = parse_request(data)
        conn.send(READY)
        # GO, with the hook's three streams. The client sends it at once after READY; a client
        # stalled longer than this gets EOF after its GO and fails the hook closed.
        conn.settimeout(GO_TIMEOUT_S)
        go, ancillary, flags, _ = conn.recvmsg(16, socket.CMSG_SPACE(FDS * 4))
        fds = _received_fds(ancillary)
        if go != GO or flags & socket.MSG_CTRUNC or len(fds) != FDS:
            raise RequestError("no GO with exactly three descriptors")
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
            os.close(fd)
        os.umask(umask)
        os.chdir("/")
        os.environ.clear()
        for key, value in environ.items():
            os.environb[key] = value
        sys.argv = ["-c", hook]  # what `python -c ... hook` has
        from gpuslurm.slurm.entry import main

        code = main([hook])
        atexit._run_exitfuncs()
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
        conn.settimeout(5.0)
        conn.send(b"rc %d" % code)
        os._exit(0)
    except BaseException:
        os._exit(EXIT_INTERNAL)


def _as_a_new_process() -> None:  # pragma: no cover - runs in the fork
    """Signals as a fresh ``python`` has them, whatever the server inherited or set: every
    disposition the default but SIGINT (Python's KeyboardInterrupt), SIGPIPE and SIGXFSZ (ignored,
    as Python's start-up sets them), and none blocked; so do the commands the hook runs."""
    for sig in signal.valid_signals():
        if sig in (signal.SIGKILL, signal.SIGSTOP):
            continue
        try:
            signal.signal(sig, signal.SIG_DFL)
        except (OSError, ValueError):
            pass
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_SETMASK, ())


def _received_fds(ancillary: list[tuple[int, int, bytes]]) -> list[int]:
    """The descriptors a request carried: exactly :data:`FDS` of them, or none (any others closed)."""
    fds: list[int] = []
    for level, kind, data in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            usable = len(data) - len(data) % 4
            fds.extend(int.from_bytes(data[i:i + 4], sys.byteorder, signed=True)
                       for i in range(0, usable, 4))
    if len(fds) != FDS:
        for fd in fds:
            try:
                os.close(fd)
            except OSError:
                pass
        return []
    return fds
