"""A real Prometheus (Debian's package) on loopback, scraping one exporter port every second.

The session starts ``/usr/bin/prometheus`` itself (never the packaged service) with a temporary
config and TSDB. It scrapes ``127.0.0.1:<exporter_port>``; each test that needs data runs a monitor
with ``--prometheus-port <exporter_port>`` and a node name of its own, one test at a time.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator

import pytest
from tests.helpers.prom_helpers import PROMETHEUS, Prom, free_port, running_prometheus


@pytest.fixture(scope="session")
def prometheus(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Prom]:
    if not os.access(PROMETHEUS, os.X_OK):
        pytest.skip(f"{PROMETHEUS} is absent: apt-get install prometheus (.ci/run does)")
    root = tmp_path_factory.mktemp("prometheus")
    exporter_port = free_port()
    with running_prometheus(root, [f"127.0.0.1:{exporter_port}"], 1.0) as url:
        yield Prom(url, exporter_port)


@pytest.fixture(scope="session")
def promtool() -> str:
    found = shutil.which("promtool")
    if found is None:
        pytest.skip("promtool is absent (Debian's prometheus package has it)")
    return found
