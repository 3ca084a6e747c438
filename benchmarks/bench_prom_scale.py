"""The fair-share report from Prometheus at cluster scale: generate, backfill, time, check.

    python benchmarks/bench_prom_scale.py --nodes 16 --days 7 [--gpus 8] [--runs 2] [--keep DIR]

1. Generates OpenMetrics with the default exporter's names and labels (no series per process):
   30 s scrapes of every GPU (``gpuslurm_gpu_utilization_ratio``, ``..._memory_total_bytes``,
   ``gpuslurm_gpu_allocated``), back-to-back 1-GPU jobs of 1-12 h with 0-2 h gaps
   (``gpuslurm_job_start_timestamp_seconds``, ``..._last_seen_...``, ``gpuslurm_device_processes``
   with 1-3 processes), 15 % of the jobs idle, 12 users in 4 accounts, utilisation <= 1. Families
   the report does not read (power, temperature, memory used, the monitor's counters) are left
   out: they cost Prometheus, not the report. Each node scrapes with its own phase, off the
   buckets' minute grid.
2. Backfills them with ``promtool tsdb create-blocks-from openmetrics`` into a temporary TSDB and
   starts ``/usr/bin/prometheus`` (2.42 here) on 127.0.0.1 with its default query limits
   (``--query.max-samples`` 50 M, ``--query.timeout`` 2 min).
3. Runs the report by user as ``fairshare-report`` does (Prometheus' per-user sums:
   ``load_user_buckets`` + ``compute_users``; ``--per-device``: ``load_prometheus`` + ``compute``)
   in a child process ``--runs`` times: wall time, the requests and the points they answered, the
   child's own peak RSS (its VmHWM) and Prometheus' (VmHWM).
4. Checks the report against the generator's truth: allocated GPU-hours per user exact (1e-6 h),
   used within 0.1 %.

With ``--rules`` (the default), the shipped 5-minute group (``gpuslurm_5m`` of
packaging/gpuslurm-rules.yml) is then evaluated over the backfilled samples by ``promtool tsdb
create-blocks-from rules`` (never by the generator), its blocks join the TSDB, and the report
reads them (step: a whole number of 5 minutes); ``--raw`` makes the report read the raw samples
of the same TSDB (the per-user sums then joined from them). Nothing asserts on time.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import random
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

PROMETHEUS, PROMTOOL = "/usr/bin/prometheus", "/usr/bin/promtool"
EVERY = 30  # scrape interval, s
USERS = [f"user{i:02d}" for i in range(12)]
ACCOUNT = {u: f"acct{i % 4}" for i, u in enumerate(USERS)}
G0 = 1_700_000_000 // 86400 * 86400  # a whole day (UTC)
MEM_TOTAL = 85_520_809_984

REPORT = r"""
import json, re, sys, time
t = time.perf_counter()
import gpuslurm.report.prometheus as p
from gpuslurm.report.compute import Policy, compute
from gpuslurm.report.prom_client import PrometheusClient
from gpuslurm.report.prom_users import load_user_buckets
from gpuslurm.report.user_report import compute_users
url, since, until, step = sys.argv[1], float(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4])
raw, per_device = "raw" in sys.argv[5], "devices" in sys.argv[5]
if raw:
    p._rule_phase = lambda *args: None
asked = {"requests": 0, "points": 0}
spent = {}  # (endpoint, the query's first series name) -> [requests, seconds]: where the time goes
real = PrometheusClient._get
def counting(self, endpoint, params, want):
    t0 = time.perf_counter()
    got = real(self, endpoint, params, want)
    text = params.get("query", "") or params.get("match[]", "")
    name = re.search(r"[a-z_:]*gpuslurm_[a-z_:0-9]+", text)
    kind = spent.setdefault(endpoint + " " + (name.group(0) if name else "-"), [0, 0.0])
    kind[0] += 1
    kind[1] += time.perf_counter() - t0
    asked["requests"] += 1
    asked["points"] += sum(len(r.get("values") or ()) or 1 for r in got) if isinstance(got, list) else 0
    return got
