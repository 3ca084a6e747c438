"""The per-job MPS daemon for real: started as ``nobody`` by root, stopped, rolled back.

The daemon is the stand-in ``tests/helpers/fakes/nvidia-cuda-mps-control`` (a real background process
that listens on the pipe directory and records every call with its uid and gid). Root only.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import stat
import subprocess
import tempfile
import time
from pathlib import Path

import pytest
from tests.helpers.mps_helpers import JOB, NOBODY, NOGROUP, Mps, hook_site, job_env, live, quiet
from tests.helpers.mps_helpers import live_with_pipe_under as processes_with

import gpuslurm
from gpuslurm.errors import CommandError, InputError
from gpuslurm.isolate.mps import MpsRequest, start_mps
from gpuslurm.slurm.hooks import run_epilog, run_prolog

FAKE = Path(__file__).resolve().parents[1] / "helpers" / "fakes" / "nvidia-cuda-mps-control"
SRC = str(Path(gpuslurm.__file__).resolve().parents[1])
SYSTEM_PYTHON = "/usr/bin/python3"  # readable by nobody, unlike pyenv's under /root

pytestmark = pytest.mark.skipif(os.geteuid() != 0 or not os.access(SYSTEM_PYTHON, os.X_OK),
                                reason="runs the daemon as nobody: needs root and /usr/bin/python3")


def mode_owner(path: str | Path) -> tuple[int, int, int]:
    st = os.lstat(path)
    return stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid


def test_start_runs_the_daemon_as_the_user_in_private_directories(mps: Mps) -> None:
    daemon = mps.start(pinned=2048)
    job = Path(mps.run_dir) / "mps" / "42"
    assert mode_owner(Path(mps.run_dir) / "mps") == (0o755, 0, 0)
    assert mode_owner(job) == (0o755, 0, 0)
    assert mode_owner(job / "pipe") == (0o700, NOBODY, NOGROUP)
    assert mode_owner(job / "log") == (0o700, NOBODY, NOGROUP)
    assert mode_owner(job / "mps.json") == (0o600, 0, 0)
    assert daemon.pipe_dir == str(job / "pipe") and daemon.log_dir == str(job / "log")
    assert daemon.pid is not None and live(daemon.pid)
    assert Path(f"/proc/{daemon.pid}/status").read_text().count(f"\t{NOBODY}\t") >= 2  # Uid:, Gid:

    start, = mps.records("start")
    assert start["argv"] == ["-d"]
    assert (start["uid"], start["euid"], start["gid"], start["egid"]) == (NOBODY, NOBODY, NOGROUP, NOGROUP)
    assert start["groups"] == [] and start["cwd"] == "/"
    assert start["env"] == {"CUDA_MPS_PIPE_DIRECTORY": daemon.pipe_dir,
                            "CUDA_MPS_LOG_DIRECTORY": daemon.log_dir,
                            "CUDA_VISIBLE_DEVICES": "GPU-a,GPU-b",
                            "PATH": f"{mps.root}:/usr/sbin:/usr/bin:/sbin:/bin"}
    assert mps.records("daemon")[0]["pid"] == daemon.pid
    assert [c["stdin"] for c in mps.records("client")] == [
        ["set_default_active_thread_percentage 50"], ["set_default_device_pinned_mem_limit 0 2048M"],
        ["set_default_device_pinned_mem_limit 1 2048M"]]
    assert all(c["uid"] == NOBODY and c["gid"] == NOGROUP for c in mps.records("client"))
    assert [c["command"] for c in mps.records("command")] == [
        "set_default_active_thread_percentage 50", "set_default_device_pinned_mem_limit 0 2048M",
        "set_default_device_pinned_mem_limit 1 2048M"]
    # the daemon could write its log: the log directory is really the user's
    assert "Cmd:set_default_active_thread_percentage 50" in (job / "log" / "control.log").read_text()

    state = json.loads((job / "mps.json").read_text())
    assert (state["uid"], state["gid"], state["pid"]) == (NOBODY, NOGROUP, daemon.pid)
    assert state["trigger"] == "comment"

    done = mps.stop()
    assert done is not None
    assert (done.quit_error, done.killed, done.stuck, done.errors) == (None, (), (), ())
    assert done.daemon == daemon
    assert not live(daemon.pid)
    assert not job.exists()
    quit_call = mps.records("client")[-1]
    assert quit_call["stdin"] == ["quit"] and quit_call["uid"] == NOBODY
    assert quit_call["env"]["CUDA_MPS_PIPE_DIRECTORY"] == daemon.pipe_dir


def test_default_settings_send_no_control_commands(mps: Mps) -> None:
    mps.start(pct=100)
    assert mps.records("client") == []
    assert processes_with(mps.run_dir)


def test_stop_without_a_daemon_is_nothing_to_do(mps: Mps) -> None:
    assert mps.stop() is None  # no run_dir at all
    mps.start(job="1")
    assert mps.stop(job="2") is None
    assert processes_with(mps.run_dir)  # job 1's daemon untouched


def test_a_daemon_that_ignores_quit_is_terminated_then_killed(mps: Mps) -> None:
    stubborn = mps.control("stubborn", GPUSLURM_FAKE_MPS_IGNORE_QUIT="1")
    daemon = mps.start(control=stubborn)
    t0 = time.monotonic()
    done = mps.stop(control=stubborn, grace=0.5)
    assert done is not None
    assert done.quit_error is None and done.killed == (daemon.pid,) and done.stuck == ()
    assert time.monotonic() - t0 >= 0.5  # it was given the grace period to quit
    assert not live(daemon.pid)
    assert not Path(daemon.pipe_dir).exists()


def test_a_dead_daemon_fails_quit_and_the_directories_still_go(mps: Mps) -> None:
    daemon = mps.start()
    os.kill(daemon.pid, signal.SIGKILL)
    done = mps.stop()
    assert done is not None
    assert done.quit_error is not None and "exited 1" in done.quit_error
    assert done.killed == () and done.stuck == ()
    assert not Path(daemon.pipe_dir).parent.exists()


def test_start_failure_leaves_nothing_behind(mps: Mps) -> None:
    with pytest.raises(CommandError, match="exited 1"):
        mps.start(control=mps.control("failing", GPUSLURM_FAKE_MPS_FAIL_START="1"))
    assert os.listdir(Path(mps.run_dir) / "mps") == []
    assert processes_with(mps.run_dir) == []


def test_a_control_command_that_fails_stops_the_started_daemon(mps: Mps) -> None:
    broken = mps.root / "broken-control"
    broken.write_text(f'#!/bin/sh\n[ "$1" = -d ] && GPUSLURM_FAKE_MPS_LOG={mps.calls} exec {FAKE} -d\n'
                      'echo "Invalid command" >&2; exit 1\n')
    broken.chmod(0o755)
    with pytest.raises(CommandError, match="set_default_active_thread_percentage 50"):
        mps.start(control=str(broken), timeout=0.5)
    daemon_pid = mps.records("daemon")[0]["pid"]
    assert not live(daemon_pid)
    assert os.listdir(Path(mps.run_dir) / "mps") == []


def test_a_stale_directory_of_the_same_job_is_replaced(mps: Mps) -> None:
    old = mps.start()
    new = mps.start()  # e.g. a requeued job whose epilog never ran here
    assert not live(old.pid) and live(new.pid)
    assert processes_with(mps.run_dir) == [new.pid]


def test_unsafe_base_directories_are_refused(mps: Mps) -> None:
    elsewhere = mps.root / "elsewhere"
    elsewhere.mkdir()
    run = Path(mps.run_dir)
    run.mkdir()
    (run / "mps").symlink_to(elsewhere)
    with pytest.raises(InputError, match="symlink"):
        mps.start()
    assert os.listdir(elsewhere) == []
    (run / "mps").unlink()
    (run / "mps").mkdir()
    os.chown(run / "mps", NOBODY, NOGROUP)  # a user-owned base could be swapped under us
    with pytest.raises(InputError, match="owned by uid 65534"):
        mps.start()
    os.chown(run / "mps", 0, 0)
    (run / "mps").chmod(0o777)
    with pytest.raises(InputError, match="writable by group or others"):
        mps.stop()
    assert mps.records() == []


def test_stop_removes_what_the_user_planted_without_following_it(mps: Mps) -> None:
    daemon = mps.start()
    precious = mps.root / "precious"
    precious.mkdir()
    (precious / "keep").write_text("x")
    # as the user would: a symlink and a directory inside its own pipe directory
    os.symlink(precious, Path(daemon.pipe_dir) / "link")
    subdir = Path(daemon.log_dir) / "sub"
    subdir.mkdir()
    os.chown(subdir, NOBODY, NOGROUP)
    done = mps.stop()
    assert done is not None and done.errors == ()
    assert (precious / "keep").read_text() == "x"
    assert not Path(daemon.pipe_dir).parent.exists()


# --- through the hooks ------------------------------------------------------------------------


def task_prolog_as_nobody(env: dict[str, str]) -> str:
    code = ("import os, sys; from gpuslurm.slurm.hooks import run_task_prolog; "
            "sys.exit(run_task_prolog(dict(os.environ), sys.stdout))")
    result = subprocess.run([SYSTEM_PYTHON, "-c", code], env={**env, "PYTHONPATH": SRC}, user=NOBODY,
                            group=NOGROUP, extra_groups=[], capture_output=True, text=True, timeout=30,
                            cwd="/", check=True)
    return result.stdout


def test_prolog_starts_mps_for_a_comment_job_and_the_epilog_stops_it(mps: Mps) -> None:
    site = hook_site(mps)
    env = job_env(site, SLURM_JOB_COMMENT="please gpuslurm:mps")
    log = quiet("prolog")
    assert run_prolog(env, log) == 0, log.lines
    pipe = Path(mps.run_dir) / "mps" / JOB / "pipe"
    [pid] = processes_with(mps.run_dir)
    start, = mps.records("start")
    assert start["uid"] == NOBODY
    assert start["env"]["CUDA_VISIBLE_DEVICES"] == f"{site.uuids[2]},{site.uuids[3]}"
    assert start["env"]["CUDA_MPS_PIPE_DIRECTORY"] == str(pipe)
    assert mps.records("command")[0]["command"] == "set_default_active_thread_percentage 40"
    assert (Path(mps.run_dir) / "jobs" / f"{JOB}.json").exists()
    assert any("MPS (comment) daemon pid" in line for line in log.lines)

    out = task_prolog_as_nobody(env)
    assert f"export CUDA_MPS_PIPE_DIRECTORY={pipe}\n" in out
    assert f"export CUDA_MPS_LOG_DIRECTORY={pipe.parent / 'log'}\n" in out

    log = quiet("epilog")
    assert run_epilog(env, log) == 0, log.lines
    assert not live(pid) and not pipe.parent.exists()
    assert mps.records("client")[-1]["stdin"] == ["quit"]
    assert any("stopped the job's MPS daemon" in line for line in log.lines)
    assert not site.scontrol_log.exists()


def test_gres_mps_job_gets_slurms_share(mps: Mps) -> None:
    site = hook_site(mps)
    assert run_prolog(job_env(site, CUDA_MPS_ACTIVE_THREAD_PERCENTAGE="25", CUDA_VISIBLE_DEVICES="0"),
                      quiet("prolog")) == 0
    assert mps.records("command")[0]["command"] == "set_default_active_thread_percentage 25"


def test_a_job_that_did_not_ask_gets_no_daemon_and_no_exports(mps: Mps) -> None:
    site = hook_site(mps)
    env = job_env(site, SLURM_JOB_COMMENT="gpuslurm:mpsx")
    assert run_prolog(env, quiet("prolog")) == 0
    assert mps.records() == [] and processes_with(mps.run_dir) == []
    assert "CUDA_MPS" not in task_prolog_as_nobody(env)
    assert run_epilog(env, quiet("epilog")) == 0


def test_prolog_failing_after_mps_started_stops_it_again(mps: Mps) -> None:
    site = hook_site(mps)
    # the map cannot be written: its directory is a symlink (the prolog refuses, fails closed)
    (mps.root / "run").mkdir(mode=0o755)
    (mps.root / "run" / "jobs").symlink_to(mps.root)
    log = quiet("prolog")
    rc = run_prolog(job_env(site, SLURM_JOB_COMMENT="gpuslurm:mps"), log)
    assert rc == 2, log.lines
    assert mps.records("daemon"), "MPS must have started before the map write failed"
    assert processes_with(mps.run_dir) == []
    assert os.listdir(Path(mps.run_dir) / "mps") == []
    assert mps.records("client")[-1]["stdin"] == ["quit"]
    assert any("stopped it again" in line for line in log.lines)


def test_a_daemon_the_user_cannot_start_fails_the_job_not_the_node(mps: Mps) -> None:
    # the daemon runs as the user (their process limit, their environment): the prolog holds the
    # job with a reason and exits 0, since any other exit drains the node in Slurm 22.05
    site = hook_site(mps, control=mps.control("failing", GPUSLURM_FAKE_MPS_FAIL_START="1"))
    log = quiet("prolog")
    assert run_prolog(job_env(site, SLURM_JOB_COMMENT="gpuslurm:mps"), log) == 0, log.lines
    assert not (Path(mps.run_dir) / "jobs" / f"{JOB}.json").exists()
    assert os.listdir(Path(mps.run_dir) / "mps") == []
    calls = site.scontrol_log.read_text().splitlines()
    assert calls[-1] == f"requeuehold {JOB}", calls
    assert calls[-2].startswith(f"update JobId={JOB} Comment=gpuslurm refused this job: the job's MPS daemon")
    assert not any("NodeName=" in c for c in calls)


@pytest.mark.parametrize("comment", ["gpuslurm:mps=0", "gpuslurm:mps=101", "x,gpuslurm:mps=lots",
                                     "gpuslurm:mps=nan", "gpuslurm:mps="])
def test_a_malformed_mps_request_fails_the_job_not_the_node(mps: Mps, comment: str) -> None:
    site = hook_site(mps)
    log = quiet("prolog")
    assert run_prolog(job_env(site, SLURM_JOB_COMMENT=comment), log) == 0, log.lines
    assert mps.records("start") == []
    assert not (Path(mps.run_dir) / "jobs" / f"{JOB}.json").exists()
    calls = site.scontrol_log.read_text().splitlines()
    assert calls[-1] == f"requeuehold {JOB}", calls
    assert "bad MPS request" in calls[-2] and "the job's comment" in calls[-2]


def test_the_jobs_own_share_is_its_active_thread_percentage(mps: Mps) -> None:
    site = hook_site(mps)
    log = quiet("prolog")
    assert run_prolog(job_env(site, SLURM_JOB_COMMENT="train gpuslurm:mps=25"), log) == 0, log.lines
    assert next(r["command"] for r in mps.records("command")) == "set_default_active_thread_percentage 25"


def test_a_missing_mps_control_program_is_the_admins_and_fails_closed(mps: Mps) -> None:
    site = hook_site(mps, control=str(Path(mps.root) / "no-such-control"))
    log = quiet("prolog")
    assert run_prolog(job_env(site, SLURM_JOB_COMMENT="gpuslurm:mps"), log) == 2, log.lines


def test_the_daemon_gets_the_users_supplementary_groups(mps: Mps) -> None:
    # A site may give /dev/nvidia* to a group (NVreg_DeviceFileGID): the MPS server must have it.
    tag = os.getpid() % 100000
    group, user = f"gsgpu{tag}", f"gsmps{tag}"
    subprocess.run(["/usr/sbin/groupadd", group], check=True, timeout=30)
    try:
        subprocess.run(["/usr/sbin/useradd", "--no-create-home", "--shell", "/usr/sbin/nologin",
                        "--user-group", "--groups", group, user], check=True, timeout=30)
        try:
            import grp
            import pwd

            pw, extra = pwd.getpwnam(user), grp.getgrnam(group).gr_gid
            start_mps("43", pw.pw_uid, pw.pw_gid, ("GPU-a",), MpsRequest("comment", 100),
                      run_dir=mps.run_dir, mps_control=mps.control(), timeout=5.0)
            start, = mps.records("start")
            assert (start["uid"], start["gid"]) == (pw.pw_uid, pw.pw_gid)
            assert start["groups"] == [extra]
            mps.stop("43")
        finally:
            subprocess.run(["/usr/sbin/userdel", user], check=False, timeout=30)
    finally:
        subprocess.run(["/usr/sbin/groupdel", group], check=False, timeout=30)


# --- attacks (issue 9): impossible ids, and processes that only carry the job's pipe directory --

@pytest.mark.parametrize("uid, gid", [(4294967295, NOGROUP), (NOBODY, 4294967295), (2**32, NOGROUP),
                                      (NOBODY, 2**40), (-1, NOGROUP)])
def test_impossible_ids_are_refused_before_anything_starts(mps: Mps, uid: int, gid: int) -> None:
    # (uid_t)-1 is "leave unchanged" to setreuid: the daemon would have run as root.
    with pytest.raises(InputError, match="impossible id"):
        start_mps("44", uid, gid, ("GPU-a",), MpsRequest("comment", 100), run_dir=mps.run_dir,
                  mps_control=mps.control(), timeout=5.0)
    assert mps.records() == []
    assert not (Path(mps.run_dir) / "mps" / "44").exists()


def test_job_gid_refuses_impossible_ids_from_the_environment() -> None:
    from gpuslurm.isolate.mps_request import job_gid
    from gpuslurm.slurm.hookenv import hook_job

    base = {"SLURM_JOB_ID": "9", "SLURM_JOB_UID": str(NOBODY), "SLURM_JOB_USER": "nobody"}
    for gid in ("4294967295", "9" * 30, "-1"):
        with pytest.raises(InputError, match="SLURM_JOB_GID"):
            hook_job({**base, "SLURM_JOB_GID": gid})
    for bad_gid, uid in ((4294967295, NOBODY), (2**40, NOBODY), (100, 4294967295)):
        with pytest.raises(InputError):
            job_gid(bad_gid, uid)


def test_the_runner_refuses_minus_one_and_verifies_the_drop() -> None:
    from gpuslurm.runner import _dropped_check, run_command

    with pytest.raises(CommandError, match="impossible uid"):
        run_command(["/usr/bin/id", "-u"], user=4294967295)
    with pytest.raises(CommandError, match="impossible gid"):
        run_command(["/usr/bin/id", "-u"], user=NOBODY, group=4294967295)
    assert run_command(["/usr/bin/id", "-u"], user=NOBODY).stdout.strip() == str(NOBODY)
    with pytest.raises(PermissionError):  # we are root: not what a dropped child must be
        _dropped_check(NOBODY, NOGROUP, ())()


def _bystander(pipe_dir: str, user: int | None) -> subprocess.Popen[bytes]:
    """A process of ``user`` (root when None) that carries another job's pipe directory."""
    return subprocess.Popen(["/bin/sleep", "60"], env={"CUDA_MPS_PIPE_DIRECTORY": pipe_dir},
                            user=user, group=user, extra_groups=[] if user is not None else None)


