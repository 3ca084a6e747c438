"""The Prometheus HTTP API calls the report makes: timeouts, size caps and one-line errors.

Every failure (unreachable, too slow, HTTP error, one of Prometheus' own limits, not Prometheus'
JSON) is a :class:`PrometheusError` of one line: exit 2, naming the cause, never a bare
"unreachable" where Prometheus answered.
"""

from __future__ import annotations

import json
import re
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

from gpuslurm.errors import InputError
from gpuslurm.policy.wording import span

MAX_POINTS = 10_000  # per series and query; Prometheus' own limit is 11,000
TIMEOUT_S = 30.0
MAX_BYTES = 256 << 20

Key = tuple[tuple[str, str], ...]  # a series' labels, sorted


class PrometheusError(InputError):
    """Prometheus could not be asked, or its answer is not what the HTTP API promises."""


def parse_source(text: str) -> str:
    """The base URL of ``prometheus:URL`` (or a bare URL); InputError when it is not http(s)."""
    url = text[len("prometheus:"):] if text.startswith("prometheus:") else text
    try:
        if len(url) > 2048 or not url.isprintable() or any(c.isspace() for c in url):
            raise ValueError("too long, or a space or control character in it")
        parts = urllib.parse.urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError("not http(s)://HOST")
        _ = parts.port  # ValueError when not a number in 0..65535
        if parts.query or parts.fragment:
            raise ValueError("a query or fragment has no place in the base URL")
    except ValueError as exc:
        raise PrometheusError(f"not an http(s) URL: {url[:200]!r} ({exc}; e.g. prometheus:http://prom:9090)",
                              source="--source") from None
    return url.rstrip("/")


class PrometheusClient:
    """The two HTTP API calls the report needs, with timeouts and one-line errors."""

    def __init__(self, url: str, timeout_s: float = TIMEOUT_S) -> None:
        self.url = parse_source(url)
        self.timeout_s = timeout_s

    def instant(self, query: str, at: float) -> list[dict[str, Any]]:
        """``/api/v1/query`` at ``at``: the vector's elements (``metric``, ``value``)."""
        return self._get("query", {"query": query, "time": _ts(at)}, "vector")

    def samples(self, query: str, at: float) -> list[dict[str, Any]]:
        """``/api/v1/query`` of a range vector at ``at``: each series' raw samples (``values``)."""
        return self._get("query", {"query": query, "time": _ts(at)}, "matrix")

    def range(self, query: str, first: float, last: float, step_s: float) -> list[dict[str, Any]]:
        """``/api/v1/query_range`` from ``first`` to ``last`` (both evaluated), split into parts of
        at most MAX_POINTS points; the parts' values of one series are concatenated."""
        points = round((last - first) / step_s) + 1
        merged: dict[Key, dict[str, Any]] = {}
        for part in range(0, points, MAX_POINTS):
            lo = first + part * step_s
            hi = first + (min(part + MAX_POINTS, points) - 1) * step_s
            params = {"query": query, "start": _ts(lo), "end": _ts(hi), "step": repr(float(step_s))}
            for item in self._get("query_range", params, "matrix"):
                key = series_key(item)
                if key in merged:
                    merged[key]["values"].extend(item.get("values") or ())
                else:
                    merged[key] = {"metric": item.get("metric") or {},
                                   "values": list(item.get("values") or ())}
        return list(merged.values())

    def label_values(self, label: str, metric: str, first: float, last: float) -> list[str]:
        """``/api/v1/label/LABEL/values`` of ``metric``'s series with samples in ``[first, last]``
        (from the index: no sample is read), sorted."""
        params = {"match[]": metric, "start": _ts(first), "end": _ts(last)}
        data = self._data(f"label/{urllib.parse.quote(label)}/values", params, want=list)
        return sorted(v for v in data if isinstance(v, str))

    def series(self, metric: str, first: float, last: float) -> list[dict[str, str]]:
        """``/api/v1/series``: the label sets of ``metric``'s series with samples in ``[first,
        last]`` (from the index, at its blocks' granularity: a series just outside may be named too)."""
        params = {"match[]": metric, "start": _ts(first), "end": _ts(last)}
        data = self._data("series", params, want=list)
        return [{k: v for k, v in d.items() if isinstance(k, str) and isinstance(v, str)}
                for d in data if isinstance(d, dict)]

    def scrape_intervals(self) -> dict[str, float]:
        """``/api/v1/targets``: each active target's scrape interval in seconds, by its ``instance``
        label; {} when Prometheus does not say (an old version, a proxy that refuses the call)."""
        try:
            data = self._data("targets", {"state": "active"})
        except PrometheusError:
            return {}
        out: dict[str, float] = {}
        for t in data.get("activeTargets") or ():
            if not isinstance(t, dict) or not isinstance(t.get("labels"), dict):
                continue
            instance, every = t["labels"].get("instance"), _duration(t.get("scrapeInterval"))
            if isinstance(instance, str) and every:
                out[instance] = every
        return out

    def _get(self, endpoint: str, params: dict[str, str], want: str) -> list[dict[str, Any]]:
        data = self._data(endpoint, params)
        here = f"prometheus:{self.url}"
        if data.get("resultType") != want or not isinstance(data.get("result"), list):
            raise PrometheusError(f"/api/v1/{endpoint} answered {data.get('resultType')!r}, not {want!r}",
                                  source=here)
        return [r for r in data["result"] if isinstance(r, dict)]

    def _data(self, endpoint: str, params: dict[str, str], want: type = dict) -> Any:
        url = f"{self.url}/api/v1/{endpoint}?{urllib.parse.urlencode(params)}"
        here = f"prometheus:{self.url}"
        try:
            with urllib.request.urlopen(url, timeout=self.timeout_s) as resp:  # noqa: S310 - scheme checked
                raw = resp.read(MAX_BYTES + 1)
        except urllib.error.HTTPError as exc:
            why = _api_error(exc)
            raise PrometheusError(_refusal(why, params) or f"HTTP {exc.code} from /api/v1/{endpoint}: {why}",
                                  source=here) from None
        except urllib.error.URLError as exc:
            if isinstance(exc.reason, TimeoutError):
                raise PrometheusError(_too_slow(self.timeout_s, params), source=here) from None
            raise PrometheusError(f"unreachable: {_reason(exc.reason)}", source=here) from None
        except TimeoutError:  # while reading the answer
            raise PrometheusError(_too_slow(self.timeout_s, params), source=here) from None
        except (OSError, ValueError) as exc:  # a reset connection
            raise PrometheusError(f"unreachable: {_reason(exc)}", source=here) from None
        if len(raw) > MAX_BYTES:
            raise PrometheusError(f"answer larger than {MAX_BYTES >> 20} MiB to a query over "
                                  f"{_reach(params)}; use a larger --step or a shorter window", source=here)
        try:
            doc = json.loads(raw)
        except ValueError:
            raise PrometheusError(f"/api/v1/{endpoint} did not answer JSON: is this Prometheus?",
                                  source=here) from None
        data = doc.get("data") if isinstance(doc, dict) else None
        if not isinstance(doc, dict) or doc.get("status") != "success" or not isinstance(data, want):
            why = _one_line(str((doc.get("error") if isinstance(doc, dict) else None) or "no data"))
            raise PrometheusError(_refusal(why, params) or f"/api/v1/{endpoint} failed: {why}", source=here)
        return data


