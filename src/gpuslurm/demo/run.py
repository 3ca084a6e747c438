"""Replay the scripted day through the real monitor, in accelerated time, without root or Slurm.

What is real: the built-in DGX H100 bundle, the replay sampler reading a scenario file, the
prolog's job-map writer, the monitor's cycle with its attribution (``/proc/PID/{stat,status,
cgroup}``), the detectors, and the SQLite store. What stands in: the clock (the monitor's injected
``clock`` runs the day in seconds), and ``/proc``. The day's processes do not exist, so the demo
writes their ``/proc`` entries (name, owner, Slurm-shaped cgroup) into a directory of its own and
points the attributor there (its ``proc_root``). The users exist only in the script, so their
names come from it instead of ``/etc/passwd``.

Everything is written under the output directory, which must be empty, new, or an earlier demo's.
"""

from __future__ import annotations

import importlib.util
import io
import json
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple, TextIO

from gpuslurm.config import DetectConfig, ShareDetect
from gpuslurm.demo import script
from gpuslurm.errors import InputError
from gpuslurm.hw.replay.scenario import ScenarioSampler
from gpuslurm.hw.source import hardware_source
from gpuslurm.policy.detect import Detector
from gpuslurm.policy.share import Quotas
from gpuslurm.report.charts import write_plot
from gpuslurm.report.compute import Policy, compute
from gpuslurm.report.data import auto_step
from gpuslurm.report.query import load_sqlite
from gpuslurm.report.render import write_report as render
from gpuslurm.slurm.adapter import SlurmScheduler
from gpuslurm.state.jobmap import JobMap, MappedDevice, remove_map, write_map
from gpuslurm.state.store import Store
from gpuslurm.watch.attribute import Attributor
from gpuslurm.watch.build import build_monitor

BUNDLE = "dgx-h100"
INTERVAL_S = 10.0  # the monitor's default cycle
MARKER = ".gpuslurm-demo"
DB_NAME = "monitor.db"
CHART_NAME = "fairshare.png"
REPORT_NAME = "report.txt"
CONFIG_NAME = "gpuslurm.toml"  # the script's quotas, for the report command the demo suggests next
_OURS = (MARKER, DB_NAME, f"{DB_NAME}-wal", f"{DB_NAME}-shm", "scenario.json", CHART_NAME, REPORT_NAME,
         CONFIG_NAME, "proc", "run", ".cache")


class Progress(NamedTuple):
    """How far the replay is, for a progress line."""

    done_s: float  # simulated seconds replayed
    day_s: float
    cycles: int
    jobs: int  # jobs holding GPUs now
    found: dict[str, int]  # violation kind → distinct findings so far


class DemoRun(NamedTuple):
    """A finished replay: where its store is and what window it covers."""

    out: Path
    db: Path
    node: str
    since: float
    until: float
    cycles: int
    found: dict[str, int]
    elapsed_s: float  # wall-clock seconds the replay took


class _DemoAttributor(Attributor):
    """The monitor's attributor, naming the script's users (they are not in /etc/passwd)."""

    def _user(self, uid: int) -> str:
        for u in script.USERS:
            if u.uid == uid:
                return u.name
        return super()._user(uid)


def detect_config() -> DetectConfig:
    """The detectors' settings: gpuslurm's defaults, with the script's users' quotas."""
    return DetectConfig(share=ShareDetect(users=tuple((u.name, u.quota) for u in script.USERS)))


def check_hours(hours: float) -> None:
    """InputError unless the day is long enough for the idle detector and not absurdly long."""
    if not script.MIN_HOURS <= hours <= 24 * 7:
        raise InputError(f"must be between {script.MIN_HOURS:g} and 168 hours, not {hours:g} "
                         "(the idle detector needs half an hour of samples)", source="--hours")