@pytest.mark.parametrize("who", [None, 1])  # root, and the system user "daemon" (uid 1)
def test_a_process_of_root_or_another_user_with_the_pipe_directory_survives_stop(mps: Mps,
                                                                                who: int | None) -> None:
    stubborn = mps.control("stubborn", GPUSLURM_FAKE_MPS_IGNORE_QUIT="1")
    daemon = mps.start(control=stubborn)
    (Path(daemon.pipe_dir).parent / "mps.json").unlink()  # the epilog then knows no uid from it
    victim = _bystander(daemon.pipe_dir, who)
    try:
        time.sleep(0.1)
        done = mps.stop(control=stubborn, grace=0.3)
        assert victim.poll() is None, "another user's process was killed by this job's MPS stop"
        assert victim.pid not in done.killed
        assert daemon.pid in done.killed and not live(daemon.pid)  # the job's own daemon still goes
    finally:
        victim.kill()
        victim.wait()


def test_a_root_process_with_the_pipe_directory_survives_a_stale_restart(mps: Mps) -> None:
    daemon = mps.start()
    victim = _bystander(daemon.pipe_dir, None)
    try:
        time.sleep(0.1)
        mps.start()  # the same job id again: the stale one is cleared
        assert victim.poll() is None, "a root process was killed as a stale MPS daemon"
    finally:
        victim.kill()
        victim.wait()
        mps.stop()


