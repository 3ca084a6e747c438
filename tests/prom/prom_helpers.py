"""Helpers shared by the Prometheus tests (conftest.py cannot be imported by name: tests/ has one too)."""

from __future__ import annotations

import json
import socket
import urllib.request
from typing import Any, NamedTuple


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
