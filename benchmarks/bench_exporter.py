#!/usr/bin/env python3
"""The load the monitor's metrics server holds, and what a local user holding its connections costs.

A server process (the exporter, serving one cycle of 8 GPUs x 64 processes with jobs and
violations, as ``gpuslurm monitor --prometheus-port`` does) under ``RLIMIT_NOFILE`` 1024; this
process plays the clients over loopback. Prints:

- scrapes one after another: answers per second, median and 99th percentile latency;
- scrapes from 8 clients at once: answers per second;
- one scrape while 300 idle connections hold the server's connections (the attack of issue 18):
  how long it waits (about one connection deadline per full batch ahead of it), and the server's
  descriptors and threads meanwhile (bounded: cap + a few, one serving thread);
- the server's CPU seconds per thousand scrapes.

    python3 benchmarks/bench_exporter.py [--scrapes 2000] [--deadline 2] [--idle 300]
"""

from __future__ import annotations

import argparse
import os
import resource
import socket
import subprocess
import sys
import textwrap
import threading
import time

SERVER = textwrap.dedent("""
    import resource, sys, time
    from gpuslurm.samples import Allocation, Cycle, GpuSample, ProcSample, Violation
    from gpuslurm.watch.exporter import MetricsState, start_exporter
    resource.setrlimit(resource.RLIMIT_NOFILE, (1024, 1024))
    gpus = [f"GPU-{i:08x}-0000-0000-0000-000000000000" for i in range(8)]
    ts = time.time()
    allocs = tuple(Allocation(str(800 + i), f"user{i}", 1000 + i, (g,), ts - 3600, "physics")
                   for i, g in enumerate(gpus))
    procs = tuple(ProcSample(ts, g, 10000 + 64 * i + j, None, f"python{j}", 1000 + i, f"user{i}",
                             str(800 + i), 1024.0, 50.0) for i, g in enumerate(gpus) for j in range(64))
    cycle = Cycle(ts, "gpu001", tuple(GpuSample(ts, g, None, 90.0, 4e4, 8e4, 300.0, 60.0) for g in gpus),
                  procs, allocs, ())
    violations = [Violation("rogue", "gpu001", "mallory", None, 4242, "miner", gpus[0], 60.0, ts - 60,
                            "miner", "critical")]
    state = MetricsState()
    state.update(cycle, violations)
    exporter = start_exporter("127.0.0.1", 0, state, timeout_s=float(sys.argv[1]))
    print(exporter.address[1], len(state.body()), exporter.max_connections, flush=True)
    sys.stdin.read()
""")


def _scrape(port: int) -> float:
    t = time.perf_counter()
    with socket.create_connection(("127.0.0.1", port), timeout=120) as s:
        s.sendall(b"GET /metrics HTTP/1.1\r\nHost: bench\r\n\r\n")
        data = b""
        while chunk := s.recv(1 << 16):
            data += chunk
    assert data.startswith(b"HTTP/1.1 200"), data[:80]
    return time.perf_counter() - t


def _usage(pid: int) -> tuple[float, int, int]:
    """(CPU seconds, descriptors, threads) of process ``pid``."""
    with open(f"/proc/{pid}/stat") as fh:
        fields = fh.read().rsplit(")", 1)[1].split()
    cpu = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return cpu, len(os.listdir(f"/proc/{pid}/fd")), len(os.listdir(f"/proc/{pid}/task"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--scrapes", type=int, default=2000)
    ap.add_argument("--deadline", type=float, default=2.0, help="[monitor] prometheus_timeout_s")
    ap.add_argument("--idle", type=int, default=300)
    args = ap.parse_args()
    resource.setrlimit(resource.RLIMIT_NOFILE, (4096, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
    server = subprocess.Popen([sys.executable, "-c", SERVER, str(args.deadline)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    try:
        assert server.stdout is not None
        port_s, size, cap = server.stdout.readline().split()
        port = int(port_s)
        print(f"exposition {int(size) / 1024:.0f} KiB, cap {cap} connections, deadline {args.deadline:g} s")
        cpu0 = _usage(server.pid)[0]
        t0 = time.perf_counter()
        lat = sorted(_scrape(port) for _ in range(args.scrapes))
        wall = time.perf_counter() - t0
        cpu = _usage(server.pid)[0] - cpu0
        median, p99 = lat[len(lat) // 2] * 1e3, lat[int(len(lat) * 0.99)] * 1e3
        print(f"one after another: {args.scrapes / wall:.0f} scrapes/s, median {median:.2f} ms, "
              f"p99 {p99:.2f} ms; server CPU {cpu / args.scrapes * 1e6:.0f} us/scrape")

        per = args.scrapes // 8
        t0 = time.perf_counter()
        threads = [threading.Thread(target=lambda: [_scrape(port) for _ in range(per)]) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        print(f"8 clients at once: {8 * per / (time.perf_counter() - t0):.0f} scrapes/s")

        idle = []
        for _ in range(args.idle):  # nonblocking: those beyond the backlog wait in SYN retries
            s = socket.socket()
            s.setblocking(False)
            s.connect_ex(("127.0.0.1", port))
            idle.append(s)
        time.sleep(0.5)
        _cpu, fds, tasks = _usage(server.pid)
        waited = _scrape(port)
        print(f"{args.idle} idle connections held: a scrape waited {waited:.1f} s "
              f"(deadline {args.deadline:g} s); server meanwhile {fds} descriptors, {tasks} threads")
        for s in idle:
            s.close()
        time.sleep(args.deadline + 0.5)  # what the server had accepted of them is cut
        print(f"after: a scrape takes {_scrape(port) * 1e3:.2f} ms")
    finally:
        server.kill()
        server.wait()


if __name__ == "__main__":
    main()