def test_the_daemon_starts_inside_the_jobs_devices_cgroup(mps: Mps) -> None:
    # Outside the job's device limits the user could ptrace their own daemon and open any GPU.
    from tests.helpers.cgroup_helpers import PROBE, as_nobody, make_gpu_files, parse_probe

    from gpuslurm.isolate.cgroup_v1 import remove_v1, setup_v1
    from gpuslurm.isolate.cgroupfs import cgroup_version
    from gpuslurm.isolate.denylist import Device

    if cgroup_version("/sys/fs/cgroup") != 1:
        pytest.skip("no cgroup v1 devices hierarchy here")
    job = str(910_000_000 + os.getpid() % 1_000_000)
    path = setup_v1("/sys/fs/cgroup", job, NOBODY, [Device(195, 1)])
    gpus = make_gpu_files([0, 1])
    gpu_dir = next(gpus)
    try:
        daemon = start_mps("45", NOBODY, NOGROUP, ("GPU-a",), MpsRequest("comment", 100),
                           run_dir=mps.run_dir, mps_control=mps.control(), timeout=5.0,
                           cgroup_procs=f"{path}/cgroup.procs")
        assert daemon.pid is not None
        lines = Path(f"/proc/{daemon.pid}/cgroup").read_text().splitlines()
        devices = next(line.split(":", 2)[2] for line in lines if line.split(":")[1] == "devices")
        assert devices == f"/gpuslurm/job_{job}", lines
        # The user, in the daemon's cgroup, cannot open the GPU the job was not given.
        script = (f"echo $$ > /sys/fs/cgroup/devices{devices}/cgroup.procs && "
                  f"exec {SYSTEM_PYTHON} -c \"$0\" \"$@\"")
        probe = as_nobody(["/bin/sh", "-c", script, PROBE, str(gpu_dir / "nvidia0"),
                           str(gpu_dir / "nvidia1")])
        out, err = probe.communicate(timeout=30)
        assert probe.returncode == 0, err
        assert parse_probe(out) == {"nvidia0": "ENXIO", "nvidia1": "EPERM"}
        mps.stop("45")
    finally:
        gpus.close()
        assert remove_v1("/sys/fs/cgroup", job)


