"""A PBS job's own devices cgroup on cgroup v2, tried as the job's user would.

gpuslurm's PBS side (``gpuslurm.pbs.entry``, what the hook runs) is driven in-process with the
requests the hook sends, on this host's real cgroup2 mount (``/sys/fs/cgroup/unified``, hybrid
layout, where BPF device programs attach and hold): the real pbs_mom of the test cluster runs on
the v1 hierarchy, and moving its jobs' tasks onto the hybrid v2 mount would test the layout, not
PBS. execjob_begin makes ``gpuslurm.pbs/job_<id>`` with the BPF program, execjob_launch moves the
job's process (running as ``nobody``) into it, and that process, as the attacker, opens the GPUs
(its own: ENXIO, a fake device let through; the others: EPERM) and tries to leave; execjob_end
kills it and removes the cgroup. Root only.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from tests.helpers.cgroup_helpers import UNIFIED, as_nobody, make_gpu_files, v2_unavailable

from gpuslurm.hw.source import BUILTIN_DIR, load_node
from gpuslurm.isolate import bpf
from gpuslurm.isolate.cgroup_v2 import V2_PBS_PARENT, v2_pbs_dir
from gpuslurm.pbs.entry import main

JOB = "41.pbshost"
# As the job's user: wait for a line (the launch has moved us), open each device, try to leave
# the cgroup (write our pid into the root's and another cgroup's cgroup.procs), say where we are,
# then wait to be killed.
ATTACKER = """
import errno, os, sys
sys.stdin.readline()
for path in sys.argv[2:]:
    try:
        open(path, "rb").close()
        print(path, "OK")
    except OSError as exc:
        print(path, errno.errorcode.get(exc.errno, exc.errno))
for target in (sys.argv[1] + "/cgroup.procs", sys.argv[1] + "/%s/cgroup.procs" % "gpuslurm.pbs"):
    try:
        with open(target, "w") as fh:
            fh.write(str(os.getpid()))
        print("move", target, "OK")
    except OSError as exc:
        print("move", target, errno.errorcode.get(exc.errno, exc.errno))
