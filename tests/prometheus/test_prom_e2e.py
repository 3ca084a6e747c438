"""The cluster path end to end: a monitor replays a scenario with real processes in a real job
cgroup, its exporter is scraped every second by a real Prometheus, and the report read back from
Prometheus agrees with the report read from the monitor's SQLite store.

Why the tolerance is what it is. The monitor samples once a second (cycle times c₀, c₁, …) and
stores every cycle; Prometheus scrapes once a second with its own phase and stores, at each scrape
time, the values of the latest cycle. So a change of utilisation at cycle cₖ shows up in Prometheus
at the first scrape after cₖ: up to one second later, and a scrape may repeat one cycle or miss one
when the two clocks drift. Per change of a device's utilisation by Δu (0–1) the GPU-seconds of the
two sources can therefore differ by at most about 2 s × Δu (one sample late plus one sample
repeated or missed); buckets with no change within 2 s of their edges hold the same constant in
both and must agree exactly. A wrong bucket alignment (one bucket = 5 samples) breaks both checks.
"""

from __future__ import annotations

import itertools
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NamedTuple

import pytest
from tests.helpers.cgroup_paths import in_cgroup
from tests.helpers.prom_helpers import Prom, api, normal_exposition

from gpuslurm.hw.source import load_node
from gpuslurm.report import prom_client
from gpuslurm.report import prometheus as promsrc
from gpuslurm.report.compute import Policy, compute
from gpuslurm.report.data import ReportData
from gpuslurm.report.prometheus import load_prometheus, load_violations
from gpuslurm.report.query import load_sqlite
from gpuslurm.state.jobmap import JobMap, MappedDevice, write_map

NODE = load_node("dgx-h100")
U = [g.uuid for g in NODE.gpus]
FREEZER = Path("/sys/fs/cgroup/freezer")
NODE_NAME = "promnode1"
STEP_S = 5.0
WEIRD = 'tr"ain\\er'  # a process name that needs escaping in a label value
# (at, {device: util %}) for U0..U2: the scenario's utilisation changes
UTIL = [(0, {0: 90, 1: 0, 2: 0}), (8, {0: 30, 1: 60, 2: 100}), (16, {0: 0, 1: 50, 2: 0}),
        (24, {0: 0, 1: 0, 2: 0})]


class Run(NamedTuple):
    db: str
    url: str
    t0: float  # the scenario's start
    job: str
    trainer: int  # PID of the job's process (named WEIRD)
    rogue: int  # PID of the process in no job (user nobody)
    metrics_busy: str  # /metrics while the job ran
    metrics_after: str  # /metrics after the job ended
    stale_query: Any  # Prometheus' gpuslurm_gpu_allocated for the job, after it ended
    live_query: Any  # the same while it ran
    root: Path