# nobody's own script: a directory tree in their pipe directory deeper than any recursion or
# descriptor limit (a job can make one there while it runs: the directory is theirs)
DEEP_TREE = """
import os, sys
os.chdir(sys.argv[1])
for _ in range(int(sys.argv[2])):
    os.mkdir("d")
    os.chdir("d")
    open("f", "w").close()
    os.symlink("/etc/shadow", "s")
"""


def _grow_tree(pipe_dir: str, depth: int = 3000) -> None:
    subprocess.run([SYSTEM_PYTHON, "-c", DEEP_TREE, pipe_dir, str(depth)], user=NOBODY, group=NOGROUP,
                   extra_groups=[], check=True, timeout=120, cwd="/")


def test_a_deep_tree_the_user_makes_never_breaks_stop_or_a_restart(mps: Mps) -> None:
    """Python's rmtree recursed into the user's tree: the epilog's stop ended in RecursionError and
    left the directory, and the next start of the same job id (the user requeues their own job)
    raised it out of the prolog, exit 70, which drains the node."""
    daemon = mps.start(job="43")
    _grow_tree(daemon.pipe_dir)
    done = mps.stop(job="43")  # the epilog
    assert done is not None and not done.errors, done
    assert not os.path.exists(os.path.join(mps.run_dir, "mps", "43"))
    assert os.path.exists("/etc/shadow")

    daemon = mps.start(job="44")
    _grow_tree(daemon.pipe_dir)
    # the epilog never ran (or failed): the same job id starts again over the stale directory
    again = mps.start(job="44")
    assert again.pid is not None and again.pid != daemon.pid and not live(daemon.pid)
    assert os.listdir(again.pipe_dir) != ["d"]
    done = mps.stop(job="44")
    assert done is not None and not done.errors, done


