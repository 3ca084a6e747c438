"""The bounded metrics server: its request parser (property tests), its cap, and running out of
descriptors while accepting (a real process under a small RLIMIT_NOFILE, real sockets)."""

from __future__ import annotations

import resource
import subprocess
import sys
import textwrap

from hypothesis import given
from hypothesis import strategies as st

from gpuslurm.watch.http_bounded import MAX_REQUEST, connection_cap, head_end, request_line, response


@given(st.binary(max_size=2 * MAX_REQUEST))
def test_any_bytes_give_a_request_line_or_none(data: bytes) -> None:
    line = request_line(data)
    assert line is None or (line[0].isalpha() and line[1].startswith("/") and "?" not in line[1])
    end = head_end(data)
    assert end is None or 0 < end <= len(data)


@given(st.sampled_from(["GET", "HEAD", "POST"]), st.text("abc/?=&%-_.~0123456789", max_size=50),
       st.sampled_from(["\r\n", "\n"]))
def test_a_request_head_is_read_as_sent(method: str, tail: str, eol: str) -> None:
    head = f"{method} /{tail} HTTP/1.1{eol}Host: x{eol}{eol}".encode()
    assert head_end(head + b"junk") == len(head)
    assert request_line(head) == (method, "/" + tail.split("?", 1)[0])


def test_the_head_ends_at_its_first_blank_line() -> None:
    assert head_end(b"GET / HTTP/1.1\n\nX: y\r\n\r\n") == len(b"GET / HTTP/1.1\n\n")


def test_what_is_not_a_request_line() -> None:
    for head in (b"", b"GET\r\n\r\n", b"GET /metrics\r\n\r\n", b"GET metrics HTTP/1.1\r\n\r\n",
                 b"GET /m\xe9trics HTTP/1.1\r\n\r\n", b"G T /metrics HTTP/1.1\r\n\r\n",
                 b"GET /metrics HTTP/2\r\n\r\n", b"\x00ET /metrics HTTP/1.1\r\n\r\n"):
        assert request_line(head) is None, head


def test_an_answer_says_its_length_and_closes() -> None:
    assert response(200, "text/plain", b"abc") == (
        b"HTTP/1.1 200 OK\r\nServer: gpuslurm\r\nContent-Type: text/plain\r\nContent-Length: 3\r\n"
        b"Connection: close\r\n\r\nabc")
    assert response(200, "text/plain", b"abc", head_only=True).endswith(b"\r\n\r\n")


def test_the_cap_leaves_three_quarters_of_the_descriptors_to_the_monitor() -> None:
    assert connection_cap(64, 256) == 64
    assert connection_cap(64, 1024) == 64
    assert connection_cap(64, 100) == 25
    assert connection_cap(64, 2) == 1
    assert connection_cap(64, resource.RLIM_INFINITY) == 64


# A server allowed more connections than its descriptors can hold (the cap bypassed), then 60
# clients from another process: accept meets EMFILE, which must pause accepting, say one line,
# and leave the server answering once the clients are gone.
EMFILE_SCRIPT = textwrap.dedent("""
    import resource, socket, subprocess, sys, time
    from gpuslurm.watch.http_bounded import BoundedHttpServer
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(128)
    port = listener.getsockname()[1]
    said = []
    server = BoundedHttpServer(listener, lambda m, p: (200, "text/plain", b"fine\\n"), timeout_s=30,
                               max_connections=1000, warn=said.append)
    clients = subprocess.Popen([sys.executable, "-c", sys.argv[1], str(port)], stdin=subprocess.PIPE,
                               stdout=subprocess.PIPE, text=True)
    assert clients.stdout.readline() == "open\\n"  # in the listen backlog
    resource.setrlimit(resource.RLIMIT_NOFILE, (40, 40))
    server.start()
    end = time.monotonic() + 60
    while server.accept_pauses == 0 and time.monotonic() < end:
        time.sleep(0.05)
    clients.stdin.close()  # the clients hang up
    clients.wait()
    end = time.monotonic() + 60
    while server.open_connections() and time.monotonic() < end:
        time.sleep(0.05)
    with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
        s.sendall(b"GET /metrics HTTP/1.1\\r\\n\\r\\n")
        answer = b""
        while chunk := s.recv(4096):
            answer += chunk
    server.close()
    print(server.accept_pauses > 0, said, answer.split(b"\\r\\n")[0].decode(), answer.endswith(b"fine\\n"))
""")
CLIENTS = textwrap.dedent("""
    import socket, sys
    socks = [socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=30) for _ in range(60)]
    print("open", flush=True)
    sys.stdin.read()
""")


def test_running_out_of_descriptors_while_accepting_pauses_and_recovers() -> None:
    done = subprocess.run([sys.executable, "-c", EMFILE_SCRIPT, CLIENTS], capture_output=True, text=True,
                          timeout=180, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("True ["), done.stdout
    assert "cannot accept connections (Too many open files); pausing 0.5 s" in done.stdout
    assert done.stdout.count("cannot accept") == 1  # one line, not one per try
    assert done.stdout.rstrip().endswith("HTTP/1.1 200 OK True"), done.stdout
    assert "Traceback" not in done.stderr