def _fetch(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        return str(resp.read().decode())


def _scenario(t0: float, trainer: int, rogue: int) -> dict[str, Any]:
    steps = []
    for at, utils in UTIL:
        gpus = {U[i]: {"util": u, "power_w": 100 + u, "temp_c": 40} for i, u in utils.items() if u}
        procs: list[dict[str, Any]] = []
        if at < 24:
            sm = {"sm": utils[0]} if at < 16 else {}  # no SM figure: "unknown", not 0
            procs.append({"pid": trainer, "gpu": U[0], "mem_mib": 4000, **sm})
        if at == 8:
            procs.append({"pid": rogue, "gpu": U[2], "mem_mib": 1000})
        steps.append({"at": at, "gpus": gpus, "procs": procs})
    return {"start": t0, "steps": steps}


@pytest.fixture(scope="module")
def run(prometheus: Prom, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Run]:
    if os.geteuid() != 0 or not (FREEZER / "cgroup.procs").exists():
        pytest.skip("needs root and the cgroup v1 freezer hierarchy (to put a process in a job)")
    root = tmp_path_factory.mktemp("promrun")
    job = str(700000 + os.getpid() % 100000)
    jobs_dir = root / "run" / "jobs"
    config = root / "gpuslurm.toml"
    config.write_text(
        f'[paths]\nrun_dir = "{root / "run"}"\nstate_dir = "{root / "state"}"\n'
        f'violations_dir = "{root / "violations"}"\nsqueue = "{root / "no-squeue"}"\n'
        f'[monitor]\nnode_name = "{NODE_NAME}"\nprometheus_per_process = true\n'
        '[scheduler]\nkind = "slurm"\n')  # a Slurm node (squeue missing), even where PBS's qstat is
    binary = root / WEIRD
    shutil.copy("/bin/sleep", binary)
    trainer = subprocess.Popen([str(binary), "300"])
    rogue = subprocess.Popen(["/bin/sleep", "300"], user=65534, group=65534)
    db = str(root / "state" / "monitor.db")
    scenario = root / "scenario.json"
    t0 = time.time() + 4  # the monitor (and a few scrapes) start before the scenario does
    scenario.write_text(json.dumps(_scenario(t0, trainer.pid, rogue.pid)))
    write_map(JobMap(job, "root", 0, (MappedDevice(U[0], 0), MappedDevice(U[1], 1)), t0 - 100), str(jobs_dir))
    env = {**os.environ, "GPUSLURM_CONFIG": str(config), "GPUSLURM_SCENARIO": str(scenario)}
    monitor = None
    try:
        with in_cgroup(FREEZER, f"slurm/uid_0/job_{job}/step_0", trainer.pid):
            monitor = subprocess.Popen(
                [sys.executable, "-m", "gpuslurm", "monitor", "--from", "dgx-h100", "--interval", "1",
                 "--db", db, "--prometheus-port", str(prometheus.exporter_port)],
                env=env, stderr=subprocess.PIPE, text=True)
            _sleep_until(t0 + 12)
            busy = _fetch(prometheus.exporter_port)
            _sleep_until(t0 + 24)
            os.unlink(jobs_dir / f"{job}.json")  # the job ends (the epilog removes its map)
            _sleep_until(t0 + 28)
            after = _fetch(prometheus.exporter_port)
        _sleep_until(t0 + 30)
        monitor.send_signal(signal.SIGTERM)
        _out, err = monitor.communicate(timeout=20)
        assert monitor.returncode == 0, err
        time.sleep(2 * 1.0)  # the last scrapes (and their staleness markers) land
        query = f"/api/v1/query?query=gpuslurm_gpu_allocated%7Bjob_id%3D%22{job}%22%7D"
        stale = api(prometheus.url, f"{query}&time={t0 + 29:.3f}")
        live = api(prometheus.url, f"{query}&time={t0 + 12:.3f}")
        yield Run(db, prometheus.url, t0, job, trainer.pid, rogue.pid, busy, after, stale, live, root)
    finally:
        if monitor is not None and monitor.poll() is None:
            monitor.kill()
            monitor.wait()
        for p in (trainer, rogue):
            p.kill()
            p.wait()


def _sleep_until(t: float) -> None:
    time.sleep(max(0.0, t - time.time()))


def test_metrics_parse_with_promtool_and_follow_the_conventions(run: Run, promtool: str) -> None:
    for text in (run.metrics_busy, run.metrics_after):
        done = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True, text=True,
                              check=False)
        assert done.returncode == 0, done.stdout + done.stderr
    text = normal_exposition(run.metrics_busy)
    assert "# TYPE gpuslurm_gpu_utilization_ratio gauge" in text
    assert "# TYPE gpuslurm_monitor_cycles_total counter" in text
    line = next(x for x in text.splitlines() if x.startswith("gpuslurm_process_gpu_memory_bytes{")
                and f'pid="{run.trainer}"' in x)
    # the label value is escaped: tr"ain\er → tr\"ain\\er
    assert 'process="tr\\"ain\\\\er"' in line
    assert f'job_id="{run.job}"' in line and 'user="root"' in line and f'node="{NODE_NAME}"' in line
    assert line.endswith(f" {4000 * 1048576}")
    head = f'gpuslurm_gpu_utilization_ratio{{node="{NODE_NAME}",gpu_uuid="{U[0]}"'
    util = [x for x in text.splitlines() if x.startswith(head)]
    assert util == [f'gpuslurm_gpu_utilization_ratio{{node="{NODE_NAME}",gpu_uuid="{U[0]}",mig_uuid=""}} 0.3']
    assert 'kind="rogue"' in text and f'pid="{run.rogue}"' in text and 'user="nobody"' in text


