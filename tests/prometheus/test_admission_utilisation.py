"""``throttle auto``'s utilisation source: the node monitors' gpuslurm_gpu_utilization_ratio as a
real Prometheus answers it (an exporter stand-in serves two GPUs at 30 % and 50 %)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import quote

import pytest
from tests.helpers.prom_helpers import Prom, api, free_port

from gpuslurm.errors import InputError
from gpuslurm.slurm.admission import UTILISATION_METRIC, SlurmAdmission

EXPOSITION = (f"# TYPE {UTILISATION_METRIC} gauge\n"
              f'{UTILISATION_METRIC}{{node="adm-test",gpu_uuid="GPU-a"}} 0.3\n'
              f'{UTILISATION_METRIC}{{node="adm-test",gpu_uuid="GPU-b"}} 0.5\n').encode()


class _Exporter(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.send_header("Content-Length", str(len(EXPOSITION)))
        self.end_headers()
        self.wfile.write(EXPOSITION)

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def exporter(prometheus: Prom) -> Iterator[Prom]:
    server = ThreadingHTTPServer(("127.0.0.1", prometheus.exporter_port), _Exporter)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield prometheus
    finally:
        server.shutdown()
        server.server_close()


def test_the_mean_utilisation_is_read(exporter: Prom) -> None:
    adm = SlurmAdmission(utilisation_source=f"prometheus:{exporter.url}")
    query = f"avg(avg_over_time({UTILISATION_METRIC}[5m]))"
    deadline = time.monotonic() + 30
    while True:
        now = time.time()
        try:
            got = adm.read_utilisation(now)
            break
        except InputError:
            assert time.monotonic() < deadline, "Prometheus never scraped the stand-in"
            time.sleep(0.5)
    direct = api(exporter.url, f"/api/v1/query?query={quote(query)}&time={now}")["data"]["result"]
    assert got == pytest.approx(float(direct[0]["value"][1]))
    count = api(exporter.url, f"/api/v1/query?query={quote(f'count({UTILISATION_METRIC})')}&time={now}")
    if count["data"]["result"][0]["value"][1] == "2":  # only the stand-in's series: exactly 40 %
        assert got == pytest.approx(0.4)


def test_no_source_is_none_and_a_bad_one_is_refused() -> None:
    assert SlurmAdmission().read_utilisation(time.time()) is None
    with pytest.raises(InputError, match="not an http"):
        SlurmAdmission(utilisation_source="prometheus:ftp://x")
    nothing = SlurmAdmission(utilisation_source=f"prometheus:http://127.0.0.1:{free_port()}")
    with pytest.raises(InputError, match="unreachable"):
        nothing.read_utilisation(time.time())
