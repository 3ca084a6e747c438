"""The demo's scripted day on a DGX H100 (pure data and pure functions of it).

Five users share eight GPUs. The day is written in fractions of its length, so ``--hours``
stretches or squeezes it; everything changes on a grid of ``STEP_S`` seconds (the scenario's
steps), and utilisation follows a per-kind pattern with seeded noise, so the same day always
replays the same way:

- alice trains on three GPUs for most of the day, well over her 25 % quota (over fair share);
- bob tunes in bursts, within his quota; erin serves a model at a third of one GPU all day;
- carol holds two GPUs for a notebook that barely touches them (the idle allocation), then
  trains for real;
- dave runs a small job within his 10 % quota, then a python process outside any Slurm job (the
  rogue process), which also puts him over his share.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from typing import NamedTuple

STEP_S = 300.0  # the scenario changes every 5 simulated minutes
MIN_HOURS = 2.0  # the idle detector needs half an hour of samples after a 10-minute grace
HOUR = 3600.0


class DemoUser(NamedTuple):
    name: str
    uid: int
    quota: float  # fraction of the node's GPUs ([detect.share] users)


class DemoJob(NamedTuple):
    job_id: str
    user: str
    gpus: tuple[int, ...]  # GPU indices on the node
    start: float  # fractions of the day
    end: float
    kind: str  # "train", "tune", "serve", "notebook"
    process: str  # the process name (comm) on each of its GPUs


class RogueProcess(NamedTuple):
    """A process some user started on a GPU outside any Slurm job."""

    pid: int
    user: str
    gpu: int
    start: float
    end: float
    process: str


USERS = (
    DemoUser("alice", 2001, 0.25),
    DemoUser("bob", 2002, 0.25),
    DemoUser("carol", 2003, 0.20),
    DemoUser("dave", 2004, 0.10),
    DemoUser("erin", 2005, 0.15),
)

JOBS = (
    DemoJob("1001", "alice", (0, 1, 2), 0.02, 0.75, "train", "torchrun"),
    DemoJob("1002", "bob", (3,), 0.05, 0.45, "tune", "python"),
    DemoJob("1003", "carol", (4, 5), 0.10, 0.55, "notebook", "jupyter-lab"),
    DemoJob("1004", "erin", (6,), 0.03, 0.97, "serve", "vllm"),
    DemoJob("1005", "dave", (7,), 0.20, 0.40, "serve", "python"),
    DemoJob("1006", "bob", (3, 4), 0.58, 0.95, "tune", "python"),
    DemoJob("1007", "carol", (5,), 0.65, 0.85, "train", "python"),
    DemoJob("1008", "alice", (0, 1), 0.80, 0.98, "train", "torchrun"),
)

ROGUE = RogueProcess(48211, "dave", 7, 0.45, 0.70, "python")

# per kind: (base utilisation %, GPU memory per process in MiB)
_KINDS = {"train": (92.0, 63_000.0), "tune": (60.0, 38_000.0), "serve": (35.0, 22_000.0),
          "notebook": (1.0, 9_000.0), "rogue": (90.0, 30_000.0)}


class Run(NamedTuple):
    """Where a job (or the rogue) is on the simulated clock, in seconds from the day's start."""

    start: float
    end: float


def user(name: str) -> DemoUser:
    for u in USERS:
        if u.name == name:
            return u
    raise KeyError(name)


def span_of(start_frac: float, end_frac: float, day_s: float) -> Run:
    """A fraction-of-day interval snapped to the step grid (everything changes on a step)."""
    steps = max(1, round(day_s / STEP_S))
    return Run(round(start_frac * steps) * STEP_S, round(end_frac * steps) * STEP_S)


def job_pids(job: DemoJob) -> tuple[int, ...]:
    """One process per GPU of the job: ``<job id><k>``, e.g. 10010, 10011, 10012."""
    return tuple(int(job.job_id) * 10 + k for k in range(len(job.gpus)))


