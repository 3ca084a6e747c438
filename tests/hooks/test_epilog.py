"""The epilog with real processes: leftovers killed (pidfd, grace, SIGKILL), exclusions, summaries
from the monitor's store, AdminComment through a stand-in scontrol.

Leftovers are real ``sleep`` processes run as ``nobody``, listed in the replay ``health.json``;
a process that survives SIGKILL is one frozen in a real cgroup v1 freezer.
"""

from __future__ import annotations

import io
import json
import os
import pwd
import select
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from tests.helpers.hook_helpers import HookSite, make_site

from gpuslurm.hooks.epilog import admin_comment
from gpuslurm.hooks.leftovers import leftover_verdict, plan_kills
from gpuslurm.hooks.log import HookLog
from gpuslurm.hw.model.health import GpuProcess
from gpuslurm.isolate.kill import Target, kill_processes
from gpuslurm.slurm.cgroup_paths import parse_cgroup
from gpuslurm.slurm.hooks import run_epilog, run_prolog
from gpuslurm.state.jobmap import job_map, write_map
from gpuslurm.state.store import GpuStats

NOBODY = 65534
FREEZER = Path("/sys/fs/cgroup/freezer")


def quiet(hook: str) -> HookLog:
    return HookLog(hook, stream=io.StringIO(), use_syslog=False)


@pytest.fixture
def site(tmp_path: Path) -> HookSite:
    s = make_site(tmp_path)
    s.write_config("[epilog]\nkill_grace_s = 2\n")
    return s


class Leftover:
    """A process left behind: started through a shell that exits at once, so it is not a child of
    this test (the epilog never kills its own descendants). Watched through a pidfd."""

    def __init__(self, argv: list[str], uid: int, comm: str | None = None) -> None:
        out = subprocess.run(["/bin/sh", "-c", '"$@" </dev/null >/dev/null 2>&1 & echo $!', "sh", *argv],
                             user=uid, group=uid, extra_groups=[], capture_output=True, text=True,
                             check=True, timeout=10).stdout
        self.pid = int(out)
        try:
            self.fd: int | None = os.pidfd_open(self.pid)
        except ProcessLookupError:  # a short one may be gone (and reaped) already on a loaded machine
            self.fd = None
        self.comm = comm or Path(argv[0]).name

    def exited(self, timeout: float = 0.0) -> bool:
        return self.fd is None or bool(select.select([self.fd], [], [], timeout)[0])

    def started(self) -> Leftover:
        """Once it runs its own program (a shell's ``trap`` has then taken effect)."""
        deadline = time.monotonic() + 10
        while Path(f"/proc/{self.pid}/comm").read_text().strip() != self.comm:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        return self

    def stop(self) -> None:
        if self.fd is None:
            return
        try:
            signal.pidfd_send_signal(self.fd, signal.SIGKILL)
        except ProcessLookupError:
            pass
        os.close(self.fd)


@pytest.fixture
def spawn() -> Iterator[list[Leftover]]:
    """Leftovers started by a test; whatever survives is killed after."""
    procs: list[Leftover] = []
    yield procs
    for p in procs:
        p.stop()


def start(procs: list[Leftover], argv: list[str], uid: int = NOBODY, comm: str | None = None) -> Leftover:
    if os.geteuid() != 0:
        pytest.skip("needs root: leftovers run as another user")
    p = Leftover(argv, uid, comm)
    procs.append(p)
    return p.started()


def listed(site: HookSite, gpu: int, *pids: int, user: str = "nobody", **extra: object) -> None:
    site.set_health({site.uuids[gpu]: {"processes": [{"pid": p, "user": user} for p in pids], **extra}})


def prolog(site: HookSite, gpus: str = "0,1", job: str = "1234") -> None:
    assert run_prolog(site.environ(job, gpus=gpus), quiet("prolog")) == 0


def summary(site: HookSite, job: str = "1234") -> dict[str, object]:
    data: dict[str, object] = json.loads((site.summaries / f"{job}-summary.json").read_text())
    return data


def test_leftover_is_killed_and_the_gpu_released(site: HookSite, spawn: list[Leftover]) -> None:
    prolog(site)
    p = start(spawn, ["/bin/sleep", "300"])
    listed(site, 1, p.pid)
    log = quiet("epilog")
    assert run_epilog(site.environ(gpus="0,1"), log) == 0, log.lines
    assert p.exited(timeout=5)
    assert site.scontrol_calls() == []  # released: nothing to drain
    [left] = summary(site)["leftovers"]  # type: ignore[misc]
    assert left == {"gpu": site.uuids[1], "pid": p.pid, "user": "nobody", "outcome": "exited after SIGTERM"}


