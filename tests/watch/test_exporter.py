"""The exporter without Prometheus: the exposition text, stale series, counters, the HTTP server."""

from __future__ import annotations

import re
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from tests.helpers.prom_helpers import free_port, normal_exposition

from gpuslurm.errors import InputError
from gpuslurm.samples import Allocation, Cycle, GpuSample, ProcSample, ScanProblem, Violation
from gpuslurm.watch.exporter import (
    MetricsState,
    cycle_samples,
    render,
    start_exporter,
)

G0 = "GPU-aaaaaaaa-0000-0000-0000-000000000000"
G1 = "GPU-bbbbbbbb-0000-0000-0000-000000000000"
M1 = "MIG-cccccccc-0000-0000-0000-000000000000"


def _cycle(ts: float, *, job: bool = True, rogue: bool = False) -> tuple[Cycle, list[Violation]]:
    gpus = (GpuSample(ts, G0, None, 75.0, 1024.0, 81559.0, 250.5, 60.0),
            GpuSample(ts, G1, M1, None, 512.0, 9856.0))  # a MIG device: no utilisation from NVML
    procs = [ProcSample(ts, G0, 4242, None, 'py"th\\on\nx', 0, "alice", "812" if job else None, 1024.0, 90.0)]
    allocs = (Allocation("812", "alice", 1000, (G0, M1), ts - 50, "physics"),) if job else ()
    violations = []
    if rogue:
        procs.append(ProcSample(ts, G1, 99, M1, "miner", 1001, "bob", None, 512.0))
        violations.append(Violation("rogue", "n1", "bob", None, 99, "miner", M1, 970.0, ts - 970.0,
                                    "miner (PID 99) of bob on MIG-…, but it is in no job", "critical"))
    return Cycle(ts, "n1", gpus, tuple(procs), allocs, (ScanProblem(ts, "pid-gone", "7"),)), violations


def _lines(text: str, prefix: str) -> list[str]:
    return [x for x in normal_exposition(text).splitlines() if x.startswith(prefix)]


def test_label_values_are_escaped_as_the_text_format_wants() -> None:
    cycle, _ = _cycle(1000.0)
    text = normal_exposition(render(cycle_samples(cycle, [])))
    assert 'process="py\\"th\\\\on\\nx"' in text
    assert f'gpuslurm_gpu_utilization_ratio{{node="n1",gpu_uuid="{G0}",mig_uuid=""}} 0.75' in text


def test_a_cycle_becomes_gauges_with_base_units_and_job_labels() -> None:
    cycle, violations = _cycle(1000.0, rogue=True)
    text = normal_exposition(render(cycle_samples(cycle, violations)))
    dev0 = f'node="n1",gpu_uuid="{G0}",mig_uuid=""'
    mig = f'node="n1",gpu_uuid="{G1}",mig_uuid="{M1}"'
    assert _lines(text, "gpuslurm_gpu_utilization_ratio{") == \
        [f"gpuslurm_gpu_utilization_ratio{{{dev0}}} 0.75"]
    assert f"gpuslurm_gpu_memory_used_bytes{{{mig}}} {512 << 20}" in text
    assert f"gpuslurm_gpu_power_watts{{{dev0}}} 250.5" in text
    assert "gpuslurm_gpu_power_watts{" + mig not in text  # unknown stays absent
    assert sorted(_lines(text, "gpuslurm_gpu_allocated{")) == sorted([
        f'gpuslurm_gpu_allocated{{{dev0},job_id="812",user="alice",account="physics"}} 1',
        f'gpuslurm_gpu_allocated{{{mig},job_id="812",user="alice",account="physics"}} 1'])
    assert _lines(text, "gpuslurm_process_gpu_memory_bytes{") == [
        f'gpuslurm_process_gpu_memory_bytes{{{dev0},job_id="812",user="alice",account="physics",pid="4242",'
        f'process="py\\"th\\\\on\\nx"}} {1024 << 20}',
        f'gpuslurm_process_gpu_memory_bytes{{{mig},job_id="",user="bob",account="",pid="99",'
        f'process="miner"}} {512 << 20}']
    assert _lines(text, "gpuslurm_process_sm_utilization_ratio{")[0].endswith(" 0.9")
    assert _lines(text, "gpuslurm_violation_active{") == [
        f'gpuslurm_violation_active{{{mig},job_id="",user="bob",account="",pid="99",process="miner",'
        'kind="rogue",severity="critical"} 1']
    assert _lines(text, "gpuslurm_violation_start_timestamp_seconds{")[0].endswith(" 970")
    assert 'gpuslurm_job_start_timestamp_seconds{node="n1",job_id="812",user="alice",account="physics"} 950' \
        in text
    # every family announces itself once, before its samples
    for name in ("gpu_utilization_ratio", "gpu_allocated", "violation_active"):
        help_at = text.index(f"# HELP gpuslurm_{name} ")
        assert text.index(f"# TYPE gpuslurm_{name} gauge") == text.index("\n", help_at) + 1
        assert text.count(f"# TYPE gpuslurm_{name} ") == 1


