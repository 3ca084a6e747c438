"""The monitor's live health check: kernel-log Xids and NVML facts through the policy, then acted on.

Real files throughout (a kernel-log file in /dev/kmsg's record format, the out-of-service record,
the cursor); the scheduler is a recorder standing in for Slurm (the real one is in
tests/cluster/test_gpu_out_e2e.py).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from gpuslurm.config import Config, HealthConfig, XidCheck, parse_config
from gpuslurm.hw.live.kmsg import KmsgReader
from gpuslurm.hw.model.health import GpuHealth
from gpuslurm.hw.source import load_node
from gpuslurm.samples import Reading
from gpuslurm.state.out_of_service import RECORD_FILE, OutOfServiceStore
from gpuslurm.watch.health import HealthWatch
from gpuslurm.watch.monitor import Monitor

NODE = load_node("dgx-h100")
GPU3 = NODE.gpus[3]  # bus 00000000:61:00.0
BOOT = "4c6e53f2-19c9-4d03-a3bb-3747ff60f865"
GPU_OUT = HealthConfig(xid=XidCheck(action="gpu_out"))


class Recorder:
    """What the watch asked of the scheduler."""

    name = "recorder"

    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []

    def drain_node(self, node_name: str, reason: str) -> None:
        self.calls.append(("drain", node_name, reason))

    def apply_gpus_out(self, node_name: str, node: Any, out: Mapping[str, Any]) -> str:
        self.calls.append(("apply", node_name, tuple(sorted(out))))
        return f"{node_name}: {len(node.gpus) - len(out)} GPUs in service"

    def node_allocations(self, node_name: str, node: Any) -> tuple[Any, ...]:
        return ()

    def resume_node(self, node_name: str) -> None:
        self.calls.append(("resume", node_name))

    def refuse_job(self, job_id: str, reason: str) -> str:
        return "refused"

    def set_admin_comment(self, job_id: str, text: str) -> None:
        pass

    def set_final_comment(self, job_id: str, text: str) -> str:
        return "noted"


class Facts:
    """The facts NVML would give now; a test changes them between cycles."""

    def __init__(self) -> None:
        self.by_uuid: dict[str, GpuHealth] = {}

    def __call__(self, gpus: Sequence[Any]) -> dict[str, GpuHealth]:
        return {g.uuid: self.by_uuid.get(g.uuid, GpuHealth(g.uuid, temperature_c=40, ecc_uncorrectable=0))
                for g in gpus}


def _kmsg(tmp_path: Path, *lines: str) -> tuple[Path, KmsgReader]:
    log = tmp_path / "kmsg"
    log.write_text("6,1,5,-;Linux version\n" + "".join(lines))
    (tmp_path / "boot_id").write_text(BOOT)
    reader = KmsgReader(str(tmp_path / "state"), kmsg=str(log), boot_id=str(tmp_path / "boot_id"))
    assert reader.open() == ()
    return log, reader


def _xid(seq: int, code: int, bus: str = "61") -> str:
    return f"3,{seq},{seq},-;NVRM: Xid (PCI:0000:{bus}:00): {code}, pid=4242, name=python, words\n"


def _watch(tmp_path: Path, cfg: HealthConfig, reader: KmsgReader | None, facts: Facts | None = None
           ) -> tuple[HealthWatch, Recorder, OutOfServiceStore, list[str]]:
    store = OutOfServiceStore(str(tmp_path / "state"))
    sched = Recorder()
    said: list[str] = []
    watch = HealthWatch(NODE, cfg, facts or Facts(), store, "node1", scheduler=sched, kmsg=reader,
                        warn=said.append)
    return watch, sched, store, said


def test_xid_79_takes_only_that_gpu_out(tmp_path: Path) -> None:
    _, reader = _kmsg(tmp_path, _xid(2, 79))
    watch, sched, store, said = _watch(tmp_path, GPU_OUT, reader)
    assert watch.check(1000.0) == ()
    out = store.read()
    assert list(out) == [GPU3.uuid]
    rec = out[GPU3.uuid]
    assert rec.by == "monitor" and rec.index == 3 and "Xid 79 (GPU has fallen off the bus" in rec.reason
    assert sched.calls == [("apply", "node1", (GPU3.uuid,))]  # no drain: the node keeps serving
    assert any("Xid 79 on GPU index 3" in s for s in said)
    watch.check(1010.0)  # the next cycle: nothing new, nothing repeated
    assert sched.calls == [("apply", "node1", (GPU3.uuid,))]
    assert (tmp_path / "state" / "kmsg-cursor.json").exists()


def test_a_monitor_restart_does_not_count_the_line_again(tmp_path: Path) -> None:
    _, reader = _kmsg(tmp_path, _xid(2, 79))
    watch, _, store, _ = _watch(tmp_path, GPU_OUT, reader)
    watch.check(1000.0)
    reader.close()
    with store.update() as records:  # the admin brought it back (gpu online)
        records.clear()
    _, again = _kmsg(tmp_path, _xid(2, 79))  # same log, same boot: the cursor says it was counted
    watch2, sched2, store2, _ = _watch(tmp_path, GPU_OUT, again)
    watch2.check(2000.0)
    assert store2.read() == {}
    assert sched2.calls == []  # nothing out and nothing was: not even an scontrol call


def test_application_xids_and_63_are_not_faults(tmp_path: Path) -> None:
    _, reader = _kmsg(tmp_path, _xid(2, 13), _xid(3, 31), _xid(4, 43), _xid(5, 63))
    watch, sched, store, _ = _watch(tmp_path, GPU_OUT, reader)
    assert watch.check(1.0) == ()
    assert store.read() == {} and sched.calls == []


def test_unknown_bus_id_is_a_problem(tmp_path: Path) -> None:
    _, reader = _kmsg(tmp_path, _xid(2, 79, bus="07"))
    watch, _, store, _ = _watch(tmp_path, GPU_OUT, reader)
    problems = watch.check(1.0)
    assert [p.detail for p in problems] == [
        "Xid 79 on 00000000:07:00.0, which is not one of this node's GPUs"]
    assert store.read() == {}


def test_ecc_with_drain_drains_once_and_log_only_logs(tmp_path: Path) -> None:
    facts = Facts()
    facts.by_uuid[NODE.gpus[5].uuid] = GpuHealth(NODE.gpus[5].uuid, ecc_uncorrectable=3)
    facts.by_uuid[NODE.gpus[6].uuid] = GpuHealth(NODE.gpus[6].uuid, temperature_c=99)
    cfg = parse_config('[health.temperature]\naction = "log"\n').health
    watch, sched, store, _ = _watch(tmp_path, cfg, None, facts)
    problems = watch.check(1.0)
    drains = [c for c in sched.calls if c[0] == "drain"]
    assert len(drains) == 1 and "index 5" in drains[0][2] and "3 uncorrectable ECC" in drains[0][2]
    assert [p.subject for p in problems] == [NODE.gpus[6].uuid]  # the logged one
    watch.check(2.0)
    assert len([c for c in sched.calls if c[0] == "drain"]) == 1
    assert store.read() == {}


def test_the_last_gpu_drains_the_node_instead(tmp_path: Path) -> None:
    facts = Facts()
    store = OutOfServiceStore(str(tmp_path / "state"))
    from gpuslurm.state.out_of_service import take_out

    for g in NODE.gpus[:7]:
        take_out(store, NODE.gpus, g, "earlier", "admin", now=1.0)
    last = NODE.gpus[7]
    facts.by_uuid[last.uuid] = GpuHealth(last.uuid, lost=True)
    cfg = parse_config('[health.lost_gpu]\naction = "gpu_out"\n').health
    watch, sched, store, _ = _watch(tmp_path, cfg, None, facts)
    problems = watch.check(5.0)
    assert last.uuid not in store.read()
    assert any(c[0] == "drain" and "index 7" in c[2] for c in sched.calls)
    assert any("last GPU in service" in p.detail for p in problems)


def test_a_corrupt_record_is_reported_and_nothing_taken_out(tmp_path: Path) -> None:
    _, reader = _kmsg(tmp_path, _xid(2, 79))
    (tmp_path / "state").mkdir()
    (tmp_path / "state" / RECORD_FILE).write_text("{not json")
    watch, sched, _, _ = _watch(tmp_path, GPU_OUT, reader)
    problems = watch.check(1.0)
    assert [p.subject for p in problems] == ["out-of-service"]
    assert (tmp_path / "state" / RECORD_FILE).read_text() == "{not json"
    assert sched.calls == []
    assert not (tmp_path / "state" / "kmsg-cursor.json").exists()  # the Xid is read again next time


class OneReading:
    def read(self, now: float) -> Reading:
        return Reading((), (), ())

    def close(self) -> None:
        pass


class NoStore:
    def write_cycle(self, cycle: Any, violations: Any = ()) -> None:
        pass

    def rollup(self, now: float, raw_window_s: float) -> None:
        pass


def test_the_monitor_runs_the_check_each_cycle_and_stores_its_problems(tmp_path: Path) -> None:
    from gpuslurm.watch.attribute import Attributor

    _, reader = _kmsg(tmp_path, _xid(2, 79, bus="07"))
    watch, _, _, _ = _watch(tmp_path, GPU_OUT, reader)
    clock = iter([100.0, 110.0])
    mon = Monitor(OneReading(), Attributor(jobs_dir=str(tmp_path / "jobs")), NoStore(), "node1",
                  health=watch.check, clock=lambda: next(clock))
    mon.cycle()
    second = mon.cycle()
    assert [p.kind for p in second.problems] == ["health"]


@pytest.mark.parametrize("text", ['[monitor]\nkmsg = "relative"\n', '[gpu_out]\njob_on_gpu = "explode"\n'])
def test_config_refusals(text: str) -> None:
    from gpuslurm.errors import InputError

    with pytest.raises(InputError):
        parse_config(text)
    assert Config().monitor.kmsg == "auto"
    assert parse_config('[monitor]\nkmsg = "auto"\n').monitor.kmsg == "auto"


class Queued:
    """What NvmlEvents.drain hands the cycle (the thread itself: tests/hw/nvml/test_events.py)."""

    def __init__(self, *events: Any) -> None:
        self.events = list(events)

    def drain(self) -> tuple[list[Any], list[str]]:
        out, self.events = self.events, []
        return out, []


def test_the_same_xid_from_nvml_events_and_the_kernel_log_counts_once(tmp_path: Path) -> None:
    from gpuslurm.hw.live.nvml_events import XidEvent

    _, reader = _kmsg(tmp_path, _xid(2, 79))
    store = OutOfServiceStore(str(tmp_path / "state"))
    sched = Recorder()
    said: list[str] = []
    watch = HealthWatch(NODE, GPU_OUT, Facts(), store, "node1", scheduler=sched, kmsg=reader,
                        events=Queued(XidEvent(GPU3.uuid, 79)), warn=said.append)  # type: ignore[arg-type]
    assert watch.check(1.0) == ()
    assert list(store.read()) == [GPU3.uuid] and watch.xids == {GPU3.uuid: {79}}
    assert sched.calls == [("apply", "node1", (GPU3.uuid,))]
    assert any("NVML event: Xid 79" in s for s in said) and any("kernel log: Xid 79" in s for s in said)


def test_a_gpu_unavailable_event_is_the_gpu_lost(tmp_path: Path) -> None:
    """R565's event for a GPU off the bus: the lost_gpu check's action, with no Xid needed."""
    from gpuslurm.hw.live.nvml_events import XidEvent

    store = OutOfServiceStore(str(tmp_path / "state"))
    sched = Recorder()
    said: list[str] = []
    cfg = parse_config('[health.lost_gpu]\naction = "gpu_out"\n').health
    watch = HealthWatch(NODE, cfg, Facts(), store, "node1", scheduler=sched,
                        events=Queued(XidEvent(GPU3.uuid, 0, lost=True)), warn=said.append)  # type: ignore[arg-type]
    assert watch.check(1.0) == ()
    assert {u: r.reason for u, r in store.read().items()} == {GPU3.uuid: "GPU is lost"}
    assert watch.xids == {} and any("unavailable (fell off the bus)" in s for s in said)


def test_a_gpu_lost_before_the_node_was_read_drains_by_its_index(tmp_path: Path) -> None:
    """NVML had no UUID for GPU 3 when the monitor read the node: gpu_out cannot record it, so the
    node is drained once, naming the index; a GPU already out by that index is left alone."""
    node = NODE._replace(gpus=tuple(g for g in NODE.gpus if g.index != 3), lost=(3,))
    cfg = parse_config('[health.lost_gpu]\naction = "gpu_out"\n').health
    store = OutOfServiceStore(str(tmp_path / "state"))
    sched = Recorder()
    watch = HealthWatch(node, cfg, Facts(), store, "node1", scheduler=sched)
    watch.check(1.0)
    watch.check(2.0)
    assert [c for c in sched.calls if c[0] == "drain"] == [
        ("drain", "node1", "gpuslurm: GPU index 3 (lost): GPU is lost (NVML answers GPU_IS_LOST: it cannot "
                           "be read or named)")]
    assert store.read() == {}
    from gpuslurm.state.out_of_service import take_out

    take_out(store, NODE.gpus, GPU3, "Xid 79", "admin", now=1.0)
    again = Recorder()
    HealthWatch(node, cfg, Facts(), store, "node1", scheduler=again).check(3.0)
    assert [c for c in again.calls if c[0] == "drain"] == []


# --- the kernel log as an attacker writes it ---------------------------------------------------

# The records an ordinary user made the kernel log (tests/policy/test_xid_kmsg.py holds them as
# read from /dev/kmsg), aimed at this node's GPU 3 (bus 61), and the driver's line as root's
# `echo '<3>NVRM: Xid ...' > /dev/kmsg` files it (LOG_USER: PRI 11).
ATTACKS = (
    "3,2,316543191,-;overlayfs: failed to resolve '/nonexistent/NVRM: Xid (PCI:0000:61:00): 48 DBE': -2\n",
    "4,3,326670542,-;process 'python3' launched '/tmp/xidnull/NVRM: Xid (PCI:0000:61:00): 79, "
    "GPU has fallen off the bus' with NULL argv: empty string added\n",
    "11,4,326700000,-;NVRM: Xid (PCI:0000:61:00): 79, pid=1, name=x, GPU has fallen off the bus.\n",
)


@pytest.mark.parametrize("action", ["drain", "gpu_out"])
def test_a_users_xid_text_in_the_kernel_log_acts_on_nothing_and_the_drivers_line_still_does(
        tmp_path: Path, action: str) -> None:
    log, reader = _kmsg(tmp_path, *ATTACKS)
    cfg = HealthConfig(xid=XidCheck(action=action))
    watch, sched, store, said = _watch(tmp_path, cfg, reader)
    assert watch.check(1.0) == ()
    assert sched.calls == [] and store.read() == {}
    assert not any("Xid" in s for s in said)
    with log.open("a") as fh:  # then the driver itself logs one
        fh.write(_xid(5, 48))
    watch.check(2.0)
    if action == "drain":
        assert [c[0] for c in sched.calls] == ["drain"] and "Xid 48 (double-bit ECC" in sched.calls[0][2]
    else:
        assert list(store.read()) == [GPU3.uuid] and sched.calls == [("apply", "node1", (GPU3.uuid,))]


# The driver's line names the process that faulted (name=, its comm: the user chooses it). Read
# from /dev/kmsg a control byte arrives escaped (\x0a); read from a file, raw bytes can arrive too.
HOSTILE_NAMES = (
    '"; scontrol update NodeName=node1 State=DOWN #',
    "a'b\"c;$(reboot)`id`",
    "x\\x0aReason=pwned\\x0d",
    "x\rReason=pwned\x1b[2J\x00",
    "x\nReason=pwned",  # a raw newline ends the record: the rest is a line with no header
)


def _scontrol_stand_in(tmp_path: Path) -> tuple[str, Path]:
    """An scontrol that records each call's argv, NUL-separated, one call per line."""
    calls = tmp_path / "scontrol-calls"
    script = tmp_path / "scontrol"
    script.write_text(f"#!/bin/sh\nprintf '%s\\0' \"$@\" >> {calls}\necho >> {calls}\n")
    script.chmod(0o755)
    return str(script), calls