PrometheusClient._get = counting
policy = Policy(quota_of=lambda user, account: 0.1, account_quotas={})
users = None if per_device else load_user_buckets("prometheus:" + url, since, until, step)
data = None if users is not None else p.load_prometheus("prometheus:" + url, since, until, step)
t_load = time.perf_counter() - t
report = compute_users(users, "user", policy) if users is not None else compute(data, "user", policy)
print(json.dumps({"load_s": t_load, "total_s": time.perf_counter() - t,
                  "rows": {r.key: [r.allocated_gpu_hours, r.used_gpu_hours] for r in report.rows},
                  "path": "per-user sums" if users is not None else "per-device",
                  "gpus": report.totals.gpus, "jobs": len((users or data).allocations), **asked,
                  # VmHWM, this process's own: getrusage's ru_maxrss keeps the high-water mark of
                  # the process before exec (the benchmark's, 426 MiB after generating 64 x 30 d)
                  "peak_mib": next(int(line.split()[1]) for line in open("/proc/self/status")
                                   if line.startswith("VmHWM:")) / 1024,
                  "spent": sorted(([k, n, round(sec, 2)] for k, (n, sec) in spent.items()),
                                  key=lambda x: -x[2])}))
"""

def generate(path: Path, nodes: int, days: int, gpus: int, seed: int,
             window_days: float | None = None) -> dict[str, list[float]]:
    """Write the OpenMetrics file; return the truth per user: [allocated h, used h] over the
    window ``[G0, G0 + window_days)`` (default: all ``days``)."""
    rng = random.Random(seed)
    end = G0 + days * 86400
    until = G0 + (window_days or days) * 86400
    truth = {u: [0.0, 0.0] for u in USERS}
    # per GPU: its scrape times' phase and its jobs (start time, first/last scrape index, user, mean, procs)
    layout = []
    job_id = 100000
    for n in range(nodes):
        phase = 7 + (n * 11) % 23  # s after the minute: never on a bucket edge
        for g in range(gpus):
            jobs = []
            t = G0 + rng.uniform(0, 7200)
            while True:
                start = t
                length = rng.uniform(3600, 12 * 3600)
                first = max(0, -int(-(start - G0 - phase) // EVERY))  # first scrape at or after start
                last = int((min(start + length, end - 1) - G0 - phase) // EVERY)
                if last < first or G0 + phase + first * EVERY >= end:
                    break
                user = rng.choice(USERS)
                idle = rng.random() < 0.15
                mean = rng.uniform(0.0, 0.02) if idle else rng.uniform(0.3, 0.95)
                job_id += 1
                jobs.append((start, first, last, user, mean, rng.randint(1, 3), str(job_id)))
                t = start + length + rng.uniform(0, 7200)
            layout.append((f"node{n:04d}", f"GPU-{n:04d}-{g}", phase, jobs))
    scrapes = lambda phase: range(0, int((end - G0 - phase - 1) // EVERY) + 1)  # noqa: E731

    def util(mean: float, k: int) -> float:
        return round(min(1.0, mean * (0.8 + 0.4 * ((k * 7919) % 101) / 100)), 3)

    with _Windows(path, days) as out:
        out.family("gpuslurm_gpu_utilization_ratio")
        for node, uuid, phase, jobs in layout:
            busy = {}
            for _start, first, last, user, mean, _procs, _job in jobs:
                for k in range(first, last + 1):
                    busy[k] = (mean, user)
            head = f'gpuslurm_gpu_utilization_ratio{{node="{node}",gpu_uuid="{uuid}",mig_uuid=""}} '
            lines = []
            for k in scrapes(phase):
                mean, user = busy.get(k, (0.0, None))
                u = util(mean, k) if user else 0.0
                if user and G0 + phase + k * EVERY < until:
                    truth[user][1] += u * EVERY / 3600
                lines.append(f"{head}{u} {G0 + phase + k * EVERY}\n")
            out.series(phase, scrapes(phase), lines.__getitem__)
        out.family("gpuslurm_gpu_memory_total_bytes")
        for node, uuid, phase, _jobs in layout:
            head = (f'gpuslurm_gpu_memory_total_bytes{{node="{node}",gpu_uuid="{uuid}",mig_uuid=""}} '
                    f'{MEM_TOTAL} ')
            out.series(phase, scrapes(phase),
                       lambda k, head=head, phase=phase: f"{head}{G0 + phase + k * EVERY}\n")
        out.family("gpuslurm_gpu_allocated")
        for node, uuid, phase, jobs in layout:
            held = set()
            for start, first, last, user, _mean, _procs, job in jobs:
                held.update(range(first, last + 1))
                head = (f'gpuslurm_gpu_allocated{{node="{node}",gpu_uuid="{uuid}",mig_uuid="",job_id="{job}",'
                        f'user="{user}",account="{ACCOUNT[user]}"}} 1 ')
                out.series(phase, range(first, last + 1),
                           lambda k, head=head, phase=phase: f"{head}{G0 + phase + k * EVERY}\n")
                ends = min(G0 + phase + last * EVERY + EVERY, end, until)  # held to its last scrape's end
                truth[user][0] += max(0.0, ends - max(start, G0)) / 3600
            head = (f'gpuslurm_gpu_allocated{{node="{node}",gpu_uuid="{uuid}",mig_uuid="",job_id="",'
                    'user="",account=""} 0 ')
            out.series(phase, scrapes(phase),
                       lambda k, head=head, phase=phase, held=held:
                       "" if k in held else f"{head}{G0 + phase + k * EVERY}\n")
        for family in ("job_start_timestamp_seconds", "job_last_seen_timestamp_seconds", "device_processes"):
            out.family(f"gpuslurm_{family}")
            for node, uuid, phase, jobs in layout:
                for start, first, last, user, _mean, procs, job in jobs:
                    labels = f'job_id="{job}",user="{user}",account="{ACCOUNT[user]}"'
                    if family == "device_processes":
                        head = (f'gpuslurm_{family}{{node="{node}",gpu_uuid="{uuid}",mig_uuid="",{labels}}} '
                                f'{procs} ')
                        out.series(phase, range(first, last + 1),
                                   lambda k, head=head, phase=phase: f"{head}{G0 + phase + k * EVERY}\n")
                        continue
                    head = f'gpuslurm_{family}{{node="{node}",{labels}}} '
                    value = (lambda ts, start=start: start) if family == "job_start_timestamp_seconds" \
                        else (lambda ts: ts)
                    out.series(phase, range(first, last + 1),
                               lambda k, head=head, phase=phase, value=value:
                               f"{head}{value(G0 + phase + k * EVERY)} {G0 + phase + k * EVERY}\n")
    return truth


BLOCK_S = 7200  # promtool's block: one file per block, so each file is parsed for its own block only


class _Windows:
    """OpenMetrics files, one per 2-hour block of the span: promtool parses its whole input once
    per block it makes, so one file of D days costs 12·D parses of everything (quadratic), one file
    per block one parse each. Each file holds every family's samples of its 2 hours."""

    def __init__(self, path: Path, days: int) -> None:
        self.path = path
        self.files = [] if path == Path(os.devnull) else [
            (path.parent / f"{path.stem}.{i:04d}.om").open("w", buffering=1 << 20)
            for i in range(days * 86400 // BLOCK_S)]

    def __enter__(self) -> _Windows:
        return self

    def __exit__(self, *exc: object) -> None:
        for f in self.files:
            f.write("# EOF\n")
            f.close()

    def family(self, name: str) -> None:
        for f in self.files:
            f.write(f"# TYPE {name} gauge\n")

    def series(self, phase: int, ks: range, line: Callable[[int], str]) -> None:
        """A series' lines for scrapes ``ks`` (in time order), each into its block's file."""
        if not self.files:  # --data: only the truth
            return
        k = ks.start
        while k < ks.stop:
            block = (phase + k * EVERY) // BLOCK_S
            stop = min(ks.stop, -(-((block + 1) * BLOCK_S - phase) // EVERY))
            self.files[block].write("".join(line(j) for j in range(k, stop)))
            k = stop

    def parts(self) -> list[Path]:
        return sorted(self.path.parent.glob(f"{self.path.stem}.*.om"))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _backfill(part: Path, data: Path) -> None:
    """One block's file into the TSDB (promtool adds its block to those there), then deleted."""
    subprocess.run([PROMTOOL, "tsdb", "create-blocks-from", "openmetrics", str(part), str(data)],
                   check=True, stdout=subprocess.DEVNULL)
    part.unlink()


def _five_minute_group(only: set[str] | None = None) -> list[str]:
    """The shipped rules' ``gpuslurm_5m`` group alone (the others are for dashboards; ``only``:
    those of its rules that record these names), as the rules files of promtool's runs: those
    over raw series, then those over the first ones' series (promtool cannot evaluate a rule over
    rules of the same run)."""
    text = (Path(__file__).resolve().parents[1] / "packaging" / "gpuslurm-rules.yml").read_text()
    head, *rules = text[text.index("  - name: gpuslurm_5m"):].split("\n      - record: ")
    names = {r.split("\n", 1)[0].strip() for r in rules}
    if only is not None:
        rules = [r for r in rules if r.split("\n", 1)[0].strip() in only]
        if len(rules) != len(only):
            raise SystemExit(f"--add-rules: not all of {sorted(only)} are rules of gpuslurm_5m")

    def over_rules(rule: str) -> bool:
        return any(name in rule.split("\n", 1)[1] for name in names)
    runs = [[r for r in rules if not over_rules(r)], [r for r in rules if over_rules(r)]]
    return ["groups:\n" + "\n      - record: ".join([head, *run]) + "\n" for run in runs if run]


def _serve(root: Path, data: Path, compact: bool = True) -> tuple[subprocess.Popen[bytes], str]:
    """Prometheus on 127.0.0.1 over ``data``, with its default query limits, once ready. Not
    ``compact``: its blocks stay 2 hours long (while promtool reads it for the rules: compacted
    raw blocks spanning days overlap every rule block of them, and Prometheus 2.42 merges such a
    group's symbols in a chain as deep as the group, over 20 minutes at 64 x 30 d; 2-hour blocks
    make groups of a raw block and its 2 hours' rule blocks)."""
    port = _free_port()
    (root / "prometheus.yml").write_text("scrape_configs: []\n")
    log = (root / "prometheus.log").open("ab")
    hold = [] if compact else ["--storage.tsdb.min-block-duration=2h", "--storage.tsdb.max-block-duration=2h"]
    proc = subprocess.Popen([PROMETHEUS, f"--config.file={root / 'prometheus.yml'}",
                             f"--storage.tsdb.path={data}", f"--web.listen-address=127.0.0.1:{port}",
                             "--storage.tsdb.retention.time=100y", *hold],
                            stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(600):
            try:
                with urllib.request.urlopen(f"{url}/-/ready", timeout=1) as resp:
                    if resp.status == 200:
                        break
            except OSError:
                time.sleep(0.5)
    except BaseException:  # Ctrl-C while it starts: not left running (the caller's has no handle yet)
        _stop(proc)
        raise
    return proc, url


def _stop(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=120)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def _compacted(root: Path, data: Path, proc: subprocess.Popen[bytes], url: str,
               quiet_s: float = 120.0) -> tuple[subprocess.Popen[bytes], str]:
    """Serve ``data`` until Prometheus has compacted it: no block in the making and the count of
    blocks unchanged for ``quiet_s`` (a site's Prometheus compacts promtool's blocks, one per
    rule and 2 hours, into a few; the report's cost on them is the one that stands for a site)."""
    def blocks() -> tuple[int, bool]:
        names = [p.name for p in data.iterdir() if p.is_dir() and p.name not in ("wal", "chunks_head")]
        return sum(not n.endswith((".tmp-for-creation", ".tmp-for-deletion")) for n in names), \
            any(n.endswith(".tmp-for-creation") for n in names)
    t, last, since = time.perf_counter(), blocks()[0], time.perf_counter()
    print(f"compacting {last} blocks ...", flush=True)
    while True:
        time.sleep(5)
        count, making = blocks()
        if count != last or making:
            last, since = count, time.perf_counter()
        elif time.perf_counter() - since >= quiet_s:
            break
    print(f"compacted to {last} blocks in {time.perf_counter() - t - quiet_s:.0f} s", flush=True)
    _stop(proc)
    return _serve(root, data)  # restarted: the report's figures without compaction's own load


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=16)
    ap.add_argument("--days", type=int, default=7)
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--runs", type=int, default=2)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--keep", help="work in this directory and leave it (default: a temporary one)")
    ap.add_argument("--data", help="serve this TSDB (a --keep run's data/) instead of generating and "
                    "backfilling; the truth is generated again from the same seed")
    ap.add_argument("--window-days", type=float, help="report on the first this many days only")
    ap.add_argument("--no-rules", action="store_true", help="backfill no recording-rule series")
    ap.add_argument("--raw", action="store_true", help="the report reads raw samples, not the rules")
    ap.add_argument("--per-device", action="store_true",
                    help="the per-device path (a point per device and bucket), not Prometheus' per-user sums")
    ap.add_argument("--add-rules", help="with --data and the --keep directory that made it: have promtool "
                    "add these rules of gpuslurm_5m (comma-separated names) to the TSDB first")
    ap.add_argument("--jobs", type=int, default=2, help="promtool backfills at once (default 2)")
    ap.add_argument("--compact", action="store_true", help="before the runs, serve the TSDB until "
                    "Prometheus has compacted it (no change for 2 minutes), then restart it; without "
                    "it, the runs read the blocks as they are (2 hours each after the rules). With "
                    "--add-rules on a compacted TSDB, the new rule blocks overlap its long blocks, "
                    "which Prometheus 2.42 merges slowly (docs/prometheus.md, At scale)")
    args = ap.parse_args()
    root = Path(args.keep or tempfile.mkdtemp(prefix="bench-prom-"))
    root.mkdir(parents=True, exist_ok=True)
    source, data = root / "series.om", Path(args.data) if args.data else root / "data"
    proc = None
    try:
        t = time.perf_counter()
        truth = generate(Path(os.devnull) if args.data else source, args.nodes, args.days, args.gpus,
                         args.seed, args.window_days)
        if not args.data:
            parts = sorted(root.glob("series.*.om"))
            size = sum(f.stat().st_size for f in parts) / 1e9
            print(f"generated {size:.2f} GB in {time.perf_counter() - t:.0f} s ({len(parts)} files)",
                  flush=True)
            t = time.perf_counter()
            with concurrent.futures.ThreadPoolExecutor(max_workers=args.jobs) as pool:
                list(pool.map(lambda f: _backfill(f, data), parts))
            print(f"backfilled in {time.perf_counter() - t:.0f} s", flush=True)
        rules_next = (not args.data and not args.no_rules) or bool(args.add_rules)
        proc, url = _serve(root, data, compact=not rules_next)
        if rules_next:
            t = time.perf_counter()
            rules = root / "rules-5m.yml"  # the same path and group each run: the same phase
            for run in _five_minute_group(set(args.add_rules.split(",")) if args.add_rules else None):
                rules.write_text(run)
                subprocess.run([PROMTOOL, "tsdb", "create-blocks-from", "rules", f"--url={url}",
                                f"--start={G0}", f"--end={G0 + args.days * 86400}",
                                f"--output-dir={root / 'rules'}", str(rules)],
                               check=True, stdout=subprocess.DEVNULL)
                _stop(proc)
                for block in (root / "rules").iterdir():
                    block.rename(data / block.name)
                proc, url = _serve(root, data, compact=False)
            print(f"rules' series made by promtool in {time.perf_counter() - t:.0f} s", flush=True)
        if args.compact:  # a site's Prometheus compacts; so does this one, before the runs
            _stop(proc)
            proc, url = _serve(root, data)
            proc, url = _compacted(root, data, proc, url)
        since, until = float(G0), float(G0 + (args.window_days or args.days) * 86400)
        sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
        from gpuslurm.report.data import auto_step

        step = -(-auto_step(since, until) // 300) * 300  # whole 5 minutes: the rules' buckets
        print(f"{args.nodes} nodes x {(until - since) / 86400:g} d, {args.nodes * args.gpus} GPUs, "
              f"step {step:g} s",
              flush=True)
        for run in range(args.runs):
            t = time.perf_counter()
            mode = ("raw" if args.raw else "rules") + ("-devices" if args.per_device else "")
            done = subprocess.run([sys.executable, "-c", REPORT, url, str(since), str(until), str(step),
                                   mode],
                                  capture_output=True, text=True)
            wall = time.perf_counter() - t
            if done.returncode:
                print(f"run {run + 1}: exit {done.returncode}: {done.stderr.strip()[-2000:]}")
                continue
            got = json.loads(done.stdout)
            peak = got["peak_mib"]  # the report's process alone (RUSAGE_CHILDREN would hold promtool's)
            hwm = next((line.split()[1] for line in Path(f"/proc/{proc.pid}/status").read_text().splitlines()
                        if line.startswith("VmHWM:")), "?")
            worst_alloc = max(abs(got["rows"].get(u, [0, 0])[0] - a) for u, (a, _) in truth.items())
            worst_used = max(abs(got["rows"].get(u, [0, 0])[1] - x) / x for u, (_, x) in truth.items() if x)
            print(f"run {run + 1}: {got['path']}, {got['requests']} requests, {got['points']} points; "
                  f"{wall:.1f} s wall (load {got['load_s']:.1f} s, report "
                  f"{got['total_s']:.1f} s "
                  f"in the child), child peak RSS {peak:.0f} MiB, Prometheus VmHWM "
                  f"{int(hwm) / 1024 if hwm != '?' else 0:.0f} MiB; {got['gpus']} GPUs, {got['jobs']} jobs; "
                  f"allocated per user off by at most {worst_alloc:.2e} h "
                  f"({'exact' if worst_alloc < 1e-6 else 'NOT EXACT'}), used by at most "
                  f"{100 * worst_used:.3f} % "
                  f"({'ok' if worst_used <= 1e-3 else 'OVER 0.1 %'})", flush=True)
            print("  requests' time (summed over the client's parallel requests), by kind: " + "; ".join(
                f"{k}: {n} in {sec} s" for k, n, sec in got["spent"][:8]), flush=True)
    finally:
        if proc is not None:
            _stop(proc)
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