def test_series_of_an_ended_job_vanish_from_metrics_and_go_stale(run: Run) -> None:
    assert f'job_id="{run.job}"' in normal_exposition(run.metrics_busy)
    assert f'job_id="{run.job}"' not in normal_exposition(run.metrics_after)
    assert f'gpuslurm_gpu_allocated{{node="{NODE_NAME}",gpu_uuid="{U[0]}",mig_uuid="",job_id="",user="",' \
           'account=""} 0' in normal_exposition(run.metrics_after)
    assert "gpuslurm_violation_active{" not in normal_exposition(run.metrics_after)  # the rogue left at 16 s
    after = normal_exposition(run.metrics_after)
    assert f'gpuslurm_violations_started_total{{node="{NODE_NAME}",kind="rogue"}} 1' in after
    assert sorted(r["metric"]["gpu_uuid"] for r in run.live_query["data"]["result"]) == sorted(U[:2])
    assert run.stale_query["status"] == "success" and run.stale_query["data"]["result"] == []


def _busy_seconds(data: ReportData, device: str) -> list[tuple[float, float, float]]:
    """(lo, hi, busy GPU-seconds) per bucket of ``device``."""
    series = next(g for g in data.gpus if g.uuid == device and g.node == NODE_NAME)
    out = []
    for b, u in enumerate(series.util):
        lo, hi = data.bucket_span(b)
        out.append((lo, hi, (u or 0.0) / 100 * (hi - lo)))
    return out


def _tolerance(t0: float, device: int) -> float:
    changes = [abs(b[1][device] - a[1][device]) / 100 for a, b in itertools.pairwise(UTIL)]
    return 2.0 * (UTIL[0][1][device] / 100 + sum(changes)) + 1e-6


def _truth(run: Run, device: int, since: float, until: float) -> float:
    """The busy GPU-seconds the scenario describes for ``device`` in the window."""
    total = 0.0
    for (at, utils), nxt in zip(UTIL, [*UTIL[1:], (10**9, {})], strict=True):
        lo, hi = max(run.t0 + at, since), min(run.t0 + nxt[0], until)
        total += max(0.0, hi - lo) * utils[device] / 100
    return total


def _window(run: Run) -> tuple[float, float]:
    """Off the 5 s grid at both ends, so the clipped first and last buckets are read separately;
    each clipped bucket is 2.5 s long: a shorter one may hold a sample in one source and none in
    the other (one cycle, one scrape a second)."""
    first = math.ceil((run.t0 + 5) / STEP_S) * STEP_S
    last = math.ceil((run.t0 + 15) / STEP_S) * STEP_S
    return first - 2.5, last + 2.5