@pytest.mark.parametrize("name", HOSTILE_NAMES)
def test_a_users_process_name_in_the_drivers_line_never_reaches_a_command(tmp_path: Path, name: str) -> None:
    from gpuslurm.pbs.gpu_out import plan
    from gpuslurm.slurm.adapter import SlurmScheduler
    from gpuslurm.slurm.gpu_out import comment

    line = f"3,2,2,-;NVRM: Xid (PCI:0000:61:00): 79, pid=4242, name={name}, GPU has fallen off the bus.\n"
    scontrol, calls = _scontrol_stand_in(tmp_path)
    (tmp_path / "drain").mkdir()
    (tmp_path / "out").mkdir()
    _, reader = _kmsg(tmp_path / "drain", line)
    said: list[str] = []
    slurm = SlurmScheduler(squeue="/nonexistent/squeue", scontrol=scontrol, timeout=10)
    watch = HealthWatch(NODE, HealthConfig(), Facts(), OutOfServiceStore(str(tmp_path / "drain" / "state")),
                        "node1", scheduler=slurm, kmsg=reader, warn=said.append)
    assert watch.check(1.0) == ()
    (argv,) = [c.split("\0")[:-1] for c in calls.read_text().splitlines()]
    label = f"index 3 (/dev/nvidia{GPU3.minor}, {GPU3.uuid})"
    assert argv == ["update", "NodeName=node1", "State=DRAIN",
                    f"Reason=gpuslurm: GPU {label}: Xid 79 (GPU has fallen off the bus; needs reboot)"]
    assert all(s.isprintable() and "\n" not in s for s in said)  # the log keeps the name, one line
    assert any("name=x" in s or "name=a'b" in s or 'name="' in s for s in said)

    _, reader = _kmsg(tmp_path / "out", line)  # the gpu_out path: the record, Slurm's and PBS's comments
    watch, _, store, _ = _watch(tmp_path / "out", GPU_OUT, reader)
    watch.check(1.0)
    out = store.read()
    assert out[GPU3.uuid].reason == "Xid 79 (GPU has fallen off the bus; needs reboot)"
    assert "pwned" not in comment(out) and "\n" not in comment(out)
    for vnode in plan(NODE, "pbshost", out, True):
        directive = f'set node {vnode.vnode} comment = "{vnode.comment}"'
        assert directive.count('"') == 2 and directive.isprintable()
        assert "pwned" not in directive and "reboot)`" not in directive and "scontrol" not in directive


