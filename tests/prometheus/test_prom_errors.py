"""What goes wrong between gpuslurm and Prometheus: one line each, exit code 2."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from tests.helpers.prom_helpers import Prom, free_port

from gpuslurm.errors import EXIT_BAD_INPUT
from gpuslurm.report.prometheus import PrometheusClient, PrometheusError, load_prometheus, parse_source
from gpuslurm.watch.exporter import start_exporter


class _NotPrometheus(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        body = b"<html>a web server, not Prometheus</html>"
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def not_prometheus() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _NotPrometheus)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def _one_line(exc: pytest.ExceptionInfo[PrometheusError]) -> str:
    text = str(exc.value)
    assert "\n" not in text and exc.value.exit_code == EXIT_BAD_INPUT
    return text


def test_an_unreachable_prometheus_is_one_line() -> None:
    port = free_port()  # nothing listens there
    with pytest.raises(PrometheusError) as exc:
        load_prometheus(f"prometheus:http://127.0.0.1:{port}", time.time() - 3600, time.time(), 60)
    assert _one_line(exc) == f"prometheus:http://127.0.0.1:{port}: unreachable: Connection refused"


def test_a_prometheus_that_does_not_answer_times_out() -> None:
    with socket.socket() as silent:  # accepts connections (the backlog) and never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        client = PrometheusClient(f"http://127.0.0.1:{silent.getsockname()[1]}", timeout_s=0.5)
        started = time.monotonic()
        with pytest.raises(PrometheusError) as exc:
            client.instant("up", time.time())
    assert time.monotonic() - started < 5
    assert "no answer within 0.5 s to a query over an instant: Prometheus is overloaded" in _one_line(exc)
    assert "unreachable" not in _one_line(exc)  # a slow Prometheus is not a missing one


def test_a_web_server_that_is_not_prometheus(not_prometheus: str) -> None:
    with pytest.raises(PrometheusError) as exc:
        load_prometheus(not_prometheus, time.time() - 3600, time.time(), 60)
    assert _one_line(exc) == f"prometheus:{not_prometheus}: /api/v1/label/node/values did not answer JSON: " \
        "is this Prometheus?"


def test_an_exporter_url_instead_of_prometheus_is_an_http_error() -> None:
    exporter = start_exporter("127.0.0.1", 0)
    try:
        url = f"http://127.0.0.1:{exporter.address[1]}"
        with pytest.raises(PrometheusError) as exc:
            PrometheusClient(url).instant("up", time.time())
    finally:
        exporter.close()
    assert _one_line(exc) == f"prometheus:{url}: HTTP 404 from /api/v1/query: Not Found"


@pytest.mark.parametrize("source", ["prometheus:ftp://prom:9090", "prometheus:", "prometheus:prom:9090"])
def test_a_source_that_is_not_an_http_url(source: str) -> None:
    with pytest.raises(PrometheusError, match=r"^--source: not an http\(s\) URL"):
        parse_source(source)


def test_prometheus_own_errors_are_passed_on(prometheus: Prom) -> None:
    with pytest.raises(PrometheusError) as exc:
        PrometheusClient(prometheus.url).instant("sum(", time.time())
    assert _one_line(exc).startswith(f"prometheus:{prometheus.url}: HTTP 400 from /api/v1/query: ")
    assert "parse error" in str(exc.value)


def test_a_window_without_samples_names_the_window(prometheus: Prom) -> None:
    since = 1_000_000_000.0  # 2001: long before this Prometheus started
    with pytest.raises(PrometheusError) as exc:
        load_prometheus(f"prometheus:{prometheus.url}", since, since + 3600, 60)
    assert "no gpuslurm GPU samples between 2001-09-09" in _one_line(exc)


def test_throttle_sync_from_an_unreachable_prometheus_exits_2(tmp_path: Path) -> None:
    port = free_port()
    config = tmp_path / "gpuslurm.toml"
    config.write_text(f'[throttle]\nfile = "{tmp_path / "throttle"}"\n')
    env = {**os.environ, "GPUSLURM_CONFIG": str(config)}
    for args, want in (
            (["--source", f"prometheus:http://127.0.0.1:{port}"],
             f"gpuslurm: prometheus:http://127.0.0.1:{port}: unreachable: Connection refused"),
            (["--source", "/var/spool/violations"],
             "gpuslurm: --source: not a violation source: '/var/spool/violations' (prometheus:URL)"),
            (["--source", f"prometheus:http://127.0.0.1:{port}", "--violations-dir", str(tmp_path)],
             "gpuslurm: throttle sync: --source and --violations-dir do not go together")):
        done = subprocess.run([sys.executable, "-m", "gpuslurm", "throttle", "sync", *args],
                              env=env, capture_output=True, text=True, check=False)
        assert (done.returncode, done.stderr, done.stdout) == (2, want + "\n", "")
    assert not (tmp_path / "throttle").exists()


def test_the_report_from_an_unreachable_prometheus_exits_2() -> None:
    port = free_port()
    done = subprocess.run([sys.executable, "-m", "gpuslurm", "fairshare-report", "--last", "1h",
                           "--source", f"prometheus:http://127.0.0.1:{port}"],
                          env={**os.environ, "GPUSLURM_CONFIG": "/dev/null"}, capture_output=True, text=True,
                          check=False)
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr == f"gpuslurm: prometheus:http://127.0.0.1:{port}: unreachable: Connection refused\n"