def test_report_data_from_prometheus_agrees_with_sqlite(run: Run) -> None:
    since, until = _window(run)
    lite = load_sqlite(run.db, since, until, STEP_S)
    prom = load_prometheus(f"prometheus:{run.url}", since, until, STEP_S)
    assert prom.start == lite.start and prom.buckets == lite.buckets
    assert since % STEP_S and until % STEP_S, "both clipped buckets are exercised"
    mine = [g for g in prom.gpus if g.node == NODE_NAME]
    assert sorted(g.uuid for g in mine) == sorted(g.uuid for g in lite.gpus) == sorted(U)
    changes = [run.t0 + at for at, _ in UTIL]
    for i in range(3):
        a, b = _busy_seconds(lite, U[i]), _busy_seconds(prom, U[i])
        assert abs(sum(x[2] for x in a) - sum(x[2] for x in b)) <= _tolerance(run.t0, i), (i, a, b)
        for (lo, hi, x), (_, _, y) in zip(a, b, strict=True):
            if not any(lo - 2 <= c <= hi + 2 for c in changes):
                assert abs(x - y) < 1e-6, (i, lo - run.t0, hi - run.t0, x, y)
        assert abs(sum(x[2] for x in b) - _truth(run, i, since, until)) <= _tolerance(run.t0, i), (i, b)

    def procs(d: ReportData) -> dict[tuple[str, int], Any]:
        return {(p.device, p.pid): p for p in d.procs if p.node == NODE_NAME}

    lp, pp = procs(lite), procs(prom)
    assert set(lp) == set(pp) == {(U[0], run.trainer), (U[2], run.rogue)}
    for key, p in pp.items():
        assert (p.name, p.user, p.job_id) == (lp[key].name, lp[key].user, lp[key].job_id)
        assert abs(sum(p.seen) - sum(lp[key].seen)) <= 2 * 2 / STEP_S + 1e-6  # 2 samples at each end
    assert pp[(U[0], run.trainer)].name == WEIRD and pp[(U[0], run.trainer)].job_id == run.job

    (la,) = lite.allocations
    (pa,) = [a for a in prom.allocations if a.node == NODE_NAME]
    assert (pa.job_id, pa.user, sorted(pa.devices), pa.start) == \
        (la.job_id, la.user, sorted(la.devices), la.start)
    # both end the job one interval after its last sighting (report.data.held_until): the store
    # adds the median gap between the monitor's cycles, Prometheus the scrape interval (1 s
    # each, up to the cycles' jitter); a scrape may miss the last cycle
    assert la.end - 1.5 <= pa.end <= la.end + 0.05 and pa.end > until  # the job went on after the window

    (lv,) = lite.violations
    (pv,) = [v for v in prom.violations if v.node == NODE_NAME]
    assert (pv.kind, pv.user, pv.pid, pv.gpu_uuid, pv.job_id, pv.process, pv.start, pv.severity) == \
        (lv.kind, lv.user, lv.pid, lv.gpu_uuid, lv.job_id, lv.process, lv.start, lv.severity)
    assert lv.duration_s - 1.5 <= pv.duration_s <= lv.duration_s


def test_the_fair_share_report_is_the_same_from_both_sources(run: Run) -> None:
    since, until = _window(run)
    policy = Policy(quota_of=lambda user, account: 0.25, account_quotas={})
    lite = compute(load_sqlite(run.db, since, until, STEP_S), "user", policy)
    prom = compute(load_prometheus(f"prometheus:{run.url}", since, until, STEP_S), "user", policy)
    devices = {"root": (0, 1), "nobody": (2,)}  # the job's GPUs; the rogue's
    rows = {r.key: r for r in lite.rows}
    assert {r.key for r in prom.rows} == set(rows) == set(devices)
    for r in prom.rows:
        want = rows[r.key]
        tol_h = sum(_tolerance(run.t0, i) for i in devices[r.key]) / 3600
        assert abs(r.allocated_gpu_hours - want.allocated_gpu_hours) <= 1.5 * 2 / 3600, r.key
        assert abs(r.used_gpu_hours - want.used_gpu_hours) <= tol_h, r.key
        assert abs(r.idle_gpu_hours - want.idle_gpu_hours) <= tol_h + 1.5 * 2 / 3600, r.key
        assert (r.jobs, r.violations) == (want.jobs, want.violations), r.key
    assert rows["nobody"].used_gpu_hours > 3 / 3600  # the rogue's busy GPU shows in both


def test_buckets_the_monitor_covered_in_part_count_only_that_part(run: Run) -> None:
    """Buckets of 2 min around the monitor's 34 s of life: each covered in part, in both sources
    (samples × interval). Without the coverage, the mean utilisation of those seconds would count
    for whole buckets; with it, used + idle stays within allocated + outside-Slurm in both."""
    step = 120.0
    since, until = run.t0 - 125, run.t0 + 115
    lite = load_sqlite(run.db, since, until, step)
    prom = load_prometheus(f"prometheus:{run.url}", since, until, step)
    for data in (lite, prom):
        for g in (g for g in data.gpus if g.node == NODE_NAME):
            covered = sum(c * (hi - lo) for c, (lo, hi) in
                          zip(g.cover, (data.bucket_span(b) for b in range(data.buckets)), strict=True))
            assert 28 <= covered <= 40, (data.source, g.uuid, g.cover)  # the monitor's life, ±scrapes
    policy = Policy(quota_of=lambda user, account: 0.25, account_quotas={})
    rows = {r.key: r for r in compute(lite, "user", policy).rows}
    for r in compute(prom, "user", policy).rows:
        assert abs(r.used_gpu_hours - rows[r.key].used_gpu_hours) <= 4 / 3600, r.key
        assert r.used_gpu_hours <= 34 * 3 / 3600  # 3 GPUs at most, for the monitor's life at most
        if r.key == "root":  # the job (GPUs 0, 1): its idle is its measured time less its busy time
            assert r.used_gpu_hours + r.idle_gpu_hours <= r.allocated_gpu_hours + 1e-9
            assert r.unmeasured_gpu_hours > 0


