"""The report across a cluster: three node monitors, each replaying a different bundle into its
own SQLite store and serving its exporter on its own loopback port, one real Prometheus scraping
all three; the report read from Prometheus is the sum of the three nodes' own reports.

The clocks, and why the comparison is exact where it says so. The monitors cycle every
``MONITOR_S`` (2 s), on a fixed schedule; Prometheus scrapes every ``SCRAPE_S`` (1 s), with its own
phase. Every cycle is therefore seen by one scrape at least (two, unless a scrape fails), so a job's
last cycle reaches Prometheus, and both sources end the job at that cycle plus the monitor's
interval (report.data.held_until): **allocated is exact**. Each device's utilisation is constant
through the window (jobs start before it; the job that ends in it is idle), the whole buckets are
20 s and the clipped ones 4 s and 6 s: multiples of both intervals, so a constant counts as
often in both sources (a cycle stands for 2 s, a scrape for 1 s): **used agrees within 0.1 %**
(it differs only when a cycle runs late across a bucket's edge: the test then allows that cycle,
see _edge_allowance). The window starts on a whole
second, which no Prometheus scrape phase shares but by chance (the phase is a hash of the target).
One node's monitor is killed inside the window and started again: that node's time without
samples is unmeasured in both, and the report names the node and the gap.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NamedTuple

import pytest
from tests.helpers.cgroup_paths import in_cgroup
from tests.helpers.prom_helpers import PROMETHEUS, free_port, running_prometheus

from gpuslurm.hw.source import load_node
from gpuslurm.report.compute import Policy, Report, compute
from gpuslurm.report.data import bucket_start
from gpuslurm.report.prometheus import load_prometheus, load_violations
from gpuslurm.report.query import load_sqlite
from gpuslurm.slurm.throttle import read_violations
from gpuslurm.state.jobmap import JobMap, MappedDevice, write_map
from gpuslurm.watch.admission import prometheus_utilisation

FREEZER = Path("/sys/fs/cgroup/freezer")
MONITOR_S = 2.0
SCRAPE_S = 1.0
STEP_S = 20.0
DGX, L40S, MIG = load_node("dgx-h100"), load_node("l40s-4x"), load_node("a100-mig")
D = [g.uuid for g in DGX.gpus]
L = [g.uuid for g in L40S.gpus]
MIG_GPU = next(g for g in MIG.gpus if g.mig_mode and g.mig_devices)
MIG_DEV = str(MIG_GPU.mig_devices[0].uuid)
NODES = ("xnode1", "xnode2", "xnode3")
BUNDLES = {"xnode1": "dgx-h100", "xnode2": "l40s-4x", "xnode3": "a100-mig"}
PER_PROCESS = {"xnode1": True, "xnode2": False, "xnode3": False}  # both exporter configurations
GAP_NODE = "xnode3"
LONG_GAP_S = 10.0  # GAP_NODE's monitor is down 14-16 s; shorter gaps are the machine's load
# each node's utilisation, % per device, constant from the scenario's start on
UTIL = {"xnode1": {D[0]: 80, D[1]: 30}, "xnode2": {L[0]: 60, L[1]: 100, L[3]: 40}, "xnode3": {}}
EDGE_S = 0.1  # a cycle this close to a bucket edge may cross it by running late
POLICY = Policy(quota_of=lambda user, account: 0.25, account_quotas={})


class Cluster(NamedTuple):
    url: str
    root: Path
    since: float
    until: float
    dbs: dict[str, str]
    killed: float  # when GAP_NODE's monitor was killed
    restarted: float  # when it was started again
    jobs: dict[str, str]  # name → job id


def _sleep_until(t: float) -> None:
    time.sleep(max(0.0, t - time.time()))


def _config(root: Path, node: str) -> Path:
    path = root / node / "gpuslurm.toml"
    path.parent.mkdir(parents=True)
    path.write_text(
        f'[paths]\nrun_dir = "{root / node / "run"}"\nstate_dir = "{root / node / "state"}"\n'
        f'violations_dir = "{root / "violations"}"\nsqueue = "{root / "no-squeue"}"\n'
        f'[monitor]\nnode_name = "{node}"\nprometheus_per_process = {str(PER_PROCESS[node]).lower()}\n'
        '[scheduler]\nkind = "slurm"\n'
        f'[throttle]\nfile = "{root / node / "throttle"}"\nsync_kinds = ["rogue"]\nsync_minutes = 600\n')
    return path


def _scenario(path: Path, t0: float, gpus: dict[str, int], procs: list[dict[str, Any]]) -> Path:
    """One step from ``t0`` on: each device's utilisation is constant through the window."""
    doc = {"start": t0, "steps": [{"at": 0, "gpus": {u: {"util": v, "power_w": 100 + v, "temp_c": 40}
                                                      for u, v in gpus.items()}, "procs": procs}]}
    path.write_text(json.dumps(doc))
    return path