print("cgroup", [l for l in open("/proc/self/cgroup").read().splitlines() if l.startswith("0::")][0])
sys.stdout.flush()
sys.stdin.readline()
"""


def _skip_reason() -> str | None:
    return v2_unavailable("cgroup v2 PBS isolation tests")


pytestmark = pytest.mark.skipif(_skip_reason() is not None, reason=str(_skip_reason()))


@pytest.fixture
def site(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    bundle = tmp_path / "dgx-h100"
    shutil.copytree(BUILTIN_DIR / "dgx-h100", bundle)
    config = tmp_path / "gpuslurm.toml"
    config.write_text(f'[paths]\nrun_dir = "{tmp_path}/run"\nstate_dir = "{tmp_path}/state"\n'
                      f'cgroup_root = "{UNIFIED}"\n[cgroup]\ndevices = "always"\n')
    monkeypatch.setenv("GPUSLURM_CONFIG", str(config))
    monkeypatch.setenv("GPUSLURM_CAPTURE", str(bundle))
    parent = Path(UNIFIED) / V2_PBS_PARENT
    existed = parent.exists()
    yield bundle
    cgroup = Path(v2_pbs_dir(UNIFIED, JOB))
    if cgroup.exists():  # a failed test: what is left in it goes with it
        for pid in (cgroup / "cgroup.procs").read_text().split():
            os.kill(int(pid), 9)
        cgroup.rmdir()
    if not existed:
        try:
            parent.rmdir()
        except OSError:
            pass


def call(event: str, **doc: Any) -> tuple[int, dict[str, Any] | None, list[str]]:
    request = {"format": 1, "event": event, "hostname": "pbshost", "job_id": JOB, "euser": "nobody",
               "exec_vnode": "(pbshost[0]:ncpus=2:ngpus=2)", "exec_host": "pbshost/0*2", **doc}
    out, err = io.StringIO(), io.StringIO()
    rc = main([event], io.BytesIO(json.dumps(request).encode()), out, err)
    return rc, json.loads(out.getvalue()) if out.getvalue() else None, err.getvalue().splitlines()


def test_a_pbs_job_on_cgroup_v2_opens_only_its_gpus_and_cannot_leave_its_cgroup(site: Path) -> None:
    node = load_node(str(site))
    rc, answer, lines = call("execjob_begin")
    assert (rc, answer) == (0, {"format": 1, "accept": True}), lines
    cgroup = Path(v2_pbs_dir(UNIFIED, JOB))
    assert cgroup.parent.name == V2_PBS_PARENT and cgroup.parent.stat().st_uid == 0
    assert (cgroup / "cgroup.procs").stat().st_uid == 0  # not the user's to join or leave
    fd = os.open(cgroup, os.O_RDONLY | os.O_DIRECTORY)
    try:
        assert len(bpf.attached_program_ids(fd)) == 1
    finally:
        os.close(fd)
    mapped = json.loads((site.parent / "run" / "jobs" / f"{JOB}.json").read_text())
    mine = {g["minor"] for g in mapped["gpus"]}
    assert len(mine) == 2
    gpus = make_gpu_files(sorted(g.minor for g in node.gpus))
    gpu_dir = next(gpus)
    proc: subprocess.Popen[str] | None = None
    try:
        proc = as_nobody(["/usr/bin/python3", "-c", ATTACKER, UNIFIED,
                          *(str(gpu_dir / f"nvidia{g.minor}") for g in node.gpus)],
                         stdin=subprocess.PIPE)
        rc, answer, lines = call("execjob_launch", pid=proc.pid)
        assert rc == 0 and answer is not None and answer["accept"] is True, lines
        assert any(f"process {proc.pid} joined {cgroup}" in line for line in lines), lines
        assert proc.stdin is not None and proc.stdout is not None
        proc.stdin.write("go\n")
        proc.stdin.flush()
        seen = [proc.stdout.readline().split() for _ in range(len(node.gpus) + 3)]
        opened = {Path(p).name: r for p, r in seen[: len(node.gpus)]}
        for g in node.gpus:
            want = "ENXIO" if g.minor in mine else "EPERM"  # ENXIO: let through to a fake device
            assert opened[f"nvidia{g.minor}"] == want, (g.minor, opened)
        moves = seen[len(node.gpus): len(node.gpus) + 2]
        assert [m[2] for m in moves] == ["EACCES", "EACCES"], moves
        assert seen[-1][1] == f"0::/{V2_PBS_PARENT}/job_{JOB}", seen[-1]
        # the end kills what is left in the cgroup and removes it
        rc, answer, lines = call("execjob_end")
        assert rc == 0 and answer == {"format": 1, "accept": True}, lines
        assert proc.wait(timeout=10) == -9
        assert not cgroup.exists()
        assert any(f"removed {cgroup}" in line for line in lines), lines
    finally:
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait()
        next(gpus, None)


def test_the_monitor_attributes_a_process_in_it_to_the_pbs_job() -> None:
    from gpuslurm.pbs.cgroup_paths import parse_cgroup

    assert parse_cgroup(f"0::/{V2_PBS_PARENT}/job_{JOB}\n") is not None
    assert parse_cgroup(f"0::/{V2_PBS_PARENT}/job_{JOB}\n").job_id == JOB  # type: ignore[union-attr]
    # gpuslurm's v1 devices cgroup (a PBS job's, or a Slurm job's) names its job too
    assert parse_cgroup(f"7:devices:/gpuslurm/job_{JOB}\n").job_id == JOB  # type: ignore[union-attr]
    # only at the hierarchy's top: below it, or in a user's own delegated cgroup, no job
    assert parse_cgroup(f"0::/system.slice/x.service/{V2_PBS_PARENT}/job_{JOB}\n") is None
    assert parse_cgroup(f"0::/user.slice/user-1.slice/user@1.service/{V2_PBS_PARENT}/job_{JOB}\n") is None


def test_pbs_attach_of_a_process_not_the_users_moves_nothing_and_kills_nothing(site: Path) -> None:
    """pbs_mom runs execjob_attach with whatever pid ``pbs_attach -p`` names, and checks that the
    process is the job's user's only after its hooks ran. The job's user (``nobody``) names a
    root daemon's pid: it stays where it is (the attach refused, exit 2), and the job's end, which
    kills everything in the job's cgroup, leaves it alive; the user's own process still joins."""
    rc, _, lines = call("execjob_begin")
    assert rc == 0, lines
    cgroup = Path(v2_pbs_dir(UNIFIED, JOB))
    victim = subprocess.Popen(["/bin/sleep", "300"])  # root's: a daemon on the node
    own = as_nobody(["/bin/sleep", "300"])
    try:
        before = Path(f"/proc/{victim.pid}/cgroup").read_text()
        rc, _, lines = call("execjob_attach", pid=victim.pid)
        assert rc == 2 and "not the job's user's" in lines[-1], lines
        assert Path(f"/proc/{victim.pid}/cgroup").read_text() == before
        rc, _, lines = call("execjob_attach", pid=own.pid)
        assert rc == 0 and any(f"process {own.pid} joined {cgroup}" in line for line in lines), lines
        rc, _, lines = call("execjob_end")
        assert rc == 0, lines
        assert own.wait(timeout=10) == -9
        assert victim.poll() is None and not cgroup.exists()
    finally:
        for proc in (victim, own):
            if proc.poll() is None:
                proc.kill()
                proc.wait()


MKDIR = """
import errno, os, sys
for what, act in (("mkdir", lambda: os.mkdir(sys.argv[1] + "/escape")),
                  ("subtree", lambda: open(sys.argv[1] + "/cgroup.subtree_control", "w").write("+pids")),
                  ("kill", lambda: open(sys.argv[1] + "/cgroup.kill", "w").write("1"))):
    try:
        act()
        print(what, "OK")
    except OSError as exc:
        print(what, errno.errorcode.get(exc.errno, exc.errno))