def test_long_ranges_are_split_and_give_the_same_answer(run: Run, monkeypatch: pytest.MonkeyPatch) -> None:
    since, until = run.t0 - 3, run.t0 + 27
    whole = load_prometheus(f"prometheus:{run.url}", since, until, 1.0)
    calls: list[str] = []
    real_get = promsrc.PrometheusClient._get

    def counting(self: promsrc.PrometheusClient, endpoint: str, params: dict[str, str], want: str) -> Any:
        calls.append(endpoint)
        return real_get(self, endpoint, params, want)

    monkeypatch.setattr(prom_client, "MAX_POINTS", 7)  # the client splits ranges
    monkeypatch.setattr(promsrc.PrometheusClient, "_get", counting)
    split = load_prometheus(f"prometheus:{run.url}", since, until, 1.0)
    assert calls.count("query_range") >= 5 * (30 // 7)  # every bucketed query went in parts
    assert split == whole


def test_violations_for_the_throttle_come_from_prometheus(run: Run, tmp_path: Path) -> None:
    found = [v for v in load_violations(run.url, run.t0, run.t0 + 30) if v.node == NODE_NAME]
    assert [(v.kind, v.user, v.pid, v.gpu_uuid) for v in found] == [("rogue", "nobody", run.rogue, U[2])]
    assert 6 <= found[0].duration_s <= 8.5 and "PID" in found[0].evidence
    throttle = tmp_path / "etc" / "gpuslurm-throttle"
    config = tmp_path / "gpuslurm.toml"
    config.write_text(f'[throttle]\nfile = "{throttle}"\nsync_kinds = ["rogue"]\nsync_minutes = 600\n')
    env = {**os.environ, "GPUSLURM_CONFIG": str(config)}
    done = subprocess.run([sys.executable, "-m", "gpuslurm", "throttle", "sync", "--source",
                           f"prometheus:{run.url}"], env=env, capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    assert "throttled nobody (reject)" in done.stdout
    assert [line.split("\t")[0] for line in throttle.read_text().splitlines() if not line.startswith("#")] \
        == ["nobody"]


def test_the_report_command_reads_either_source(run: Run) -> None:
    since, until = _window(run)
    docs = []
    for source in (f"sqlite:{run.db}", f"prometheus:{run.url}"):
        done = subprocess.run([sys.executable, "-m", "gpuslurm", "fairshare-report", "--since", f"@{since}",
                               "--until", f"@{until}", "--source", source, "--format", "json"],
                              env={**os.environ, "GPUSLURM_CONFIG": str(run.root / "gpuslurm.toml")},
                              capture_output=True, text=True, check=False)
        assert done.returncode == 0, done.stderr
        docs.append(json.loads(done.stdout))
    lite, prom = docs
    assert (lite["source"], prom["source"]) == (f"sqlite:{run.db}", f"prometheus:{run.url}")
    tol_h = sum(_tolerance(run.t0, i) for i in range(3)) / 3600 + 1e-4  # + the JSON's rounding
    for field in ("allocated_gpu_hours", "used_gpu_hours", "idle_gpu_hours"):
        assert abs(lite["totals"][field] - prom["totals"][field]) <= tol_h, field
    assert lite["totals"]["used_gpu_hours"] > 0.003
    assert (lite["totals"]["gpus"], lite["totals"]["violations"]) == \
        (prom["totals"]["gpus"], prom["totals"]["violations"]) == (8, 1)
    assert [r["key"] for r in lite["rows"]] == [r["key"] for r in prom["rows"]]