def prepare_out(out: Path | None) -> Path:
    """The output directory: a new temporary one, or ``out`` if it is new, empty or a demo's."""
    if out is None:
        return Path(tempfile.mkdtemp(prefix="gpuslurm-demo-"))
    out = out.absolute()
    if out.is_symlink() or (out.exists() and not out.is_dir()):
        raise InputError("not a directory", source=out)
    if not out.exists():
        try:
            out.mkdir(parents=True)
            out.chmod(0o755)  # the job maps below it need a directory others cannot write
        except OSError as exc:
            raise InputError(f"cannot create: {exc.strerror}", source=out) from None
        return out
    entries = set(os.listdir(out))
    if entries and MARKER not in entries:
        raise InputError("not empty and not an earlier demo's directory; name a new or empty one", source=out)
    if entries - set(_OURS):
        extra = sorted(entries - set(_OURS))[0]
        raise InputError(f"holds {extra!r}, which the demo did not write; name a new or empty one",
                         source=out)
    for name in entries:
        path = out / name
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        else:
            path.unlink()
    return out


def write_proc_tree(root: Path, since: float, day_s: float) -> None:
    """``/proc`` entries for the day's processes: stat (name, start time), status (owner), cgroup."""
    ticks = os.sysconf("SC_CLK_TCK")
    boot = since - 86400.0  # the node booted a day before the demo's day
    root.mkdir(mode=0o755)
    (root / "stat").write_text(f"cpu  0 0 0 0 0 0 0 0 0 0\nbtime {int(boot)}\n")
    entries: list[tuple[int, str, int, float, str]] = []
    for job in script.JOBS:
        run = script.span_of(job.start, job.end, day_s)
        cgroup = f"0::/system.slice/slurmstepd.scope/job_{job.job_id}/step_0/user/task_0\n"
        uid = script.user(job.user).uid
        for pid in script.job_pids(job):
            entries.append((pid, job.process, uid, run.start, cgroup))
    rogue = script.ROGUE
    uid = script.user(rogue.user).uid
    entries.append((rogue.pid, rogue.process, uid, script.span_of(rogue.start, rogue.end, day_s).start,
                    f"0::/user.slice/user-{uid}.slice/session-7.scope\n"))  # an ssh login, no job
    for pid, comm, uid, start, cgroup in entries:
        d = root / str(pid)
        d.mkdir(mode=0o755)
        started = int((since + start - boot) * ticks)
        # state, ppid, pgrp, session, tty, tpgid, flags, 12 counters, then field 22: starttime
        fields = ["S", "1", str(pid), str(pid), "0", "-1", "4194560", *["0"] * 12, str(started), *["0"] * 30]
        (d / "stat").write_text(f"{pid} ({comm}) {' '.join(fields)}\n")
        (d / "status").write_text(f"Name:\t{comm}\nState:\tS (sleeping)\nUid:\t{uid}\t{uid}\t{uid}\t{uid}\n")
        (d / "cgroup").write_text(cgroup)


