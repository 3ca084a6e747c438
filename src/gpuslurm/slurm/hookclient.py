"""The installed Prolog and Epilog: a thin client of the node's hook server, or the hook itself.

``gpuslurm install`` writes ``python -I -S -c '...from gpuslurm.slurm.hookclient import run;
run()' prolog`` (and ``epilog``). :func:`run` hands the hook to the resident hook server
(:mod:`gpuslurm.slurm.hookserver`, ``gpuslurm hook-server``) over a Unix socket: one request
holding the hook's name, its umask and its whole environment; the server's fork says READY; the
client answers GO with its standard input, output and error attached (``SCM_RIGHTS``); the fork
runs :func:`gpuslurm.slurm.entry.main`, having imported everything already, writing where this
process would have written, and answers the exit code, which becomes this process's. What slurmd
sees is the hook it started, without the imports that are most of a hook's cost (docs/hooks.md,
"The hook server").

The rule that keeps both paths one gate:

* the server did not take the request (no socket, nobody listening, a peer that is not root,
  the connection closed or no READY within :data:`READY_TIMEOUT_S`: the server at its limit,
  stopping, wedged): run the hook in this process, :func:`gpuslurm.slurm.entry.run`, exactly as
  before the server existed. The server's fork runs a hook only after the client's GO, which the
  client sends only once it has READY, so a hook never runs in both places;
* GO sent, and no exit code back (the fork died, the answer is not one): fail closed with
  ``EXIT_INTERNAL``, as a hook's own bug does. The server may have done part of the work, so it
  is not done a second time here.

This module is imported on every job start: it uses the ``_socket`` C module (``socket.py``
would bring ``enum`` and ``selectors``), ``posix`` (``os.py`` and what it imports cost ~2 ms a
start under ``-S``), ``sys`` and :mod:`gpuslurm.errors` (0.4 ms; it imports no ``os`` either).
"""

from __future__ import annotations

import _socket
import posix  # os without os: the client's start skips os.py and collections.abc (~2 ms under -S)
import sys

from gpuslurm.errors import EXIT_INTERNAL

TYPE_CHECKING = False  # mypy takes any name TYPE_CHECKING as true; typing's costs an import
if TYPE_CHECKING:
    from typing import TextIO

DEFAULT_SOCKET = "/run/gpuslurm/hooks.sock"  # gpuslurm.configfile.DEFAULT_RUN_DIR + "/hooks.sock"
SOCKET_NAME = "hooks.sock"
SOCKET_VAR = "GPUSLURM_HOOK_SOCKET"  # written into the executables by `gpuslurm install`
SERVED = ("prolog", "epilog")  # the task prolog runs as the job's user: it never reaches the socket
MAGIC = b"gpuslurm-hook/1"
MAX_REQUEST = 256 * 1024  # one SOCK_SEQPACKET message; slurmd's hook environment is a few KiB
READY = b"ready"  # the server's fork has the request whole and will run it on GO
GO = b"go"  # the client's commitment, with its streams: from here it waits for the exit code
READY_TIMEOUT_S = 10.0  # a server that does not take a request in time is passed over
FDS = 3  # stdin, stdout, stderr
CONNECT_TIMEOUT_S = 2.0


class RequestError(ValueError):
    """A request that is not one: the server answers nothing and runs nothing."""


def encode_request(hook: str, umask: int, environ: dict[bytes, bytes]) -> bytes:
    """One request: ``MAGIC``, the hook, the umask in octal and ``KEY=VALUE`` entries, NUL-separated."""
    entries = [key + b"=" + value for key, value in environ.items()]
    if any(b"\0" in item for item in entries) or any(not key or b"=" in key for key in environ):
        raise RequestError("an environment entry holds a NUL or an empty or '='-bearing name")
    return b"\0".join([MAGIC, hook.encode("ascii"), b"%o" % umask, *entries])