def test_a_free_device_reports_0_and_an_ended_job_leaves_no_series() -> None:
    state = MetricsState()
    cycle, violations = _cycle(1000.0, rogue=True)
    state.update(cycle, violations)
    busy = normal_exposition(state.body().decode())
    assert 'job_id="812"' in busy and "gpuslurm_violation_active{" in busy
    cycle, violations = _cycle(1001.0, job=False)
    state.update(cycle, violations)
    after = normal_exposition(state.body().decode())
    assert 'job_id="812"' not in after and 'account="physics"' not in after
    assert "gpuslurm_violation_active{" not in after and 'pid="99"' not in after
    assert f'gpuslurm_gpu_allocated{{node="n1",gpu_uuid="{G0}",mig_uuid="",job_id="",user="",account=""}} 0' \
        in after
    assert 'gpuslurm_monitor_cycles_total{node="n1"} 2' in after
    assert 'gpuslurm_monitor_problems_total{node="n1",kind="pid-gone"} 2' in after
    assert 'gpuslurm_violations_started_total{node="n1",kind="rogue"} 1' in after
    assert 'gpuslurm_monitor_last_cycle_timestamp_seconds{node="n1"} 1001' in after
    assert "gpuslurm_monitor_interval_seconds" not in after  # no interval given: none said


def test_the_monitor_interval_is_exported_for_the_report_to_end_jobs_by() -> None:
    state = MetricsState(interval_s=2.5)
    state.update(*_cycle(1000.0))
    text = normal_exposition(state.body().decode())
    assert 'gpuslurm_monitor_interval_seconds{node="n1"} 2.5' in text
    assert "# TYPE gpuslurm_monitor_interval_seconds gauge" in text


def test_an_ongoing_violation_is_counted_once() -> None:
    state = MetricsState()
    for ts in (1000.0, 1001.0, 1002.0):
        state.update(*_cycle(ts, rogue=True))
    text = normal_exposition(state.body().decode())
    assert 'gpuslurm_violations_started_total{node="n1",kind="rogue"} 1' in text


def test_by_default_no_series_per_process_only_counts_per_job_and_user() -> None:
    """A job that starts a process after another (new PIDs every minute) makes no new series by
    default: the series per device are one per job and user, whatever the PIDs."""
    state = MetricsState()
    assert not state.per_process
    texts = []
    for pid in (4242, 4243, 4244):
        cycle, violations = _cycle(1000.0 + pid, rogue=True)
        cycle = cycle._replace(procs=tuple(p._replace(pid=pid) if p.job_id else p for p in cycle.procs))
        state.update(cycle, violations)
        texts.append(normal_exposition(state.body().decode()))
    for text in texts:
        assert "gpuslurm_process_" not in text and "pid=" not in text and "process=" not in text
        assert f'gpuslurm_device_processes{{node="n1",gpu_uuid="{G0}",mig_uuid="",job_id="812",' \
            'user="alice",account="physics"} 1' in text
        assert f'gpuslurm_device_processes{{node="n1",gpu_uuid="{G1}",mig_uuid="{M1}",job_id="",' \
            'user="bob",account=""} 1' in text
        assert f'gpuslurm_violation_active{{node="n1",gpu_uuid="{G1}",mig_uuid="{M1}",job_id="",user="bob",' \
            'account="",kind="rogue",severity="critical"} 1' in text
    names = [{x.split(" ")[0] for x in t.splitlines() if not x.startswith("#")} for t in texts]
    assert names[0] == names[1] == names[2]  # the same series, whatever the PIDs
    on = MetricsState(per_process=True)
    on.update(*_cycle(1000.0, rogue=True))
    assert 'pid="4242"' in on.body().decode() and "gpuslurm_process_gpu_memory_bytes{" in on.body().decode()


