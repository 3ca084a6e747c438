"""Helpers shared by the Prometheus tests (conftest.py cannot be imported by name: tests/ has one too)."""

from __future__ import annotations

import json
import re
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
