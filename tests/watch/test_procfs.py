"""/proc readers against real processes: alive, exiting, reused, unreadable."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from tests.helpers.watch_helpers import sleeper, stop

from gpuslurm.hw.live import procfs
from gpuslurm.hw.live.procfs import ProcessFacts, ProcessProblem, parse_stat, read_identity, read_process


def test_parse_stat_takes_the_name_up_to_the_last_parenthesis() -> None:
    fields = ["S"] + ["1"] * 18 + ["4242"] + ["0"] * 20
    ident = parse_stat(f"9 (evil) (name)) {' '.join(fields)}\n".encode())
    assert ident == procfs.ProcIdentity("evil) (name)", 4242, 1)
    with pytest.raises(ValueError):
        parse_stat(b"no parenthesis here")


def test_the_session_is_read_from_stat() -> None:
    ident = read_identity(os.getpid())
    assert not isinstance(ident, ProcessProblem)
    assert ident.session == os.getsid(0)


def test_a_live_process_is_read_whole() -> None:
    proc = sleeper()
    try:
        facts = read_process(proc.pid)
    finally:
        stop(proc)
    assert isinstance(facts, ProcessFacts)
    assert (facts.pid, facts.comm, facts.uid) == (proc.pid, "sleep", os.getuid())
    assert facts.cgroup == Path(f"/proc/{os.getpid()}/cgroup").read_text()  # inherited from us
    assert abs(procfs.start_time(facts.start_ticks) - time.time()) < 60


def test_an_exited_process_is_gone() -> None:
    proc = sleeper()
    stop(proc)
    assert read_process(proc.pid) == ProcessProblem(proc.pid, "pid-gone", "the process exited")
    assert read_identity(proc.pid).kind == "pid-gone"  # type: ignore[union-attr]


def test_processes_exiting_while_being_read_never_raise() -> None:
    """Many short-lived real processes read while they exit: every answer is facts or gone."""
    kinds = set()
    for _ in range(40):
        proc = subprocess.Popen(["/bin/true"])
        for _ in range(5):
            r = read_process(proc.pid)
            kinds.add("facts" if isinstance(r, ProcessFacts) else r.kind)
        proc.wait()
        r = read_process(proc.pid)
        kinds.add("facts" if isinstance(r, ProcessFacts) else r.kind)
    assert kinds <= {"facts", "pid-gone"} and "pid-gone" in kinds


def test_a_reused_pid_between_reads_is_gone(tmp_path: Path) -> None:
    """The identity given (an earlier stat reading) no longer matches: another process."""
    proc = sleeper()
    try:
        ident = read_identity(proc.pid)
        assert isinstance(ident, procfs.ProcIdentity)
        stale = ident._replace(start_ticks=ident.start_ticks - 1)
        r = read_process(proc.pid, identity=stale)
    finally:
        stop(proc)
    assert isinstance(r, ProcessProblem) and r.kind == "pid-gone" and "reused" in r.detail


def _fake(tmp_path: Path, pid: int, stat: str | None, cgroup: str | None, status: str | None) -> str:
    d = tmp_path / str(pid)
    d.mkdir(parents=True)
    for name, text in (("stat", stat), ("cgroup", cgroup), ("status", status)):
        if text is not None:
            (d / name).write_text(text)
    return str(tmp_path)


STAT = "5 (x) S " + " ".join(["0"] * 30) + "\n"


@pytest.mark.parametrize(("stat", "cgroup", "status", "kind"), [
    ("garbage", "0::/\n", "Uid:\t0\n", "proc-unreadable"),
    ("", "0::/\n", "Uid:\t0\n", "pid-gone"),  # a reaped process leaves empty files
    (STAT, None, "Uid:\t0\n", "pid-gone"),
    (STAT, "0::/\n", "Name:\tx\n", "proc-unreadable"),
    (STAT, "0::/\n", "", "pid-gone"),
])
def test_odd_proc_entries(tmp_path: Path, stat: str, cgroup: str | None, status: str | None,
                          kind: str) -> None:
    root = _fake(tmp_path, 5, stat, cgroup, status)
    r = read_process(5, root)
    assert isinstance(r, ProcessProblem) and r.kind == kind


def test_an_entry_the_reader_may_not_read_is_unreadable(tmp_path: Path) -> None:
    """Run the reader as nobody against a file it has no permission for (root would bypass it)."""
    if os.geteuid() != 0:
        pytest.skip("needs root to switch to nobody")
    root = tmp_path / "proc"
    _fake(root, 5, STAT, "0::/\n", "Uid:\t0\n")
    os.chmod(root / "5" / "cgroup", 0)
    tmp_path.chmod(0o755)
    root.chmod(0o755)
    rfd, wfd = os.pipe()
    child = os.fork()
    if child == 0:  # as nobody, in a forked copy of this process (nobody cannot run our python)
        try:
            os.setgroups([])
            os.setgid(65534)
            os.setuid(65534)
            r = read_process(5, str(root))
            os.write(wfd, f"{r.kind} {r.detail}".encode())  # type: ignore[union-attr]
        finally:
            os._exit(0)
    os.close(wfd)
    out = os.read(rfd, 4096).decode()
    os.close(rfd)
    os.waitpid(child, 0)
    assert out.startswith("proc-unreadable ") and "Permission denied" in out


def test_status_parser_reads_real_files_and_bounds_the_rest() -> None:
    """The one /proc/PID/status parser (monitor, kills, MPS stop): live files of this process
    and of init, a zombie's state, and hostile text never anything but ValueError/IndexError."""
    from gpuslurm.hw.live.procfs import ProcStatus, parse_status, read_status

    me = read_status(os.getpid())
    assert isinstance(me, ProcStatus) and me.uid == os.getuid() and me.ppid == os.getppid() and me.alive
    child = subprocess.Popen(["/bin/true"])
    deadline = time.monotonic() + 10
    while isinstance(status := read_status(child.pid), ProcStatus) and status.alive:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    assert isinstance(status, ProcStatus) and status.state == "Z" and not status.alive  # not reaped
    child.wait()
    assert read_status(child.pid) == ProcessProblem(child.pid, "pid-gone", "the process exited")
    fake = b"Name:\tx\nUid:\t7\t7\t7\t7\nState:\tS (sleeping)\nPPid:\t1\n"
    assert parse_status(fake) == ProcStatus(7, "S", 1)
    assert parse_status(b"Uid:\t0\t0\t0\t0\n") == ProcStatus(0)  # a replayed /proc: running, no parent
    with pytest.raises(ValueError):
        parse_status(b"Name:\tUid: 0\nState:\tR\nPPid:\t1\n")  # a Uid: that is not at a line start


