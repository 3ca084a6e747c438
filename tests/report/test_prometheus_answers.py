"""The report from Prometheus against a forged exporter's series (any target the site's Prometheus
scrapes): labels and values no gpuslurm exporter writes are one line (exit 2), never a traceback.
The answers come from a client that plays Prometheus' HTTP API; no Prometheus is needed."""

from __future__ import annotations

from typing import Any

import pytest

from gpuslurm.errors import InputError
from gpuslurm.report.data import Gap
from gpuslurm.report.prometheus import PrometheusClient, load_prometheus

T0 = 1_700_000_000.0 - 1_700_000_000.0 % 3600
G0 = "GPU-00000000-aaaa"


class ForgedPrometheus(PrometheusClient):
    """Every series of one node and GPU, with the process's and the job's labels and values given."""

    def __init__(self, pid: str = "100", job_start: str = str(T0), job_end: str = str(T0 + 3000)) -> None:
        super().__init__("http://prometheus.invalid:9090")
        self.pid, self.job_start, self.job_end = pid, job_start, job_end

    def scrape_intervals(self) -> dict[str, float]:
        return {}

    def label_values(self, label: str, metric: str, first: float, last: float) -> list[str]:
        return ["n1"]

    def _value(self, query: str) -> tuple[dict[str, str], str]:
        gpu = {"node": "n1", "gpu_uuid": G0}
        job = {**gpu, "job_id": "7", "user": "alice"}
        if "gpuslurm_process_" in query:
            return {**job, "pid": self.pid, "process": "train"}, "0.5" if "ratio" in query else "6"
        if "gpuslurm_job_start" in query:
            return job, self.job_start
        if "gpuslurm_job_last_seen" in query:
            return job, self.job_end
        if "gpuslurm_gpu_allocated" in query:
            return job, "1"
        if "gpuslurm_device_processes" in query or "gpuslurm_violation" in query:
            return {}, ""
        return gpu, "0.5" if "ratio" in query else "6"

    def instant(self, query: str, at: float) -> list[dict[str, Any]]:
        labels, value = self._value(query)
        return [{"metric": labels, "value": [at, value]}] if labels else []

    def range(self, query: str, first: float, last: float, step_s: float) -> list[dict[str, Any]]:
        labels, value = self._value(query)
        n = round((last - first) / step_s) + 1
        return [{"metric": labels, "values": [[first + i * step_s, value] for i in range(n)]}] \
            if labels else []


def load(prom: ForgedPrometheus) -> Any:
    return load_prometheus(prom.url, T0, T0 + 3600, 60.0, client=prom)


def test_the_forged_prometheus_s_honest_series_load() -> None:
    data = load(ForgedPrometheus())
    assert [p.pid for p in data.procs] == [100] and data.allocations[0].start == T0


@pytest.mark.parametrize("pid", ["x1", "-5", "1e3", "99999999999999999999999"])
def test_a_forged_pid_label_is_one_line(pid: str) -> None:
    with pytest.raises(InputError) as bad:
        load(ForgedPrometheus(pid=pid))
    assert "\n" not in str(bad.value) and "pid" in str(bad.value)


@pytest.mark.parametrize("time", ["+Inf", "-Inf", "1e300", "-1"])
@pytest.mark.parametrize("which", ["job_start", "job_end"])
def test_a_forged_job_start_or_end_is_one_line(which: str, time: str) -> None:
    """An infinite start or end reached the report's figures and stopped them with a ValueError."""
    with pytest.raises(InputError) as bad:
        load(ForgedPrometheus(**{which: time}))
    assert "\n" not in str(bad.value) and "timestamp" in str(bad.value)


class GappedPrometheus(ForgedPrometheus):
    """Node n1 scraped every 10 s but in the bucket T0 + 10 min .. 11 min; its scrape times as
    ``times`` (a forged answer may hold anything there)."""

    def __init__(self, times: list[Any]) -> None:
        super().__init__()
        self.times = times

    def range(self, query: str, first: float, last: float, step_s: float) -> list[dict[str, Any]]:
        got = super().range(query, first, last, step_s)
        if query.startswith("count_over_time(gpuslurm_gpu_memory_total_bytes"):
            for r in got:
                r["values"] = [[t, "1" if t == T0 + 660 else v] for t, v in r["values"]]
        return got

    def _get(self, endpoint: str, params: dict[str, str], want: str) -> list[dict[str, Any]]:
        assert endpoint == "query" and want == "matrix" and params["query"].startswith(
            'gpuslurm_monitor_last_cycle_timestamp_seconds{node=~"n1"}['), params
        return [{"metric": {"node": "n1"}, "values": self.times}]


def test_a_node_s_gap_is_read_from_its_scrape_times() -> None:
    times = [[T0 + 550 + 10 * i, "1"] for i in range(11)] + [[T0 + 655, "1"]] + \
        [[T0 + 720 + 10 * i, "1"] for i in range(8)]  # 10 s apart but 655 → 720
    assert load(GappedPrometheus(times)).gaps == (Gap("n1", T0 + 655, T0 + 720),)


@pytest.mark.parametrize("junk", [["x", "1"], [1, 2, 3], "junk", None, ["+Inf", "1"], ["NaN", "1"],
                                  [{}, "1"]])
def test_forged_scrape_times_are_passed_over(junk: Any) -> None:
    """A forged answer's sample that is no [time, value] pair stopped the report with a traceback."""
    times = [[T0 + 600, "1"], junk, [T0 + 700, "1"]]
    assert load(GappedPrometheus(times)).gaps == (Gap("n1", T0 + 600, T0 + 700),)