def test_duplicate_series_are_written_once() -> None:
    cycle, _ = _cycle(1000.0)
    doubled = cycle._replace(allocations=cycle.allocations * 2)  # the same job from map and squeue
    text = render(cycle_samples(doubled, []))
    assert len(_lines(text, "gpuslurm_gpu_allocated{")) == 2


def test_the_server_serves_metrics_and_nothing_else() -> None:
    exporter = start_exporter("127.0.0.1", 0)
    try:
        exporter.state.update(*_cycle(1000.0))
        port = exporter.address[1]
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
            assert resp.headers["Content-Type"] == "text/plain; version=0.0.4; charset=utf-8"
            assert 'gpuslurm_gpu_utilization_ratio{node="n1"' in normal_exposition(resp.read().decode())
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/api/v1/query", timeout=5)
        assert err.value.code == 404
    finally:
        exporter.close()


def _site(tmp_path: Path) -> dict[str, str]:
    config = tmp_path / "gpuslurm.toml"
    config.write_text(f'[paths]\nrun_dir = "{tmp_path / "run"}"\nstate_dir = "{tmp_path / "state"}"\n'
                      f'violations_dir = "{tmp_path / "v"}"\nsqueue = "{tmp_path / "no-squeue"}"\n')
    return {"GPUSLURM_CONFIG": str(config), "PATH": "/usr/bin:/bin", "GPUSLURM_SCENARIO": ""}


def test_a_port_in_use_is_one_line_and_exit_2(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(InputError, match=f"cannot listen on 127.0.0.1:{port}: Address already in use"):
            start_exporter("127.0.0.1", port)
        done = subprocess.run([sys.executable, "-m", "gpuslurm", "monitor", "--from", "dgx-h100", "--once",
                               "--db", f"{tmp_path}/m.db", "--prometheus-port", str(port)],
                              capture_output=True, text=True, check=False, env=_site(tmp_path))
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().splitlines()[-1] == \
        f"gpuslurm: --prometheus-port: cannot listen on 127.0.0.1:{port}: Address already in use"


def test_the_monitor_serves_its_cycles(tmp_path: Path) -> None:
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "gpuslurm", "monitor", "--from", "dgx-h100", "--interval",
                             "0.2", "--db", f"{tmp_path}/m.db", "--prometheus-port", str(port)],
                            stderr=subprocess.PIPE, text=True, env=_site(tmp_path))
    try:
        cycles, text = 0, ""
        deadline = time.monotonic() + 20
        while cycles < 3 and time.monotonic() < deadline:
            time.sleep(0.1)
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as resp:
                    text = normal_exposition(resp.read().decode())
            except OSError:
                continue
            found = re.search(r'^gpuslurm_monitor_cycles_total\{node="[^"]+"\} (\d+)$', text, re.M)
            cycles = int(found.group(1)) if found else 0
        assert cycles >= 3, text
        assert len(_lines(text, "gpuslurm_gpu_utilization_ratio{")) == 8  # the DGX's GPUs, idle
    finally:
        proc.terminate()
        _out, err = proc.communicate(timeout=20)
    assert proc.returncode == 0, err
    assert f"serving metrics on http://127.0.0.1:{port}/metrics" in err
