"""Helpers shared by the Prometheus tests (conftest.py cannot be imported by name: tests/ has one too)."""

from __future__ import annotations

import contextlib
import json
import re
import socket
import subprocess
import time
import urllib.request
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import pytest

PROMETHEUS = "/usr/bin/prometheus"


class Prom(NamedTuple):
    url: str
    exporter_port: int


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def api(url: str, path: str) -> Any:
    with urllib.request.urlopen(f"{url}{path}", timeout=5) as resp:
        return json.loads(resp.read())


_LABEL_ORDER = ("node", "gpu_uuid", "mig_uuid", "job_id", "user", "account", "pid", "process", "kind",
                "severity")
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def normal_exposition(text: str) -> str:
    """``text`` with labels in one order and whole values as integers (the client may sort labels,
    and writes ``3.0``, ``1.073741824e+09``): only what the series mean is compared."""
    out = []
    for x in text.splitlines():
        if x and not x.startswith("#"):
            series, _, value = x.rpartition(" ")
            v = float(value)
            name, brace, inner = series.partition("{")
            if brace:
                pairs = sorted(_LABEL.findall(inner.removesuffix("}")),
                               key=lambda kv: _LABEL_ORDER.index(kv[0]))
                series = name + "{" + ",".join(f'{k}="{val}"' for k, val in pairs) + "}"
            x = f"{series} {int(v) if v == int(v) else v}"
        out.append(x)
    return "\n".join(out) + "\n"


@contextlib.contextmanager
def running_prometheus(root: Path, targets: list[str], scrape_s: float) -> Iterator[str]:
    """``/usr/bin/prometheus`` on loopback scraping ``targets`` every ``scrape_s`` seconds, with a
    config and TSDB under ``root``; its base URL once it is ready (pytest.fail if it never is)."""
    config = root / "prometheus.yml"
    every = f"{round(scrape_s * 1000)}ms"
    config.write_text(
        f"global:\n  scrape_interval: {every}\n  scrape_timeout: {every}\n  evaluation_interval: {every}\n"
        "scrape_configs:\n  - job_name: gpuslurm\n    static_configs:\n"
        f"      - targets: [{', '.join(repr(t) for t in targets)}]\n")
    with contextlib.ExitStack() as stack:
        try:
            url = stack.enter_context(
                serving(root, config, root / "data", ["--storage.tsdb.retention.time=1d"], 30))
        except RuntimeError as exc:
            pytest.fail(str(exc))
        yield url


@contextlib.contextmanager
def serving(root: Path, config: Path, data: Path, flags: Sequence[str], ready_s: float) -> Iterator[str]:
    """``/usr/bin/prometheus`` with ``config`` and the TSDB ``data`` on a free loopback port, its
    log in ``root``; its base URL once it is ready (RuntimeError, with the log's tail, if it exits
    or is not ready within ``ready_s``); stopped on leaving."""
    port = free_port()
    log_path = root / "prometheus.log"
    with log_path.open("wb") as log:
        proc = subprocess.Popen([PROMETHEUS, f"--config.file={config}", f"--storage.tsdb.path={data}",
                                 f"--web.listen-address=127.0.0.1:{port}", *flags],
                                stdout=log, stderr=subprocess.STDOUT, cwd=root)
        url = f"http://127.0.0.1:{port}"
        try:
            deadline = time.monotonic() + ready_s
            while True:
                if proc.poll() is not None:
                    raise RuntimeError(f"prometheus exited {proc.returncode}: {log_tail(log_path)}")
                with contextlib.suppress(OSError), \
                        urllib.request.urlopen(f"{url}/-/ready", timeout=1) as resp:
                    if resp.status == 200:
                        break
                if time.monotonic() > deadline:
                    raise RuntimeError(f"prometheus not ready after {ready_s:g} s: {log_tail(log_path)}")
                time.sleep(0.2)
            yield url
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def log_tail(path: Path) -> str:
    return " | ".join(path.read_text(errors="replace").splitlines()[-5:])