def test_sigterm_ignored_gets_sigkill_after_the_grace(site: HookSite,
                                                      spawn: list[Leftover]) -> None:
    site.write_config("[epilog]\nkill_grace_s = 0.5\n")
    prolog(site)
    # an ignored signal stays ignored across exec: this sleep cannot be stopped by SIGTERM
    stubborn = start(spawn, ["/bin/sh", "-c", "trap '' TERM; exec /bin/sleep 300"], comm="sleep")
    polite = start(spawn, ["/bin/sleep", "300"])
    site.set_health({site.uuids[0]: {"processes": [{"pid": stubborn.pid, "user": "nobody"}]},
                     site.uuids[1]: {"processes": [{"pid": polite.pid}]}})
    began = time.monotonic()
    assert run_epilog(site.environ(gpus="0,1"), quiet("epilog")) == 0
    took = time.monotonic() - began
    assert stubborn.exited(timeout=5) and polite.exited(timeout=5)
    assert 0.5 <= took < 2.5
    outcomes = {x["pid"]: x["outcome"] for x in summary(site)["leftovers"]}  # type: ignore[attr-defined]
    assert outcomes == {stubborn.pid: "killed with SIGKILL", polite.pid: "exited after SIGTERM"}
    assert site.scontrol_calls() == []


NEEDS_FREEZER = pytest.mark.skipif(not FREEZER.is_dir(), reason="no cgroup v1 freezer hierarchy")


@NEEDS_FREEZER
def test_survivor_of_sigkill_drains_naming_the_gpu(site: HookSite, spawn: list[Leftover]) -> None:
    site.write_config("[epilog]\nkill_grace_s = 0.2\n")
    prolog(site)
    p = start(spawn, ["/bin/sleep", "300"])
    cg = FREEZER / f"gpuslurm-test-{uuid.uuid4().hex[:8]}"
    cg.mkdir()
    try:
        (cg / "cgroup.procs").write_text(str(p.pid))
        (cg / "freezer.state").write_text("FROZEN")  # a frozen task cannot act on SIGKILL: stuck
        listed(site, 1, p.pid)
        assert run_epilog(site.environ(gpus="0,1"), quiet("epilog")) == 0
        [call] = site.scontrol_calls()
        assert call[3] == (f"Reason=gpuslurm: GPU index 1 (/dev/nvidia1, {site.uuids[1]}): "
                           f"1 leftover process(es) survived SIGKILL: pid {p.pid} (nobody)")
        assert not p.exited()
    finally:
        (cg / "freezer.state").write_text("THAWED")
        assert p.exited(timeout=5)  # the pending SIGKILL lands once thawed
        cg.rmdir()


def test_vanished_pid_is_fine(site: HookSite, spawn: list[Leftover]) -> None:
    prolog(site)
    p = Leftover(["/bin/sleep", "0.01"], NOBODY)
    spawn.append(p)
    assert p.exited(timeout=5)
    listed(site, 0, p.pid)  # a zombie, or reaped, depending on this machine's init
    log = quiet("epilog")
    assert run_epilog(site.environ(gpus="0,1"), log) == 0
    assert site.scontrol_calls() == []
    assert summary(site)["leftovers"] == []
    assert any(f"pid {p.pid} is not killed: " in line for line in log.lines)


def test_never_kills_pid_1_or_its_own_tree(site: HookSite) -> None:
    prolog(site)
    # one pid each: a test run whose parent shell has gone has init for its parent
    pids = sorted({1, os.getpid(), os.getppid()})
    listed(site, 0, *pids, user="root")
    log = quiet("epilog")
    assert run_epilog(site.environ(gpus="0,1"), log) == 0
    spared = [line for line in log.lines if "is not killed: PID 1 or this hook's own ancestor" in line]
    assert len(spared) == len(pids), log.lines
    # still there, so still counted: the node drains for them rather than the hook killing itself
    [call] = site.scontrol_calls()
    assert f"{len(pids)} process(es) left after the job" in call[3]