def _monitor(root: Path, node: str, port: int) -> subprocess.Popen[str]:
    env = {**os.environ, "GPUSLURM_CONFIG": str(root / node / "gpuslurm.toml"),
           "GPUSLURM_SCENARIO": str(root / node / "scenario.json")}
    return subprocess.Popen(
        [sys.executable, "-m", "gpuslurm", "monitor", "--from", BUNDLES[node], "--interval", f"{MONITOR_S:g}",
         "--db", str(root / node / "state" / "monitor.db"), "--prometheus-port", str(port)],
        env=env, stdout=subprocess.DEVNULL, stderr=(root / node / "monitor.err").open("a"), text=True)


def _wait_scraped(url: str, node: str, after: float, deadline_s: float = 60.0) -> None:
    """Until Prometheus holds a sample of ``node`` newer than ``after`` (a generous deadline)."""
    from tests.helpers.prom_helpers import api

    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        got = api(url, f"/api/v1/query?query=timestamp(gpuslurm_monitor_last_cycle_timestamp_seconds"
                       f"%7Bnode%3D%22{node}%22%7D)")
        if any(float(r["value"][1]) > after for r in got["data"]["result"]):
            return
        time.sleep(0.5)
    pytest.fail(f"Prometheus scraped no sample of {node} after {after:.1f} within {deadline_s:g} s")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    if not os.access(PROMETHEUS, os.X_OK):
        if os.environ.get("CI") == "true":
            pytest.fail(f"{PROMETHEUS} is absent under CI (.ci/run installs prometheus)")
        pytest.skip(f"{PROMETHEUS} is absent: apt-get install prometheus (.ci/run does)")
    if os.geteuid() != 0 or not (FREEZER / "cgroup.procs").exists():
        pytest.skip("needs root and the cgroup v1 freezer hierarchy (to put processes in jobs)")
    root = tmp_path_factory.mktemp("cluster")
    ports = {node: free_port() for node in NODES}
    for node in NODES:
        _config(root, node)
    base = 800000 + os.getpid() % 50000 * 4
    jobs = {"train": str(base), "idle": str(base + 1), "l40s": str(base + 2), "mig": str(base + 3)}
    # the bucket grid point the window is cut around; the scenario starts 10 s before it
    g = math.ceil((time.time() + 16) / STEP_S) * STEP_S
    t0 = g - 10
    since, until = g - 4, g + 2 * STEP_S + 6  # clipped buckets of 4 s and 6 s, two whole ones
    killed_at, restart_at, idle_ends = g + 8, g + 24, g + 15

    stack = contextlib.ExitStack()
    procs: list[subprocess.Popen[bytes]] = []
    monitors: dict[str, subprocess.Popen[str]] = {}

    def sleeper(user: int = 0) -> subprocess.Popen[bytes]:
        p = subprocess.Popen(["/bin/sleep", "600"], user=user, group=user)
        procs.append(p)
        return p

    try:
        trainer, daemon_proc, mig_proc = sleeper(), sleeper(1), sleeper()
        rogue = sleeper(65534)
        stack.enter_context(in_cgroup(FREEZER, f"slurm/uid_0/job_{jobs['train']}/step_0", trainer.pid))
        stack.enter_context(in_cgroup(FREEZER, f"slurm/uid_1/job_{jobs['l40s']}/step_0", daemon_proc.pid))
        stack.enter_context(in_cgroup(FREEZER, f"slurm/uid_0/job_{jobs['mig']}/step_0", mig_proc.pid))
        start = t0 - 100
        maps = {node: str(root / node / "run" / "jobs") for node in NODES}
        write_map(JobMap(jobs["train"], "root", 0, (MappedDevice(D[0], 0), MappedDevice(D[1], 1)), start,
                         "acct-a"), maps["xnode1"])
        write_map(JobMap(jobs["idle"], "daemon", 1, (MappedDevice(D[2], 2),), start, "acct-b"),
                  maps["xnode1"])
        write_map(JobMap(jobs["l40s"], "daemon", 1, (MappedDevice(L[0], 2), MappedDevice(L[1], 3)), start,
                         "acct-b"), maps["xnode2"])
        write_map(JobMap(jobs["mig"], "root", 0, (MappedDevice(MIG_DEV, MIG_GPU.minor, None, MIG_GPU.uuid),),
                         start, "acct-a"), maps["xnode3"])
        _scenario(root / "xnode1" / "scenario.json", t0, UTIL["xnode1"],
                  [{"pid": trainer.pid, "gpu": D[0], "mem_mib": 4000}])
        _scenario(root / "xnode2" / "scenario.json", t0, UTIL["xnode2"],
                  [{"pid": daemon_proc.pid, "gpu": L[0], "mem_mib": 2000},
                   {"pid": rogue.pid, "gpu": L[3], "mem_mib": 1000}])
        _scenario(root / "xnode3" / "scenario.json", t0, UTIL["xnode3"],
                  [{"pid": mig_proc.pid, "gpu": MIG_DEV, "mem_mib": 700}])
        url = stack.enter_context(running_prometheus(
            root, [f"127.0.0.1:{ports[n]}" for n in NODES], SCRAPE_S))
        for node in NODES:
            monitors[node] = _monitor(root, node, ports[node])
        _sleep_until(idle_ends)
        os.unlink(Path(maps["xnode1"]) / f"{jobs['idle']}.json")  # the idle job ends (the epilog)
        _sleep_until(killed_at)
        monitors[GAP_NODE].send_signal(signal.SIGKILL)  # its node's monitor dies
        monitors[GAP_NODE].wait()
        killed = time.time()
        _sleep_until(max(restart_at, killed + 14))  # down 14 s at least, however late the kill
        restarted = time.time()
        monitors[GAP_NODE] = _monitor(root, GAP_NODE, ports[GAP_NODE])
        _sleep_until(until + 2 * MONITOR_S)
        for node in NODES:  # the window's last cycles have reached Prometheus
            _wait_scraped(url, node, until + MONITOR_S)
        dbs = {node: str(root / node / "state" / "monitor.db") for node in NODES}
        yield Cluster(url, root, since, until, dbs, killed, restarted, jobs)
    finally:
        for m in monitors.values():
            if m.poll() is None:
                m.send_signal(signal.SIGTERM)
        for m in monitors.values():
            try:
                m.wait(timeout=30)
            except subprocess.TimeoutExpired:
                m.kill()
                m.wait()
        for p in procs:
            p.kill()
            p.wait()
        stack.close()


