"""A small HTTP/1.x server whose cost a client cannot raise: one thread, capped connections, deadlines.

Failure policy: nothing a client does reaches the caller. The monitor runs as root and serves
``/metrics`` on a port every local user can connect to, so:

- one thread serves every connection (a selector), never one thread per connection;
- at most ``max_connections`` are open at once; beyond that the listening socket is not read, so
  new connections wait in the kernel's listen backlog (``LISTEN_BACKLOG``, bounded) and cost this
  process no descriptor; the cap is also at most a quarter of ``RLIMIT_NOFILE``, so the monitor's
  own files keep their headroom (:func:`connection_cap`);
- each connection has one *total* deadline, from accept to the last byte of the answer: a client
  that sends nothing, trickles its request a byte at a time, or reads the answer slowly is closed
  when it passes, whatever it does meanwhile;
- a request head is read up to ``MAX_REQUEST`` bytes; an error on a client's socket (reset,
  broken pipe) closes that socket and says nothing; running out of descriptors or memory while
  accepting pauses accepting for ``ACCEPT_PAUSE_S`` instead of spinning, with one line at most
  every ``WARN_EVERY_S``.
"""

from __future__ import annotations

import errno
import resource
import selectors
import socket
import threading
import time
from collections.abc import Callable

MAX_REQUEST = 8192  # bytes of request line and headers
LISTEN_BACKLOG = 32
ACCEPT_PAUSE_S = 0.5
WARN_EVERY_S = 60.0
FD_SHARE = 4  # connections take at most 1/FD_SHARE of the descriptor limit
_OUT_OF_RESOURCES = {errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM}
_REASONS = {200: "OK", 400: "Bad Request", 404: "Not Found", 405: "Method Not Allowed",
            431: "Request Header Fields Too Large"}

# (method, path) → (status, content type, body)
Responder = Callable[[str, str], tuple[int, str, bytes]]