def test_exclusions_other_jobs_and_ignored_users(site: HookSite, spawn: list[Leftover]) -> None:
    site.write_config('[epilog]\nkill_grace_s = 2\n[health.leftover_processes]\nignore_users = ["dcgm"]\n')
    prolog(site, gpus="0,1")
    # job 555 of uid 1001 still holds GPU 1 (a MIG slice or a shared GPU)
    from gpuslurm.hw.source import load_node
    from gpuslurm.state.job import JobDevice

    gpu1 = load_node(str(site.bundle)).gpus[1]
    write_map(job_map("555", "bob", 1001, [JobDevice(gpu1, None, 1)], start=1.0), str(site.jobs_dir))
    ignored = start(spawn, ["/bin/sleep", "300"])
    strangers = start(spawn, ["/bin/sleep", "300"])  # not the job's uid, GPU shared: not ours to kill
    mine = start(spawn, ["/bin/sleep", "300"], uid=1000)  # the job's own uid, no other job of alice there
    site.set_health({
        site.uuids[0]: {"processes": [{"pid": ignored.pid, "user": "dcgm"}]},
        site.uuids[1]: {"processes": [{"pid": strangers.pid, "user": "nobody"},
                                      {"pid": mine.pid, "user": "alice"}],
                        "memory_used_mib": 30000},  # job 555's memory: not checked on a shared GPU
    })
    log = quiet("epilog")
    assert run_epilog(site.environ(gpus="0,1"), log) == 0, log.lines
    assert mine.exited(timeout=5)
    assert not ignored.exited(timeout=0.2) and not strangers.exited()
    assert site.scontrol_calls() == []
    assert any("is not killed: user dcgm is in ignore_users" in line for line in log.lines)
    assert any(f"pid {strangers.pid} is not killed: the GPU is shared" in line for line in log.lines)
    assert (site.jobs_dir / "555.json").exists() and not (site.jobs_dir / "1234.json").exists()


@NEEDS_FREEZER
def test_process_in_another_jobs_cgroup_is_spared(site: HookSite, spawn: list[Leftover]) -> None:
    prolog(site)
    p = start(spawn, ["/bin/sleep", "300"])
    top = FREEZER / f"slurm_gpuslurmtest{uuid.uuid4().hex[:6]}"
    leaf = top / "uid_65534" / "job_777" / "step_0"
    leaf.mkdir(parents=True)
    try:
        (leaf / "cgroup.procs").write_text(str(p.pid))
        listed(site, 1, p.pid)
        log = quiet("epilog")
        assert run_epilog(site.environ(gpus="0,1"), log) == 0
        assert not p.exited()
        assert any("is not killed: it is in job 777's cgroup" in line for line in log.lines)
        assert site.scontrol_calls() == []
    finally:
        (FREEZER / "cgroup.procs").write_text(str(p.pid))
        for d in (leaf, leaf.parent, leaf.parent.parent, top):
            d.rmdir()


def test_kill_leftover_off_only_reports(site: HookSite, spawn: list[Leftover]) -> None:
    site.write_config("[epilog]\nkill_leftover = false\n")
    prolog(site)
    p = start(spawn, ["/bin/sleep", "300"])
    listed(site, 1, p.pid)
    assert run_epilog(site.environ(gpus="0,1"), quiet("epilog")) == 0
    assert not p.exited()
    [call] = site.scontrol_calls()
    assert (f"GPU index 1 (/dev/nvidia1, {site.uuids[1]}): 1 process(es) left after the job: "
            f"pid {p.pid} (nobody)") in call[3]


def test_pid_reuse_guards(spawn: list[Leftover]) -> None:
    gpu = "GPU-x"
    before = time.clock_gettime(time.CLOCK_BOOTTIME)
    time.sleep(0.1)
    p = start(spawn, ["/bin/sleep", "300"])
    # listed before this process existed: the PID now names someone else
    targets, skipped = plan_kills([(gpu, GpuProcess(p.pid, "nobody"))], "1234", 1000, {}, (), before,
                                  job_of_cgroup=parse_cgroup)
    assert targets == [] and skipped[(gpu, p.pid)][0] == "gone"
    targets, _ = plan_kills([(gpu, GpuProcess(p.pid, "nobody"))], "1234", 1000, {}, (),
                            time.clock_gettime(time.CLOCK_BOOTTIME), job_of_cgroup=parse_cgroup)
    assert [t.pid for t in targets] == [p.pid]
    assert targets[0].uid == pwd.getpwnam("nobody").pw_uid  # the owner seen when it was listed
    # between identification and the kill, the identity is checked again through the pidfd:
    # its start time, and its owner (a PID reused by another user's process at the same tick)
    wrong = Target(gpu, p.pid, "nobody", targets[0].start_ticks + 1)
    assert kill_processes([wrong], 0.1) == {p.pid: "gone before it was signalled"}
    other_owner = targets[0]._replace(uid=0)
    assert kill_processes([other_owner], 0.1) == {p.pid: "gone before it was signalled"}
    time.sleep(0.1)
    assert not p.exited(timeout=0.1)  # not signalled
    assert kill_processes(targets, 2) == {p.pid: "exited after SIGTERM"}
    assert p.exited()