def parse_request(data: bytes) -> tuple[str, int, dict[bytes, bytes]]:
    """The hook, umask and environment of a request :func:`encode_request` made, or RequestError."""
    if len(data) > MAX_REQUEST:
        raise RequestError(f"request longer than {MAX_REQUEST} bytes")
    parts = data.split(b"\0")
    if len(parts) < 3 or parts[0] != MAGIC:
        raise RequestError("not a gpuslurm hook request")
    hook = parts[1].decode("ascii", "replace")
    if hook not in SERVED:
        raise RequestError(f"not a served hook: {hook!r}")
    if not 1 <= len(parts[2]) <= 3 or parts[2].strip(b"01234567") or parts[2][:1] == b"0" != parts[2]:
        raise RequestError("umask is not an octal number as encode_request writes it")
    umask = int(parts[2], 8)
    if umask > 0o777:
        raise RequestError("umask out of range")
    environ: dict[bytes, bytes] = {}
    for entry in parts[3:]:
        key, sep, value = entry.partition(b"=")
        if not sep or not key or key in environ:
            raise RequestError("an environment entry without a name, an '=' or seen twice")
        environ[key] = value
    return hook, umask, environ


def parse_reply(data: bytes) -> int | None:
    """The exit code in a server's answer (``rc N``, 0-255), else None."""
    head, _, code = data.partition(b" ")
    if head != b"rc" or not code.isdigit() or len(code) > 3 or int(code) > 255:
        return None
    return int(code)


def peer_uid(sock: _socket.socket) -> int:
    """The uid of the process at the socket's other end (``SO_PEERCRED``: pid, uid, gid)."""
    cred = sock.getsockopt(_socket.SOL_SOCKET, _socket.SO_PEERCRED, 12)
    return int.from_bytes(cred[4:8], sys.byteorder)


def ask(hook: str, path: str, environ: dict[bytes, bytes], fds: tuple[int, int, int] = (0, 1, 2),
        say: TextIO | None = None) -> int | None:
    """The hook's exit code from the server at ``path``; None when the server did not take the
    request (the caller runs the hook itself); ``EXIT_INTERNAL`` when it took it (READY, GO) and no
    exit code came back."""
    try:
        sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_SEQPACKET)
    except OSError:
        return None
    try:
        if sock.fileno() <= 2:  # a closed 0, 1 or 2: the socket would stand in for the hook's stream
            return None
        try:
            sock.settimeout(CONNECT_TIMEOUT_S)
            sock.connect(path)
            if peer_uid(sock) != 0:
                _say(say, f"gpuslurm {hook}: {path} is not root's hook server; running the hook here")
                return None
            umask = posix.umask(0o077)
            posix.umask(umask)
            sock.sendall(encode_request(hook, umask, environ))
            sock.settimeout(READY_TIMEOUT_S)
            ready = sock.recv(16)
        except (OSError, RequestError):
            return None  # nothing of this hook ran there: it runs here, the same gate
        if ready != READY:
            return None  # closed, at its limit, stopping or too slow: nothing runs there without GO
        try:
            # GO carries the hook's streams: a request left in a wedged server's queue holds none
            # of slurmd's descriptors (slurmd waits for the hook's output to end)
            ancillary = b"".join(fd.to_bytes(4, sys.byteorder, signed=True) for fd in fds)
            sock.sendmsg([GO], [(_socket.SOL_SOCKET, _socket.SCM_RIGHTS, ancillary)])
        except OSError:
            return None  # the fork never had GO: nothing ran there
        try:
            sock.settimeout(None)  # slurmd's PrologEpilogTimeout bounds the hook, as before
            reply = sock.recv(64)
        except OSError:
            reply = b""
        code = parse_reply(reply)
        if code is None:
            _say(say, f"gpuslurm {hook}: the hook server took the request but gave no exit code; "
                      "failing closed")
            return EXIT_INTERNAL
        return code
    finally:
        sock.close()


def _say(say: TextIO | None, line: str) -> None:
    try:
        print(line, file=say or sys.stderr, flush=True)
    except (OSError, ValueError):
        pass


def main(argv: list[str] | None = None, environ: dict[bytes, bytes] | None = None) -> int | None:
    """The server's exit code for the hook ``argv[0]`` names, or None: run it here."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1 or args[0] not in SERVED:
        return None  # --help, a usage error, the task prolog: entry answers those
    env = dict(posix.environ if environ is None else environ)  # bytes to bytes, as os.environb
    path = env.get(SOCKET_VAR.encode(), b"").decode("utf-8", "surrogateescape") or DEFAULT_SOCKET
    return ask(args[0], path, env)


def run() -> None:
    """The installed Prolog's and Epilog's entry: the server's exit code, else the hook here."""
    code = main()
    if code is not None:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
        posix._exit(code)
    from gpuslurm.slurm.entry import run as run_here

    run_here()