"""


def test_the_user_cannot_make_a_child_cgroup_or_touch_the_jobs_control_files(site: Path) -> None:
    """A child cgroup of the user's own could hold a BPF program of theirs (or none at all in an
    override attachment): the job's cgroup is root's, so ``nobody`` can make none, nor enable
    controllers or kill the cgroup's processes (the end's job)."""
    rc, _, lines = call("execjob_begin")
    assert rc == 0, lines
    cgroup = Path(v2_pbs_dir(UNIFIED, JOB))
    proc = as_nobody(["/usr/bin/python3", "-c", MKDIR, str(cgroup)])
    out, err = proc.communicate(timeout=60)
    assert out.split("\n")[:3] == ["mkdir EACCES", "subtree EACCES", "kill EACCES"], (out, err)
    assert [p.name for p in cgroup.iterdir() if p.is_dir()] == []
    rc, _, lines = call("execjob_end")
    assert rc == 0 and not cgroup.exists(), lines


def test_pbs_attach_cannot_move_the_users_process_out_of_another_jobs_cgroup(site: Path) -> None:
    """The same user runs two jobs; ``pbs_attach -j A -p PID`` with a process of job B would take
    it out of B's device limits (and out of B's end): refused, it stays in B."""
    other = "42.pbshost"
    rc, _, lines = call("execjob_begin")
    assert rc == 0, lines
    rc, _, lines = call("execjob_begin", job_id=other)
    assert rc == 0, lines
    own = as_nobody(["/bin/sleep", "300"])
    try:
        rc, _, lines = call("execjob_attach", job_id=other, pid=own.pid)
        assert rc == 0, lines
        before = Path(f"/proc/{own.pid}/cgroup").read_text()
        assert f"/job_{other}" in before
        rc, _, lines = call("execjob_attach", pid=own.pid)
        assert rc == 2 and f"is in job {other}'s cgroup" in lines[-1], lines
        assert Path(f"/proc/{own.pid}/cgroup").read_text() == before
    finally:
        assert call("execjob_end", job_id=other)[0] == 0
        if own.poll() is None:
            own.kill()
        own.wait()
        assert not Path(v2_pbs_dir(UNIFIED, other)).exists()


@pytest.mark.parametrize("layout", ["v2", "v1"])
def test_pbs_attach_cannot_move_the_users_mps_daemon_out_of_its_jobs_cgroup(site: Path, layout: str) -> None:
    """Job 41 of ``nobody`` asked for MPS: its daemon runs as ``nobody`` in gpuslurm's MPS cgroup of
    job 41 (v2 ``gpuslurm.mps/mps_<id>``, v1 ``devices/gpuslurm/mps_<id>``). ``pbs_attach -j 42 -p
    DAEMON`` by the same user would take the daemon out of job 41's device limits into job 42's
    (whose end would then kill it): refused, exit 2, it stays where it was."""
    from gpuslurm.isolate.cgroup_v1 import setup_v1, v1_job_dir
    from gpuslurm.isolate.cgroup_v2 import setup_mps_v2
    from gpuslurm.isolate.cgroupfs import cgroup_version, remove_cgroup

    other = "42.pbshost"
    root = UNIFIED
    if layout == "v1":
        root = "/sys/fs/cgroup"
        if cgroup_version(root) != 1:
            pytest.skip("no cgroup v1 devices hierarchy here")
        config = site.parent / "gpuslurm.toml"
        config.write_text(config.read_text().replace(f'cgroup_root = "{UNIFIED}"', f'cgroup_root = "{root}"'))
    mps = setup_mps_v2(root, JOB, ()) if layout == "v2" else setup_v1(root, JOB, None, (), kind="mps")
    daemon = as_nobody(["/bin/sleep", "300"])
    try:
        rc, _, lines = call("execjob_begin", job_id=other)
        assert rc == 0, lines
        (Path(mps) / "cgroup.procs").write_text(str(daemon.pid))  # as the begin starts it: root's move
        before = Path(f"/proc/{daemon.pid}/cgroup").read_text()
        assert f"/mps_{JOB}" in before, before
        rc, _, lines = call("execjob_attach", job_id=other, pid=daemon.pid)
        assert rc == 2 and f"is in job {JOB}'s cgroup" in lines[-1], lines
        assert Path(f"/proc/{daemon.pid}/cgroup").read_text() == before
        rc, _, lines = call("execjob_end", job_id=other)
        assert rc == 0, lines
        assert daemon.poll() is None  # job 42's end left job 41's daemon alone
    finally:
        call("execjob_end", job_id=other)
        if daemon.poll() is None:
            daemon.kill()
        daemon.wait()
        assert remove_cgroup(mps)
        if layout == "v1":
            assert not Path(v1_job_dir(root, other)).exists()