def _env(cluster: Cluster) -> dict[str, str]:
    return {**os.environ, "GPUSLURM_CONFIG": str(cluster.root / "xnode1" / "gpuslurm.toml")}


def _edge_allowance(cluster: Cluster, step_s: float) -> float:
    """GPU-seconds a late cycle may move across a bucket edge: 0 unless a node's cycle fell within
    EDGE_S of an edge (the cycles' phase is the monitor's start, by chance; they run up to about
    25 ms late here). Such a cycle, counted in the next bucket by the store, leaves its bucket one
    sample short and the next one capped at full: the store loses one cycle of that node's
    utilisation, which the scrapes (on their own phase) keep."""
    start = bucket_start(cluster.since, step_s)
    inner = (start + k * step_s for k in range(1, 1000))
    edges = [cluster.since, *(e for e in inner if e < cluster.until), cluster.until]
    out = 0.0
    for node, utils in UTIL.items():
        with contextlib.closing(sqlite3.connect(f"file:{cluster.dbs[node]}?mode=ro", uri=True)) as conn:
            times = [t for (t,) in conn.execute("SELECT DISTINCT ts FROM gpu_sample WHERE ts > ? AND ts < ?",
                                                (cluster.since - 1, cluster.until + 1))]
        if any(abs(t - e) < EDGE_S for t in times for e in edges):
            out += MONITOR_S * sum(utils.values()) / 100
    return out