@given(st.binary(max_size=200))
def test_status_parser_is_total(data: bytes) -> None:
    from gpuslurm.hw.live.procfs import parse_status

    try:
        parse_status(data)
    except (ValueError, IndexError):
        pass


def test_uids_of_a_live_process_and_of_a_name_that_tries_to_forge_them() -> None:
    """PBS's execjob_attach lets only the job's user's process in, all four uids checked: read
    through the door, and a process cannot name itself into another Uid line (the kernel escapes
    a newline in ``Name:``)."""
    from gpuslurm.hw.live.procfs import parse_uids, read_uids

    me = os.getuid()
    assert read_uids(os.getpid()) == (me, os.geteuid(), me, me)
    forger = subprocess.Popen(["/usr/bin/python3", "-c", "import sys, ctypes; ctypes.CDLL(None).prctl("
                               "15, b'x\\nUid:\\t0\\t0\\t0\\t0', 0, 0, 0); sys.stdin.read()"],
                              stdin=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 10
        while "Uid" not in Path(f"/proc/{forger.pid}/comm").read_text():  # prctl(PR_SET_NAME) done
            assert time.monotonic() < deadline
            time.sleep(0.01)
        assert read_uids(forger.pid) == (me, os.geteuid(), me, me)
    finally:
        stop(forger)
    assert parse_uids(b"Name:\tx\nUid:\t1000\t1000\t0\t1000\n") == (1000, 1000, 0, 1000)
    for bad in (b"Name:\tx\n", b"Uid:\t1000\t1000\n", b"Uid:\t1000\t1000\t1000\t-1\n",
                b"Name:\tUid: 0 0 0 0\n"):
        with pytest.raises(ValueError):
            parse_uids(bad)


@given(st.binary(max_size=200))
def test_uid_parser_is_total(data: bytes) -> None:
    """Any text: four uids of the Uid line at a line start, or ValueError."""
    from gpuslurm.hw.live.procfs import parse_uids

    try:
        uids = parse_uids(data)
    except ValueError:
        return
    assert len(uids) == 4 and all(u >= 0 for u in uids)
    assert data.startswith(b"Uid:") or b"\nUid:" in data