def test_the_prolog_over_a_users_stale_tree_never_fails_the_node(mps: Mps) -> None:
    """The same through the hooks: the epilog exits 0 and removes the tree; a start over a stale
    tree of the same job id exits 0 with the job's daemon started, not exit 70."""
    site = hook_site(mps)
    env = job_env(site, SLURM_JOB_COMMENT="gpuslurm:mps")
    assert run_prolog(env, quiet("prolog")) == 0
    _grow_tree(str(Path(mps.run_dir) / "mps" / JOB / "pipe"))
    log = quiet("prolog")
    assert run_prolog(env, log) == 0, log.lines  # requeued: the same job id, the epilog never ran
    assert not any("internal error" in line for line in log.lines), log.lines
    assert any("MPS (comment) daemon pid" in line for line in log.lines), log.lines
    _grow_tree(str(Path(mps.run_dir) / "mps" / JOB / "pipe"))
    log = quiet("epilog")
    assert run_epilog(env, log) == 0, log.lines
    assert not any("cannot" in line for line in log.lines), log.lines
    assert os.listdir(Path(mps.run_dir) / "mps") == [] and not site.scontrol_log.exists()


def test_a_tree_that_will_not_go_is_set_aside_and_the_job_starts(mps: Mps,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """A tree the user's other processes keep growing outlasts any bound: the start sets it aside
    (for the admin) instead of failing; the epilog reports it and exits 0."""
    import gpuslurm.isolate.mps_dirs as mps_dirs

    daemon = mps.start(job="45")
    _grow_tree(daemon.pipe_dir, depth=50)
    monkeypatch.setattr(mps_dirs, "MAX_REMOVE_STEPS", 20)
    again = mps.start(job="45")
    assert again.pid is not None and not live(daemon.pid)
    assert len([n for n in os.listdir(os.path.join(mps.run_dir, "mps")) if n.startswith(".stale-45-")]) == 1
    _grow_tree(again.pipe_dir, depth=50)
    done = mps.stop(job="45")
    assert done is not None and done.errors and "cannot remove" in done.errors[0]
    assert not live(again.pid)


NS_LAST_PID = "/proc/sys/kernel/ns_last_pid"


def _spawn_with_pid(pid: int, tries: int = 50) -> subprocess.Popen[bytes] | None:
    """A root ``sleep`` given exactly ``pid`` (ns_last_pid = pid - 1 before the fork), or None when
    another process on the machine took it first every time."""
    for _ in range(tries):
        with open(NS_LAST_PID, "w") as fh:
            fh.write(str(pid - 1))
        proc = subprocess.Popen(["/bin/sleep", "60"])
        if proc.pid == pid:
            return proc
        proc.kill()
        proc.wait()
    return None


@pytest.mark.skipif(not os.access(NS_LAST_PID, os.W_OK), reason="needs a writable ns_last_pid")
def test_a_pid_reused_between_scan_and_signal_is_not_killed() -> None:
    """As MPS stop does: scan /proc for the job's daemon processes, then signal them. The found
    process exits and root's next process gets its PID in between (forced here with
    ns_last_pid). The signal must go to the process the scan found, identified by the start
    time read *at scan time*, not by one read again at signal time (which would be the new
    process's own and match it)."""
    from gpuslurm.isolate import mps as mps_mod

    pipe = tempfile.mkdtemp(prefix="gpuslurm-reuse-")
    found = subprocess.Popen(["/bin/sleep", "60"], env={"CUDA_MPS_PIPE_DIRECTORY": pipe})
    newcomer = None
    try:
        time.sleep(0.1)
        targets = mps_mod._daemon_processes(0, pipe)  # what stop found, as stop keeps it
        assert [getattr(t, "pid", t) for t in targets] == [found.pid]
        found.kill()
        found.wait()
        newcomer = _spawn_with_pid(found.pid)
        if newcomer is None:
            pytest.skip("the machine's other processes kept taking the PID")
        time.sleep(0.05)  # a later start time than the scanned process, whatever the clock tick
        mps_mod._kill_now(targets, 0)
        assert newcomer.poll() is None, "a process that reused the scanned PID was killed"
    finally:
        if newcomer is not None:
            newcomer.kill()
            newcomer.wait()
        os.rmdir(pipe)


@pytest.mark.parametrize("scheduler", ["slurm", "pbs"])
def test_the_daemon_starts_inside_the_schedulers_root_owned_job_cgroup(mps: Mps, scheduler: str) -> None:
    """The scheduler's own limits: Slurm's cgroup/v1 job cgroup (ConstrainDevices=yes,
    PrologFlags=Contain), PBS's cgroups hook's (``pbs_jobs.service/jobid/<id>``) are root's, so
    the daemon's process joins it as root before dropping to the user. Found through the
    scheduler's adapter, made here as the scheduler makes it."""
    from tests.helpers.cgroup_helpers import PROBE, make_gpu_files, parse_probe

    from gpuslurm.isolate.cgroup_v1 import scheduler_devices_procs
    from gpuslurm.isolate.cgroupfs import cgroup_version
    from gpuslurm.pbs.scheduler import PbsScheduler
    from gpuslurm.runner import run_command
    from gpuslurm.slurm.adapter import SlurmScheduler
    from gpuslurm.state.job import HookJob

    if cgroup_version("/sys/fs/cgroup") != 1:
        pytest.skip("no cgroup v1 devices hierarchy here")
    node = f"fix9test{os.getpid()}"
    job = str(920_000_000 + os.getpid() % 1_000_000)
    if scheduler == "pbs":
        job += f".{node}"
        top = Path("/sys/fs/cgroup/devices") / "pbs_jobs.service"
        chain = [top, top / "jobid", top / "jobid" / job]
    else:
        top = Path("/sys/fs/cgroup/devices") / f"slurm_{node}"
        chain = [top, top / f"uid_{NOBODY}", top / f"uid_{NOBODY}" / f"job_{job}"]
    made = []
    for d in chain:
        if not d.is_dir():
            d.mkdir()
            made.append(d)
    (chain[-1] / "devices.deny").write_text("c 195:1 rwm")  # the job was given GPU 0 only
    if scheduler == "slurm":
        (chain[-1] / "step_extern").mkdir()
        chain.append(chain[-1] / "step_extern")
        made.append(chain[-1])
    gpus = make_gpu_files([0, 1])
    gpu_dir = next(gpus)
    try:
        adapter = PbsScheduler() if scheduler == "pbs" else SlurmScheduler()
        dirs = adapter.devices_cgroup_v1_dirs(HookJob(scheduler, job, NOBODY, "nobody", node))
        procs = scheduler_devices_procs("/sys/fs/cgroup", dirs)
        assert procs == str(chain[-1] / "cgroup.procs")
        daemon = start_mps("46", NOBODY, NOGROUP, ("GPU-a",), MpsRequest("comment", 100),
                           run_dir=mps.run_dir, mps_control=mps.control(), timeout=5.0, cgroup_procs=procs)
        assert daemon.pid is not None
        lines = Path(f"/proc/{daemon.pid}/cgroup").read_text().splitlines()
        devices = next(line.split(":", 2)[2] for line in lines if line.split(":")[1] == "devices")
        assert devices == "/" + str(chain[-1].relative_to("/sys/fs/cgroup/devices")), lines
        out = run_command([SYSTEM_PYTHON, "-c", PROBE, str(gpu_dir / "nvidia0"), str(gpu_dir / "nvidia1")],
                          user=NOBODY, group=NOGROUP, cgroup_procs=procs, timeout=30).stdout
        assert parse_probe(out) == {"nvidia0": "ENXIO", "nvidia1": "EPERM"}
        mps.stop("46")
    finally:
        gpus.close()
        for d in reversed(made):
            for _ in range(50):  # the last processes may still be leaving
                try:
                    d.rmdir()
                    break
                except OSError:
                    time.sleep(0.1)


def test_a_cgroup_not_roots_is_not_taken_for_the_schedulers() -> None:
    """A directory chain someone else owns (or that is missing) gives no cgroup to join."""
    from gpuslurm.isolate.cgroup_v1 import scheduler_devices_procs

    root = Path(tempfile.mkdtemp())
    try:
        (root / "devices" / "slurm" / "uid_5" / "job_7" / "step_extern").mkdir(parents=True)
        (root / "devices" / "slurm" / "uid_5" / "job_7" / "step_extern" / "cgroup.procs").touch()
        rel = "slurm/uid_5/job_7/step_extern"
        assert scheduler_devices_procs(str(root), [rel]) == str(root / "devices" / rel / "cgroup.procs")
        os.chown(root / "devices" / "slurm" / "uid_5", NOBODY, NOGROUP)
        assert scheduler_devices_procs(str(root), [rel]) is None
        assert scheduler_devices_procs(str(root), ["slurm/uid_5/job_8/step_extern"]) is None
    finally:
        shutil.rmtree(root)


def test_where_slurm_constrains_devices_the_prolog_confines_the_daemon_alone(mps: Mps) -> None:
    """`[cgroup] devices = "auto"` and Slurm's cgroup.conf says ConstrainDevices=yes: gpuslurm
    leaves the tasks to Slurm, but Slurm 22.05 has no job cgroup while the prolog runs. The
    daemon starts in ``gpuslurm/mps_<id>`` (the job's GPUs 2 and 3 only; root alone may join),
    which the task prolog never joins and the epilog removes."""
    from gpuslurm.isolate.cgroupfs import cgroup_version

    if cgroup_version("/sys/fs/cgroup") != 1:
        pytest.skip("no cgroup v1 devices hierarchy here")
    site = hook_site(mps)
    slurm_cgroup = mps.root / "cgroup.conf"
    slurm_cgroup.write_text("CgroupPlugin=cgroup/v1\nConstrainDevices=yes\n")
    config = Path(site.env["GPUSLURM_CONFIG"])
    text = config.read_text().replace('devices = "never"', 'devices = "auto"')
    config.write_text(text.replace("[paths]\n", f'[paths]\nslurm_cgroup_conf = "{slurm_cgroup}"\n'))
    env = job_env(site, SLURM_JOB_COMMENT="gpuslurm:mps")
    cgroup = Path("/sys/fs/cgroup/devices/gpuslurm") / f"mps_{JOB}"
    log = quiet("prolog")
    try:
        assert run_prolog(env, log) == 0, log.lines
        [pid] = processes_with(mps.run_dir)
        lines = Path(f"/proc/{pid}/cgroup").read_text().splitlines()
        assert f"devices:/gpuslurm/mps_{JOB}" in [line.split(":", 1)[1] for line in lines], lines
        assert (cgroup / "cgroup.procs").stat().st_uid == 0  # not the user's to join
        from tests.helpers.cgroup_helpers import probe_as_nobody_in

        # as the user, in the daemon's cgroup: the job's GPUs 2 and 3 (dgx-h100: minor = index)
        assert probe_as_nobody_in(str(cgroup / "cgroup.procs")) == {
            f"nvidia{m}": "ENXIO" if m in (2, 3) else "EPERM" for m in range(8)}
        out = task_prolog_as_nobody(env)
        assert "CUDA_MPS_PIPE_DIRECTORY" in out  # the task prolog did not move the task there
        log = quiet("epilog")
        assert run_epilog(env, log) == 0, log.lines
        assert not live(pid) and not cgroup.exists()
    finally:
        if cgroup.exists():
            from gpuslurm.isolate.cgroup_v1 import remove_v1

            remove_v1("/sys/fs/cgroup", JOB, kind="mps")