def utilisation(kind: str, t: float, rng: random.Random) -> float:
    """The busy % of a GPU running ``kind`` at ``t`` seconds into its run (noisy, 0–100)."""
    base, _ = _KINDS[kind]
    if kind == "tune":  # 20-minute bursts: evaluate, train hard, train
        base = (25.0, 85.0, 70.0)[int(t // 1200) % 3]
    elif kind == "serve":  # load follows a slow wave
        base += 12.0 * math.sin(t / 5400.0)
    elif kind == "notebook" and t < STEP_S:
        base = 20.0  # loads the model, then sits there
    noise = rng.uniform(-4.0, 4.0) if base > 5 else rng.uniform(0.0, 1.5)
    return round(min(100.0, max(0.0, base + noise)), 1)


def scenario_steps(gpu_uuids: Sequence[str], day_s: float, seed: int = 5) -> list[dict[str, object]]:
    """The ``steps`` of a scenario file (``at`` from the day's start) replaying the whole day."""
    rng = random.Random(seed)
    runs = [(j, span_of(j.start, j.end, day_s)) for j in JOBS]
    rogue = span_of(ROGUE.start, ROGUE.end, day_s)
    steps: list[dict[str, object]] = []
    n = max(1, round(day_s / STEP_S))
    for k in range(n):
        at = k * STEP_S
        gpus: dict[str, dict[str, float]] = {}
        procs: list[dict[str, object]] = []
        for job, run in runs:
            if not run.start <= at < run.end:
                continue
            _, mem = _KINDS[job.kind]
            for index, pid in zip(job.gpus, job_pids(job), strict=True):
                util = utilisation(job.kind, at - run.start, rng)
                gpus[gpu_uuids[index]] = _gpu(util, mem)
                procs.append({"pid": pid, "gpu": gpu_uuids[index], "mem_mib": mem, "sm": util})
        if rogue.start <= at < rogue.end:
            util = utilisation("rogue", at - rogue.start, rng)
            _, mem = _KINDS["rogue"]
            uuid = gpu_uuids[ROGUE.gpu]
            gpus[uuid] = _gpu(util, mem)
            procs.append({"pid": ROGUE.pid, "gpu": uuid, "mem_mib": mem, "sm": util})
        for uuid in gpu_uuids:  # an idle H100 still draws power and sits warm
            gpus.setdefault(uuid, {"util": 0.0, "mem_mib": 0.0, "power_w": 72.0, "temp_c": 31.0})
        steps.append({"at": at, "gpus": gpus, "procs": procs})
    return steps


def _gpu(util: float, mem: float) -> dict[str, float]:
    return {"util": util, "mem_mib": mem + 600.0, "power_w": round(72.0 + 6.2 * util),
            "temp_c": round(31.0 + 0.38 * util)}


class MapEvent(NamedTuple):
    """At ``at`` seconds, the prolog writes (``start``) or the epilog removes a job's map."""

    at: float
    job: DemoJob
    start: bool


def map_events(day_s: float) -> list[MapEvent]:
    """Every job map write and removal in time order (a removal before a write at the same time)."""
    events: list[MapEvent] = []
    for job in JOBS:
        run = span_of(job.start, job.end, day_s)
        events.append(MapEvent(run.start, job, True))
        if run.end < day_s:
            events.append(MapEvent(run.end, job, False))
    return sorted(events, key=lambda e: (e.at, e.start, e.job.job_id))


def check_schedule(gpu_count: int) -> list[str]:
    """What is wrong with the script: two jobs sharing a GPU at once, a GPU the node lacks."""
    problems: list[str] = []
    for i, a in enumerate(JOBS):
        for g in a.gpus:
            if g >= gpu_count:
                problems.append(f"job {a.job_id} uses GPU {g}, the node has {gpu_count}")
        for b in JOBS[i + 1:]:
            if set(a.gpus) & set(b.gpus) and a.start < b.end and b.start < a.end:
                problems.append(f"jobs {a.job_id} and {b.job_id} share a GPU at the same time")
        if ROGUE.gpu in a.gpus and a.start < ROGUE.end and ROGUE.start < a.end:
            problems.append(f"the rogue process shares GPU {ROGUE.gpu} with job {a.job_id}")
    return problems