def _rows(report: Report) -> dict[str, dict[str, float]]:
    return {r.key: {"allocated": r.allocated_gpu_hours * 3600, "used": r.used_gpu_hours * 3600,
                    "idle": r.idle_gpu_hours * 3600, "unmeasured": r.unmeasured_gpu_hours * 3600,
                    "jobs": r.jobs, "violations": r.violations} for r in report.rows}


def _summed(reports: list[Report]) -> dict[str, dict[str, float]]:
    out: dict[str, dict[str, float]] = {}
    for report in reports:
        for key, fields in _rows(report).items():
            mine = out.setdefault(key, dict.fromkeys(fields, 0.0))
            for f, v in fields.items():
                mine[f] += v
    return out


@pytest.mark.parametrize("by", ["user", "account"])
def test_the_prometheus_report_is_the_sum_of_the_node_reports(cluster: Cluster, by: str) -> None:
    nodes = [compute(load_sqlite(cluster.dbs[n], cluster.since, cluster.until, STEP_S), by, POLICY)
             for n in NODES]
    whole = compute(load_prometheus(f"prometheus:{cluster.url}", cluster.since, cluster.until, STEP_S),
                    by, POLICY)
    want, got = _summed(nodes), _rows(whole)
    late = _edge_allowance(cluster, STEP_S)
    assert set(got) == set(want), (got, want)
    expected_keys = {"user": {"root", "daemon", "nobody"}, "account": {"acct-a", "acct-b", "(nobody)"}}[by]
    assert set(got) >= expected_keys - {"(nobody)"}, got
    for key in want:
        w, p = want[key], got[key]
        assert abs(p["allocated"] - w["allocated"]) <= 0.01, (key, "allocated", p, w)  # ms of cycle jitter
        assert abs(p["used"] - w["used"]) <= 0.001 * w["used"] + late + 1e-9, (key, "used", p, w, late)
        assert (p["jobs"], p["violations"]) == (w["jobs"], w["violations"]), (key, p, w)
    total = sum(r["allocated"] for r in want.values())
    assert total > 0 and sum(r["used"] for r in want.values()) > 0


def test_the_report_commands_agree_in_json(cluster: Cluster) -> None:
    docs = {}
    for name, source in [*((n, f"sqlite:{cluster.dbs[n]}") for n in NODES),
                         ("prometheus", f"prometheus:{cluster.url}")]:
        done = subprocess.run([sys.executable, "-m", "gpuslurm", "fairshare-report", "--since",
                               f"@{cluster.since}", "--until", f"@{cluster.until}", "--source", source,
                               "--format", "json", "--by", "account"],
                              env=_env(cluster),
                              capture_output=True, text=True, check=False)
        assert done.returncode == 0, done.stderr
        docs[name] = json.loads(done.stdout)
    prom = docs.pop("prometheus")
    late = _edge_allowance(cluster, prom["step_s"])
    # the command's least step, 60 s: the clipped buckets still last whole cycles (an even number of s)
    assert prom["step_s"] == 60
    for field in ("allocated_gpu_hours", "used_gpu_hours"):
        want = sum(d["totals"][field] for d in docs.values())
        # each JSON figure is rounded to 4 decimals: three of them may drift by 1.5 in the last place
        assert abs(prom["totals"][field] - want) <= 1.5e-4 + 0.001 * want + late / 3600, field
    assert prom["totals"]["gpus"] == sum(d["totals"]["gpus"] for d in docs.values())


def test_the_throttle_policy_reads_the_same_violations_from_both(cluster: Cluster) -> None:
    scan = read_violations(str(cluster.root / "violations"), since=cluster.since - 600)
    # the directory holds a line each time a monitor publishes a finding (again as it lasts):
    # the same findings are the same kind, node, user, device and start
    from_dir = sorted({(v.kind, v.node, v.user, v.gpu_uuid, v.start) for v in scan.violations})
    from_prom = sorted({(v.kind, v.node, v.user, v.gpu_uuid, v.start)
                        for v in load_violations(cluster.url, cluster.since - 600, cluster.until)})
    assert from_dir == from_prom and [x[:3] for x in from_dir] == [("rogue", "xnode2", "nobody")]
    outs = []
    for extra in ([], ["--source", f"prometheus:{cluster.url}"]):
        done = subprocess.run([sys.executable, "-m", "gpuslurm", "throttle", "sync", "--dry-run", *extra],
                              env=_env(cluster),
                              capture_output=True, text=True, check=False)
        assert done.returncode == 0, done.stderr
        outs.append([line.split(":")[0] for line in done.stdout.splitlines()])
    assert outs[0] == outs[1] and outs[0][0].startswith("would throttle nobody (reject)"), outs