_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0, "y": 31536000.0}


def _duration(text: object) -> float | None:
    """A Prometheus duration (``15s``, ``1m30s``, ``500ms``) in seconds; None if it is not one."""
    if not isinstance(text, str) or not text:
        return None
    parts = re.findall(r"(\d+)(ms|s|m|h|d|w|y)", text)
    if not parts or "".join(n + u for n, u in parts) != text:
        return None
    total = sum(int(n) * _UNITS[u] for n, u in parts)
    return total if 0 < total < 1e9 else None


def series_key(item: dict[str, Any]) -> Key:
    metric = item.get("metric") or {}
    return tuple(sorted((str(k), str(v)) for k, v in metric.items() if k != "__name__"))


def _ts(t: float) -> str:
    return f"{t:.3f}"


def _api_error(exc: urllib.error.HTTPError) -> str:
    try:
        doc = json.loads(exc.read(1 << 16))
        return _one_line(str(doc.get("error") or exc.reason))
    except (ValueError, OSError, AttributeError):
        return _one_line(str(exc.reason))


def _reach(params: dict[str, str]) -> str:
    """What one request asked for, for an error: the span of the window it covers."""
    if "start" in params and "end" in params and "step" in params:
        seconds = float(params["end"]) - float(params["start"]) + float(params["step"])
    else:
        ranges = re.findall(r"\[(\d+)ms\]", params.get("query", ""))
        seconds = max((int(r) / 1000 for r in ranges), default=0.0)
    return span(seconds) if seconds else "an instant"


def _refusal(why: str, params: dict[str, str]) -> str | None:
    """Prometheus' own limits, named: a site's shared Prometheus keeps its defaults."""
    if "too many samples" in why:
        return (f"prometheus refused a query over {_reach(params)}: too many samples (its "
                "--query.max-samples); use a larger --step or a shorter window")
    if "query timed out" in why or "context deadline exceeded" in why:
        return (f"prometheus gave up on a query over {_reach(params)} (its --query.timeout); "
                "use a larger --step or a shorter window")
    return None


def _too_slow(timeout_s: float, params: dict[str, str]) -> str:
    return (f"no answer within {timeout_s:g} s to a query over {_reach(params)}: Prometheus is "
            "overloaded or the window too long for it; use a larger --step or a shorter window")


def _reason(reason: object) -> str:
    if isinstance(reason, OSError) and reason.strerror:
        return reason.strerror
    return _one_line(str(reason)) or type(reason).__name__


def _one_line(text: str) -> str:
    return " ".join(text.split())[:300]