def run_day(out: Path, hours: float, *, speed: float | None = None,
            progress: Callable[[Progress], None] | None = None, now: float | None = None,
            sleep: Callable[[float], None] = time.sleep) -> DemoRun:
    """Replay ``hours`` of the scripted day ending at ``now`` (default: the current minute) into ``out``.

    ``speed``: simulated seconds per real second (None: as fast as the machine goes).
    """
    check_hours(hours)
    day_s = round(hours * 3600.0 / script.STEP_S) * script.STEP_S
    until = (time.time() if now is None else now) // 60 * 60
    since = until - day_s
    node = hardware_source(BUNDLE).node()
    gpus = sorted(node.gpus, key=lambda g: g.index)
    uuids = [g.uuid for g in gpus]
    minor = [g.minor for g in gpus]
    if bad := script.check_schedule(len(uuids)):
        raise AssertionError(f"the demo script is wrong: {bad[0]}")

    (out / MARKER).write_text("written by gpuslurm demo; the demo may empty this directory\n")
    scenario = out / "scenario.json"
    scenario.write_text(json.dumps({"start": since, "steps": script.scenario_steps(uuids, day_s)}))
    proc_root = out / "proc"
    write_proc_tree(proc_root, since, day_s)
    run_dir = out / "run"
    run_dir.mkdir(mode=0o755)
    jobs_dir = str(run_dir / "jobs")
    os.mkdir(jobs_dir, 0o700)

    clock = [since]
    store = Store.open(str(out / DB_NAME))
    sampler = ScenarioSampler(node, scenario)
    detector = Detector(detect_config())
    # the script's processes sit in Slurm-shaped cgroups: the Slurm adapter's layout reads them (no
    # node is given, so its commands are never run)
    monitor = build_monitor(sampler, store, node.hostname, jobs_dir=jobs_dir, proc_root=str(proc_root),
                            scheduler=SlurmScheduler(), attributor_type=_DemoAttributor, detector=detector,
                            clock=lambda: clock[0])
    events = script.map_events(day_s)
    running: set[str] = set()
    seen: dict[str, set[tuple[object, ...]]] = {}
    wall0 = time.monotonic()
    cycles = 0
    n = int(day_s // INTERVAL_S)
    try:
        for k in range(n):
            t = since + k * INTERVAL_S
            changed = False
            while events and since + events[0].at <= t:
                ev = events.pop(0)
                changed = True
                if ev.start:  # what the prolog writes when the job starts
                    devices = tuple(MappedDevice(uuids[i], minor[i], gres_index=i) for i in ev.job.gpus)
                    owner = script.user(ev.job.user)
                    write_map(JobMap(ev.job.job_id, owner.name, owner.uid, devices, since + ev.at), jobs_dir)
                    running.add(ev.job.job_id)
                else:
                    remove_map(ev.job.job_id, jobs_dir)
                    running.discard(ev.job.job_id)
            if changed:
                # The attributor re-reads maps when the directory's mtime changes; the demo makes
                # changes faster than the file system's clock ticks, so the mtime follows the day's.
                ns = int(t * 1e9)
                os.utime(jobs_dir, ns=(ns, ns))
            clock[0] = t
            monitor.cycle()
            cycles += 1
            for v in detector.violations:
                seen.setdefault(v.kind, set()).add((v.job_id, v.pid, v.gpu_uuid, v.start))
            if speed is not None:
                ahead = (t - since) / speed - (time.monotonic() - wall0)
                if ahead > 0:
                    sleep(ahead)
            if progress is not None and (k % int(script.STEP_S // INTERVAL_S) == 0 or k == n - 1):
                progress(Progress(t + INTERVAL_S - since, day_s, cycles, len(running),
                                  {kind: len(s) for kind, s in sorted(seen.items())}))
    finally:
        store.close()
        sampler.close()
    if monitor.pending:
        raise InputError(f"{len(monitor.pending)} cycle(s) could not be stored", source=out / DB_NAME)
    # the stand-ins have done their part; the store, scenario, report and chart stay
    shutil.rmtree(proc_root)
    shutil.rmtree(run_dir)
    return DemoRun(out, out / DB_NAME, node.hostname, since, until, cycles,
                   {kind: len(s) for kind, s in sorted(seen.items())}, time.monotonic() - wall0)


def chart_unavailable() -> str | None:
    """Why the chart cannot be drawn here (matplotlib missing), or None."""
    if importlib.util.find_spec("matplotlib") is None:
        return "matplotlib is not installed (pip install matplotlib)"
    return None


def write_config(out: Path) -> Path:
    """A config file with the script's quotas, so that a report run by hand judges as the demo did."""
    # TOML basic strings and JSON strings escape alike for these plain names; json.dumps quotes them
    users = ", ".join(f"{json.dumps(u.name)} = {u.quota!r}" for u in script.USERS)
    path = out / CONFIG_NAME
    path.write_text("# written by gpuslurm demo: the demo's users' quotas\n"
                    f"[detect.share]\nusers = {{ {users} }}\n")
    return path


def write_report(run: DemoRun, fp: TextIO, *, plot: bool = True) -> Path | None:
    """Print the day's fair-share report on ``fp`` (and save it); write the chart. The chart's path."""
    data = load_sqlite(str(run.db), run.since, run.until, auto_step(run.since, run.until))
    cfg = detect_config()
    policy = Policy(Quotas(cfg.share).of, dict(cfg.share.accounts), busy_pct=cfg.share.threshold_pct,
                    idle_pct=cfg.idle.threshold_pct)
    report = compute(data, "user", policy)
    text = io.StringIO()
    render(report, "table", text)
    fp.write(text.getvalue())
    (run.out / REPORT_NAME).write_text(text.getvalue())
    write_config(run.out)
    if not plot:
        return None
    # matplotlib keeps a font cache under $HOME; the demo promises to write only in its directory
    os.environ.setdefault("MPLCONFIGDIR", str(run.out / ".cache" / "matplotlib"))
    chart = run.out / CHART_NAME
    write_plot(str(chart), data, report)
    return chart