def test_throttle_auto_reads_the_cluster_s_utilisation_as_the_stores_hold_it(cluster: Cluster) -> None:
    """throttle auto has one source, Prometheus (the mean of every device's mean over 5 min): it is
    the mean of the three stores' devices over the same 5 min. A device's mean may differ by a
    cycle's weight where its utilisation changed (the scenario's start, 0 → u), hence 1.5 cycles."""
    at = cluster.until
    means: list[float] = []
    fewest = math.inf
    for db in cluster.dbs.values():
        with contextlib.closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True)) as conn:
            rows = conn.execute("SELECT avg(util_pct) / 100, count(*) FROM gpu_sample WHERE ts > ? "
                                "AND ts <= ? AND util_pct IS NOT NULL GROUP BY device", (at - 300, at))
            for mean, n in rows:
                means.append(mean)
                fewest = min(fewest, n)
    prom = prometheus_utilisation(cluster.url, at, 30.0)
    assert len(means) == 8 + 4 + 1  # the MIG devices report no utilisation, the A100 outside MIG does
    assert prom is not None and abs(prom - sum(means) / len(means)) <= 1.5 / fewest, (prom, means, fewest)
    assert prom > 0.1  # 3.1 GPUs busy of 13 once the scenario runs; 0 before it (the first 6 to 26 s)


def test_a_node_whose_monitor_was_down_is_named_with_its_gap(cluster: Cluster) -> None:
    data = load_prometheus(f"prometheus:{cluster.url}", cluster.since, cluster.until, STEP_S)
    # a loaded machine can miss three one-second scrapes (or a monitor two-second cycles) of any
    # node: such short gaps are named too, rightly, but are not the 14 s or more this test makes
    gaps = [g for g in data.gaps if g.end - g.start >= LONG_GAP_S]
    assert [g.node for g in gaps] == [GAP_NODE], data.gaps
    (gap,) = gaps
    # the last sample before the kill, the first after the restart: within a cycle or two of them
    assert cluster.killed - 2 * MONITOR_S - 1 <= gap.start <= cluster.killed, gap
    assert cluster.restarted <= gap.end <= cluster.restarted + 30, gap
    lite = load_sqlite(cluster.dbs[GAP_NODE], cluster.since, cluster.until, STEP_S)
    longs = [g for g in lite.gaps if g.end - g.start >= LONG_GAP_S]
    assert len(longs) == 1, (lite.gaps, data.gaps, cluster.killed, cluster.restarted)
    (mine,) = longs
    # the store's last cycle before, first after; Prometheus' scrapes of them, a scrape later at most,
    # or a scrape earlier where the last cycle before the kill was stored but never scraped
    assert mine.start - SCRAPE_S <= gap.start <= mine.start + MONITOR_S + SCRAPE_S, (mine, gap)
    assert mine.end <= gap.end <= mine.end + MONITOR_S + SCRAPE_S, (mine, gap)
    for source in (f"prometheus:{cluster.url}", f"sqlite:{cluster.dbs[GAP_NODE]}"):
        done = subprocess.run([sys.executable, "-m", "gpuslurm", "fairshare-report", "--since",
                               f"@{cluster.since}", "--until", f"@{cluster.until}", "--source", source],
                              env=_env(cluster),
                              capture_output=True, text=True, check=False)
        assert done.returncode == 0, done.stderr
        lines = [x for x in done.stdout.splitlines()
                 if x.lstrip().startswith(f"gap: node {GAP_NODE} has no samples from ")]
        assert lines, done.stdout
    for node in ("xnode1", "xnode2"):
        short = load_sqlite(cluster.dbs[node], cluster.since, cluster.until, STEP_S).gaps
        assert all(g.end - g.start < LONG_GAP_S for g in short), short