def test_leftover_verdicts() -> None:
    assert leftover_verdict(5, None, "1", 1000, []) is None  # the GPU was the job's alone
    assert leftover_verdict(1000, "1", "1", 1000, [("2", 1000)]) is None  # its own cgroup
    assert leftover_verdict(1000, "2", "1", 1000, []) == "it is in job 2's cgroup"
    assert leftover_verdict(5, None, "1", 1000, [("2", 5)]) == \
        "the GPU is shared and the process is not this job's"
    assert leftover_verdict(1000, None, "1", 1000, [("2", 1000)]) == "its owner has another job on this GPU"
    assert leftover_verdict(1000, None, "1", 1000, [("2", 7)]) is None
    assert leftover_verdict(1000, None, "1", 1000, None) == "the other jobs on this GPU cannot be read"


def write_store(site: HookSite, start: float, uuids: list[str]) -> None:
    from gpuslurm.samples import Cycle, GpuSample
    from gpuslurm.state.store import Store

    (site.root / "state").mkdir(exist_ok=True)
    with Store.open(str(site.root / "state" / "monitor.db")) as store:
        for i in range(120):
            ts = start + i
            store.write_cycle(Cycle(ts, "node07", tuple(
                GpuSample(ts, u, util_pct=float(10 * n + i % 2 * 50), mem_used_mib=1024.0 * (n + 1) + i)
                for n, u in enumerate(uuids)), (), ()))
        before = GpuSample(start - 100, uuids[0], util_pct=100.0)  # before the job: not counted
        store.write_cycle(Cycle(start - 100, "node07", (before,), (), ()))
        store.rollup(start + 120, raw_window_s=60)


def test_summary_and_admin_comment_from_the_store(site: HookSite) -> None:
    site.write_config("[epilog]\nadmin_comment = true\n")
    prolog(site, gpus="4,5")
    start = json.loads((site.jobs_dir / "1234.json").read_text())["start"]
    write_store(site, start, site.uuids[4:6])
    log = quiet("epilog")
    assert run_epilog(site.environ(gpus="4,5"), log, now=start + 119) == 0, log.lines
    s = summary(site)
    assert s["monitor"] == "ok"
    g4, g5 = s["gpus"]  # type: ignore[misc]
    assert (g4["samples"], g4["util_mean_pct"], g4["util_max_pct"], g4["mem_peak_mib"]) == \
        (120, 25.0, 50.0, 1143.0)
    assert (g5["util_mean_pct"], g5["util_max_pct"], g5["mem_peak_mib"]) == (35.0, 60.0, 2167.0)
    [call] = site.scontrol_calls()
    assert call == ["update", "JobId=1234",
                    "AdminComment=gpuslurm/1: 2 GPU, util mean 30% max 60%, peak mem 2.1 GiB"]


def test_summary_without_a_store_does_not_load_sqlite(site: HookSite) -> None:
    prolog(site)
    code = ("import sys, io; from gpuslurm.slurm.hooks import run_epilog; "
            "from gpuslurm.hooks.log import HookLog; import json; "
            "rc = run_epilog(json.loads(sys.argv[1]), HookLog('epilog', io.StringIO(), False)); "
            "print(rc, 'sqlite3' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code, json.dumps(site.environ(gpus="0,1"))],
                         capture_output=True, text=True, check=True, timeout=60).stdout.split()
    assert out == ["0", "False"]
    s = summary(site)
    assert s["monitor"] == "no monitor data"
    assert all("util_mean_pct" not in g for g in s["gpus"])  # type: ignore[attr-defined]


def test_bad_store_or_failing_scontrol_never_drains(tmp_path: Path) -> None:
    site = make_site(tmp_path, scontrol_exit=1)
    site.write_config("[epilog]\nadmin_comment = true\n")
    prolog(site)
    (site.root / "state").mkdir(exist_ok=True)
    (site.root / "state" / "monitor.db").write_bytes(b"garbage" * 100)
    log = quiet("epilog")
    assert run_epilog(site.environ(gpus="0,1"), log) == 0
    assert any("cannot read the monitor store" in line and "not an SQLite database" in line
               for line in log.lines)
    assert any("cannot set the job's final comment" in line for line in log.lines)
    assert summary(site)["monitor"] == "no monitor data"
    assert (site.root / "state" / "monitor.db").read_bytes() == b"garbage" * 100  # a reader moves nothing
    [call] = site.scontrol_calls()
    assert call[2] == "AdminComment=gpuslurm/1: 2 GPU, no monitor data"