def test_the_last_gpu_drains_once_and_an_admins_resume_stands(tmp_path: Path) -> None:
    """The one fault response: a fault already acted on drains the node no more, whatever its
    action (the monitor drained the node again every cycle for the last GPU's ``gpu_out``)."""
    facts = Facts()
    store = OutOfServiceStore(str(tmp_path / "state"))
    from gpuslurm.state.out_of_service import take_out

    for g in NODE.gpus[:7]:
        take_out(store, NODE.gpus, g, "earlier", "admin", now=1.0)
    last = NODE.gpus[7]
    facts.by_uuid[last.uuid] = GpuHealth(last.uuid, lost=True)
    cfg = parse_config('[health.lost_gpu]\naction = "gpu_out"\n').health
    watch, sched, _, _ = _watch(tmp_path, cfg, None, facts)
    watch.check(5.0)
    watch.check(10.0)
    watch.check(15.0)
    assert len([c for c in sched.calls if c[0] == "drain"]) == 1


def test_a_record_that_cannot_be_written_drains_instead(tmp_path: Path) -> None:
    _, reader = _kmsg(tmp_path, _xid(2, 79))
    watch, sched, _, _ = _watch(tmp_path, GPU_OUT, reader)
    (tmp_path / "state" / "out-of-service.lock").mkdir(parents=True)  # the lock cannot be opened
    problems = watch.check(1.0)
    assert any("draining the node instead" in p.detail for p in problems)
    assert [c[0] for c in sched.calls] == ["drain"] and "index 3" in sched.calls[0][2]
