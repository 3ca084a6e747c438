"""A real Prometheus (Debian's package) on loopback, scraping one exporter port every second.

The session starts ``/usr/bin/prometheus`` itself (never the packaged service) with a temporary
config and TSDB. It scrapes ``127.0.0.1:<exporter_port>``; each test that needs data runs a monitor
with ``--prometheus-port <exporter_port>`` and a node name of its own, one test at a time.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from tests.helpers.prom_helpers import Prom, free_port

PROMETHEUS = "/usr/bin/prometheus"


@pytest.fixture(scope="session")
def prometheus(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Prom]:
    if not os.access(PROMETHEUS, os.X_OK):
        pytest.skip(f"{PROMETHEUS} is absent: apt-get install prometheus (.ci/run does)")
    root = tmp_path_factory.mktemp("prometheus")
    exporter_port, port = free_port(), free_port()
    config = root / "prometheus.yml"
    config.write_text(
        "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n  evaluation_interval: 1s\n"
        "scrape_configs:\n  - job_name: gpuslurm\n    static_configs:\n"
        f"      - targets: ['127.0.0.1:{exporter_port}']\n")
    log = (root / "prometheus.log").open("wb")
    proc = subprocess.Popen(
        [PROMETHEUS, f"--config.file={config}", f"--storage.tsdb.path={root / 'data'}",
         f"--web.listen-address=127.0.0.1:{port}", "--storage.tsdb.retention.time=1d"],
        stdout=log, stderr=subprocess.STDOUT, cwd=root)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            if proc.poll() is not None:
                pytest.fail(f"prometheus exited {proc.returncode}: {_tail(root / 'prometheus.log')}")
            try:
                with urllib.request.urlopen(f"{url}/-/ready", timeout=1) as resp:
                    if resp.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"prometheus not ready after 30 s: {_tail(root / 'prometheus.log')}")
            time.sleep(0.2)
        yield Prom(url, exporter_port)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


def _tail(path: Path) -> str:
    return " | ".join(path.read_text(errors="replace").splitlines()[-5:])


@pytest.fixture(scope="session")
def promtool() -> str:
    found = shutil.which("promtool")
    if found is None:
        pytest.skip("promtool is absent (Debian's prometheus package has it)")
    return found