def connection_cap(wanted: int, nofile: int | None = None) -> int:
    """``wanted``, lowered to a quarter of the soft RLIMIT_NOFILE (``nofile``, else this process's)."""
    if nofile is None:
        nofile = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    if nofile == resource.RLIM_INFINITY or nofile < 0:
        return max(1, wanted)
    return max(1, min(wanted, nofile // FD_SHARE))


def request_line(head: bytes) -> tuple[str, str] | None:
    """(method, path without the query) of a request head's first line; None if it is not HTTP/1.x."""
    line = head.split(b"\n", 1)[0].rstrip(b"\r")
    parts = line.split(b" ")
    if len(parts) != 3 or not parts[2].startswith(b"HTTP/1."):
        return None
    method, target = parts[0], parts[1]
    if not method.isalpha() or not method.isascii() or not target.startswith(b"/"):
        return None
    if not all(0x21 <= c < 0x7F for c in target):
        return None
    return method.decode("ascii"), target.split(b"?", 1)[0].decode("ascii")


def head_end(data: bytes) -> int | None:
    """Where a request head ends in ``data`` (after its blank line), None while it has not."""
    ends = [at + len(sep) for sep in (b"\r\n\r\n", b"\n\n") if (at := data.find(sep)) >= 0]
    return min(ends) if ends else None


def response(status: int, content_type: str, body: bytes, *, head_only: bool = False) -> bytes:
    """A whole HTTP/1.1 answer that closes the connection."""
    head = (f"HTTP/1.1 {status} {_REASONS.get(status, 'Error')}\r\nServer: gpuslurm\r\n"
            f"Content-Type: {content_type}\r\nContent-Length: {len(body)}\r\nConnection: close\r\n\r\n")
    return head.encode("ascii") + (b"" if head_only else body)


def _error(status: int) -> bytes:
    return response(status, "text/plain; charset=utf-8", f"{_REASONS[status].lower()}\n".encode())


class _Conn:
    __slots__ = ("deadline", "inbuf", "out", "sock")

    def __init__(self, sock: socket.socket, deadline: float) -> None:
        self.sock = sock
        self.deadline = deadline
        self.inbuf = b""
        self.out: memoryview | None = None  # the answer left to send, once the request is read


class BoundedHttpServer:
    """Serve ``respond`` on ``listener`` from one thread (:meth:`start`) until :meth:`close`."""

    def __init__(self, listener: socket.socket, respond: Responder, *, timeout_s: float,
                 max_connections: int, warn: Callable[[str], None] = lambda message: None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._listener = listener
        self._respond = respond
        self.timeout_s = timeout_s
        self.max_connections = max_connections
        self._warn = warn
        self._clock = clock
        self._conns: dict[int, _Conn] = {}
        self._sel = selectors.DefaultSelector()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._sel.register(self._wake_r, selectors.EVENT_READ)
        listener.setblocking(False)
        self._accepting = False
        self._paused_until = 0.0
        self._warned_at: float | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="gpuslurm-exporter", daemon=True)
        self.accept_pauses = 0  # times accepting ran out of descriptors or memory
        self.cut = 0  # connections closed at their deadline

    def start(self) -> None:
        self._thread.start()

    def close(self) -> None:
        """Stop serving, close every socket; returns when the thread has ended (at most 5 s)."""
        self._stop.set()
        try:
            self._wake_w.send(b"x")
        except OSError:
            pass
        if self._thread.is_alive():
            self._thread.join(timeout=5)
        if not self._thread.is_alive():
            self._close_all()

    def open_connections(self) -> int:
        return len(self._conns)

    # ---- the loop (the server's thread)

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                self._turn()
            except Exception as exc:  # a bug here must not end metrics for the monitor's life
                self._say(f"metrics server: {type(exc).__name__}: {exc}")
                self._stop.wait(ACCEPT_PAUSE_S)

    def _turn(self) -> None:
        now = self._clock()
        for conn in [c for c in self._conns.values() if c.deadline <= now]:
            self.cut += 1
            self._drop(conn)
        self._listen(now)
        waits = [c.deadline for c in self._conns.values()]
        if not self._accepting and len(self._conns) < self.max_connections:
            waits.append(self._paused_until)
        timeout = max(0.0, min(waits) - now) if waits else None
        for key, mask in self._sel.select(timeout):
            if key.fileobj is self._listener:
                self._accept()
            elif key.fileobj is self._wake_r:
                self._drain_wake()
            else:
                self._client(key.data, mask)

    def _listen(self, now: float) -> None:
        """Read the listening socket only while below the cap and not paused."""
        want = len(self._conns) < self.max_connections and now >= self._paused_until
        if want and not self._accepting:
            self._sel.register(self._listener, selectors.EVENT_READ)
        elif not want and self._accepting:
            self._sel.unregister(self._listener)
        self._accepting = want

    def _accept(self) -> None:
        while len(self._conns) < self.max_connections:
            try:
                sock, _addr = self._listener.accept()
            except BlockingIOError:
                return
            except OSError as exc:
                if exc.errno in _OUT_OF_RESOURCES:
                    self._pause(exc)
                return  # ECONNABORTED and the like: that client is gone
            try:
                sock.setblocking(False)
                conn = _Conn(sock, self._clock() + self.timeout_s)
                self._sel.register(sock, selectors.EVENT_READ, conn)
            except OSError as exc:
                sock.close()
                self._pause(exc)
                return
            self._conns[sock.fileno()] = conn

    def _pause(self, exc: OSError) -> None:
        self.accept_pauses += 1
        now = self._clock()
        self._paused_until = now + ACCEPT_PAUSE_S
        self._say(f"metrics server: cannot accept connections ({exc.strerror or exc}); "
                  f"pausing {ACCEPT_PAUSE_S:g} s", now)

    def _say(self, message: str, now: float | None = None) -> None:
        now = self._clock() if now is None else now
        if self._warned_at is None or now - self._warned_at >= WARN_EVERY_S:
            self._warned_at = now
            try:
                self._warn(message)
            except Exception:  # noqa: S110 - stderr gone: the metrics go on without the line
                pass

    def _drain_wake(self) -> None:
        try:
            while self._wake_r.recv(64):
                pass
        except OSError:
            pass

    def _client(self, conn: _Conn, mask: int) -> None:
        try:
            if conn.out is None:
                self._read(conn)
            else:
                self._write(conn)
        except OSError:  # reset, broken pipe, ...: the client is gone, nothing to say
            self._drop(conn)

    def _read(self, conn: _Conn) -> None:
        try:
            data = conn.sock.recv(4096)
        except BlockingIOError:
            return
        if not data:
            self._drop(conn)
            return
        conn.inbuf += data
        end = head_end(conn.inbuf)
        if end is None:
            if len(conn.inbuf) > MAX_REQUEST:
                self._answer(conn, _error(431))
            return
        if end > MAX_REQUEST:
            self._answer(conn, _error(431))
            return
        line = request_line(conn.inbuf[:end])
        if line is None:
            self._answer(conn, _error(400))
            return
        method, path = line
        if method not in ("GET", "HEAD"):
            self._answer(conn, _error(405))
            return
        status, content_type, body = self._respond(method, path)
        self._answer(conn, response(status, content_type, body, head_only=method == "HEAD"))

    def _answer(self, conn: _Conn, data: bytes) -> None:
        conn.inbuf = b""
        conn.out = memoryview(data)
        self._sel.modify(conn.sock, selectors.EVENT_WRITE, conn)
        self._write(conn)

    def _write(self, conn: _Conn) -> None:
        assert conn.out is not None
        try:
            sent = conn.sock.send(conn.out)
        except BlockingIOError:
            return
        conn.out = conn.out[sent:]
        if not conn.out:
            self._drop(conn)

    def _drop(self, conn: _Conn) -> None:
        fd = conn.sock.fileno()
        if fd >= 0:
            self._conns.pop(fd, None)
            try:
                self._sel.unregister(conn.sock)
            except (KeyError, ValueError):
                pass
        conn.sock.close()

    def _close_all(self) -> None:
        for conn in list(self._conns.values()):
            self._drop(conn)
        self._sel.close()
        for s in (self._listener, self._wake_r, self._wake_w):
            s.close()