def test_admin_comment_text() -> None:
    a = GpuStats("a", 100, 100, 10.0, 20.0, 40_000.0)
    b = GpuStats("b", 300, 100, 50.0, 99.4, 72_908.8)  # utilisation known for 100 of its samples
    assert admin_comment(4, [a, b]) == "gpuslurm: 4 GPU, util mean 30% max 99%, peak mem 71.2 GiB"
    assert admin_comment(1, [GpuStats("a", 5, 0, None, None, 512.0)], killed=2) == \
        "gpuslurm: 1 GPU, peak mem 0.5 GiB, 2 leftover process(es) killed"
    assert admin_comment(2, []) == "gpuslurm: 2 GPU, no monitor data"


def test_summary_has_min_mean_temperature_power_and_the_gpus_taken_out(site: HookSite) -> None:
    from gpuslurm.samples import Cycle, GpuSample
    from gpuslurm.state.out_of_service import OutOfServiceStore, take_out
    from gpuslurm.state.store import Store

    prolog(site, gpus="4")
    start = json.loads((site.jobs_dir / "1234.json").read_text())["start"]
    (site.root / "state").mkdir(exist_ok=True)
    with Store.open(str(site.root / "state" / "monitor.db")) as store:
        for i in range(10):
            store.write_cycle(Cycle(start + i, "node07", (GpuSample(
                start + i, site.uuids[4], util_pct=float(10 + i), mem_used_mib=100.0 + i,
                power_w=200.0 + 10 * i, temp_c=50.0 + i),), (), ()))
    from gpuslurm.hw.source import load_node

    gpus = load_node(str(site.bundle)).gpus
    take_out(OutOfServiceStore(str(site.root / "state")), gpus, gpus[4],
             "Xid 79 (GPU has fallen off the bus)", "monitor", now=start + 5)
    assert run_epilog(site.environ(gpus="4"), quiet("epilog"), now=start + 9) == 0
    s = summary(site)
    [g] = s["gpus"]  # type: ignore[misc]
    assert (g["util_min_pct"], g["util_max_pct"], g["mem_min_mib"], g["mem_peak_mib"]) == \
        (10.0, 19.0, 100.0, 109.0)
    assert (g["temp_mean_c"], g["temp_max_c"], g["power_mean_w"], g["power_max_w"]) == \
        (54.5, 59.0, 245.0, 290.0)
    # energy: the power's trapezoid over the nine 1 s steps, (200+210)/2 + ... + (280+290)/2 J
    assert g["energy_j"] == sum((200 + 10 * i + 210 + 10 * i) / 2 for i in range(9)) == 2205.0
    [out] = s["gpus_out_of_service"]  # type: ignore[misc]
    assert out["uuid"] == site.uuids[4] and out["reason"].startswith("Xid 79")


JOBSTATS = "JS1:H4sIAAAAAAAAA6tWKkktLlGyUlAqS8wpTVWqBQBKxZvUEgAAAA=="  # Princeton jobstats' form


@pytest.mark.parametrize(("held", "written"), [
    ("", True), ("gpuslurm: 2 GPU, no monitor data", True),  # empty, or gpuslurm's (old or new)
    ("gpuslurm/1: 2 GPU, util mean 5% max 9%", True),
    (JOBSTATS, False), ("reboot after this job, ask ops", False), ("JS1:", False),
])
def test_admin_comment_written_only_into_an_empty_field_or_over_gpuslurms(
        tmp_path: Path, held: str, written: bool) -> None:
    """AdminComment is shared: jobstats writes it whole (JS1:...) and decodes it only when it holds
    nothing else, so the epilog leaves another tool's content alone and says so."""
    site = make_site(tmp_path)
    site.write_config("[epilog]\nadmin_comment = true\n")
    (site.root / "admin-comment.json").write_text(json.dumps(held))
    prolog(site)
    log = quiet("epilog")
    assert run_epilog(site.environ(gpus="0,1"), log) == 0, log.lines
    calls = site.scontrol_calls()
    if written:
        assert calls == [["update", "JobId=1234", "AdminComment=gpuslurm/1: 2 GPU, no monitor data"]]
    else:
        assert calls == []
        assert any("AdminComment left alone, it holds another tool's content" in line for line in log.lines)
