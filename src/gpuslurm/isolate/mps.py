"""Per-job CUDA MPS: whether a job asked for it, and its own control daemon's start and stop.

What asks for MPS (``[mps] triggers``), as Slurm 22.05 shows it to the prolog (observed in the
test cluster; none of it needs an extra command):

* ``gres``: a job with ``--gres=mps:N``. Slurm puts ``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`` (the
  job's share of the GPU, N out of the GPU's mps count, in percent) into the prolog's
  environment, beside ``SLURM_JOB_GPUS``/``CUDA_VISIBLE_DEVICES`` for the GPU. There is no
  ``SLURM_JOB_GRES``. That share becomes the daemon's active thread percentage.
* ``comment``: ``SLURM_JOB_COMMENT`` (the job's ``--comment``) contains ``comment_token`` as a
  word (words are separated by blanks, commas and semicolons).
* ``feature``: ``SLURM_JOB_CONSTRAINTS`` (the job's ``--constraint``, verbatim, e.g. ``mps&ib``)
  names ``feature``; a name after ``!`` does not count.

Layout: ``<run_dir>/mps/`` (root, 0755) holds ``<jobid>/`` (root, 0755) with ``pipe/`` and
``log/`` (the job's user, 0700) and ``mps.json`` (root, 0600: what ``stop_mps`` needs). The
daemon runs as the job's user and group (and the user's supplementary groups), with only
``CUDA_MPS_PIPE_DIRECTORY``, ``CUDA_MPS_LOG_DIRECTORY``, ``CUDA_VISIBLE_DEVICES`` (the job's GPU
UUIDs) and ``PATH`` in its environment. Its processes are found by their real uid and the pipe
directory in their initial environment (and as children of the recorded daemon), never through a
pid file the user can write.
"""

from __future__ import annotations

import json
import os
import stat
import time
from collections.abc import Mapping, Sequence

from gpuslurm.errors import CommandError, HardwareError, InputError
from gpuslurm.isolate import mps_dirs
from gpuslurm.isolate.kill import Target, send_signal
from gpuslurm.isolate.mps_request import LOG_VAR, PIPE_VAR, MpsDirs, MpsRequest, check_id, job_dirs
from gpuslurm.safedir import DIR_FLAGS
from gpuslurm.tuples import TYPE_CHECKING, NamedTuple

if TYPE_CHECKING:
    from typing import Any

PID_FILE = "nvidia-cuda-mps-control.pid"  # the real daemon writes it into the pipe directory
STATE_FILE = "mps.json"
STATE_VERSION = 1
KILL_WAIT_S = 2.0  # after SIGKILL: a process still there is stuck in the kernel (the driver)
_POLL_S = 0.02


class MpsDaemon(NamedTuple):
    """What the prolog started, recorded in ``mps.json`` for the epilog."""

    job_id: str
    uid: int
    gid: int
    pipe_dir: str
    log_dir: str
    uuids: tuple[str, ...]
    trigger: str
    active_thread_percentage: int
    pid: int | None = None  # the control daemon, when it was found
    pid_start: int | None = None  # its start time (clock ticks), so a reused pid is not taken for it


class MpsStop(NamedTuple):
    """What ``stop_mps`` did. ``daemon`` is None when ``mps.json`` was missing or unreadable."""

    job_id: str
    daemon: MpsDaemon | None
    quit_error: str | None  # why ``quit`` failed; None when it was accepted
    killed: tuple[int, ...]  # processes that had to be signalled
    stuck: tuple[int, ...]  # processes still there after SIGKILL
    errors: tuple[str, ...]  # state unreadable, directory not removed, ...


# --- pure -----------------------------------------------------------------------------------


def control_commands(active_thread_percentage: int, pinned_memory_limit_mib: int,
                     n_devices: int) -> list[str]:
    """The control commands that configure a fresh daemon (none when the defaults are wanted).

    The pinned limit is per device, by ordinal among the daemon's ``CUDA_VISIBLE_DEVICES``.
    """
    commands = []
    if active_thread_percentage != 100:
        commands.append(f"set_default_active_thread_percentage {active_thread_percentage}")
    if pinned_memory_limit_mib > 0:
        commands += [f"set_default_device_pinned_mem_limit {i} {pinned_memory_limit_mib}M"
                     for i in range(n_devices)]
    return commands


def daemon_env(pipe_dir: str, log_dir: str, uuids: Sequence[str], mps_control: str) -> dict[str, str]:
    """The whole environment of the daemon and of its control commands."""
    # The control daemon starts nvidia-cuda-mps-server itself; it sits beside it.
    path = ":".join(dict.fromkeys([os.path.dirname(mps_control), "/usr/sbin", "/usr/bin", "/sbin", "/bin"]))
    return {PIPE_VAR: pipe_dir, LOG_VAR: log_dir, "CUDA_VISIBLE_DEVICES": ",".join(uuids),
            "PATH": path}


def stuck_report(done: MpsStop, gpus: Sequence[Mapping[str, Any]]) -> tuple[str, str] | None:
    """For daemon processes that survived SIGKILL: (the job's first physical GPU, a message)."""
    if not done.stuck:
        return None
    physical = [g.get("parent_uuid") or g["uuid"] for g in gpus]
    if not physical and done.daemon is not None:
        physical = list(done.daemon.uuids)
    pids = ", ".join(map(str, done.stuck))
    return (physical[0] if physical else "?",
            f"MPS daemon of job {done.job_id} (pid {pids}) survived SIGKILL")


# --- start ------------------------------------------------------------------------------------


def start_mps(job_id: str, uid: int, gid: int, uuids: Sequence[str], request: MpsRequest, *,
              run_dir: str, mps_control: str, pinned_memory_limit_mib: int = 0,
              timeout: float = 10.0, cgroup_procs: str | None = None) -> MpsDaemon:
    """Create the job's directories, start its control daemon as ``uid``:``gid`` and configure it.

    ``cgroup_procs``: the ``cgroup.procs`` of the job's devices cgroup (v1, or v2 with a BPF
    device program): the daemon joins it as root before dropping to the user and exec, so it
    and the servers it starts see only the job's GPUs.

    On any failure the daemon is stopped and the directories removed before the error is raised.
    """
    from gpuslurm.runner import run_command

    if not uuids:
        raise InputError("a job without GPUs gets no MPS daemon", source="MPS")
    check_id(uid, "SLURM_JOB_UID")
    check_id(gid, "SLURM_JOB_GID")
    dirs = job_dirs(run_dir, job_id)
    env = daemon_env(dirs.pipe, dirs.log, uuids, mps_control)
    base = mps_dirs.open_base(os.path.dirname(dirs.job), create=True)
    assert base is not None
    try:
        if mps_dirs.exists(base, job_id):  # left by a run of the same job id that was never stopped
            _kill_now(_daemon_processes(uid, dirs.pipe), uid)
            mps_dirs.remove_or_set_aside(base, job_id, dirs.job)
        try:
            os.mkdir(job_id, 0o755, dir_fd=base)
        except OSError as exc:  # a full or read-only /run: the node's problem, not a bug
            raise HardwareError(f"{dirs.job}: cannot make the MPS directory: {exc.strerror}") from None
        try:
            try:
                mps_dirs.make_user_dirs(base, job_id, uid, gid)
            except OSError as exc:
                raise HardwareError(f"{dirs.job}: cannot make the MPS pipe and log directories: "
                                    f"{exc.strerror}") from None
            # The user's supplementary groups: a site may give GPU device files to a group
            # (NVreg_DeviceFileGID), and the MPS server the daemon starts opens them.
            run_command([mps_control, "-d"], env=env, user=uid, group=gid, groups=_user_groups(uid, gid),
                        cwd="/", timeout=timeout, cgroup_procs=cgroup_procs)
            deadline = time.monotonic() + timeout
            pid = _wait_for_daemon(uid, dirs.pipe, deadline)
            for command in control_commands(request.active_thread_percentage,
                                            pinned_memory_limit_mib, len(uuids)):
                _control(mps_control, command, env, uid, gid, deadline)
            daemon = MpsDaemon(job_id, uid, gid, dirs.pipe, dirs.log, tuple(uuids), request.trigger,
                               request.active_thread_percentage, pid, _start_ticks(pid))
            _write_state(base, job_id, daemon)
            return daemon
        except BaseException:
            try:
                _kill_now(_daemon_processes(uid, dirs.pipe), uid)
                mps_dirs.remove(base, job_id)
            except OSError:
                pass  # the start's own error is the one to report
            raise
    finally:
        os.close(base)


def _user_groups(uid: int, gid: int) -> list[int]:
    """``uid``'s groups as the system knows them (none for a uid without a passwd entry)."""
    import pwd

    try:
        name = pwd.getpwuid(uid).pw_name
    except KeyError:
        return []
    return sorted(set(os.getgrouplist(name, gid)) - {gid})


def _wait_for_daemon(uid: int, pipe_dir: str, deadline: float) -> int | None:
    """The control daemon's pid once it runs; CommandError if none appears before ``deadline``."""
    while True:
        found = _daemon_processes(uid, pipe_dir)
        if found:
            return min(t.pid for t in found)  # servers start only when a client connects: the daemon
        if time.monotonic() >= deadline:
            raise CommandError(f"the MPS control daemon for {pipe_dir} did not start")
        time.sleep(_POLL_S)


def _control(mps_control: str, command: str, env: dict[str, str], uid: int, gid: int,
             deadline: float) -> None:
    """Send one command; retried until ``deadline`` while the daemon is not listening yet."""
    from gpuslurm.runner import run_command

    while True:
        left = deadline - time.monotonic()
        try:
            run_command([mps_control], input_text=command + "\n", env=env, user=uid, group=gid,
                        cwd="/", timeout=max(left, 0.1))
            return
        except CommandError as exc:
            if time.monotonic() + _POLL_S >= deadline:
                raise CommandError(f"MPS control command {command!r} failed: {exc}", exc.argv,
                                   exc.returncode, exc.stderr) from None
        time.sleep(_POLL_S)


def _write_state(base: int, job_id: str, daemon: MpsDaemon) -> None:
    payload = dict(daemon._asdict(), version=STATE_VERSION, uuids=list(daemon.uuids))
    job = os.open(job_id, DIR_FLAGS, dir_fd=base)
    try:
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        fd = os.open(STATE_FILE, flags, 0o600, dir_fd=job)
        with os.fdopen(fd, "w") as fh:
            fh.write(json.dumps(payload, sort_keys=True) + "\n")
    finally:
        os.close(job)


# --- stop -------------------------------------------------------------------------------------


def stop_mps(job_id: str, *, run_dir: str, mps_control: str, timeout: float = 10.0,
             grace: float = 5.0, uid: int | None = None, gid: int | None = None) -> MpsStop | None:
    """Stop the job's daemon (``quit``, then signals) and remove its directories.

    None when the job has no MPS directory here. ``uid``/``gid`` (from the epilog's environment)
    are used only when ``mps.json`` cannot be read. Never raises for a daemon that misbehaves:
    the result says what happened.
    """
    dirs = job_dirs(run_dir, job_id)
    base = mps_dirs.open_base(os.path.dirname(dirs.job), create=False)
    if base is None:
        return None
    try:
        if not mps_dirs.exists(base, job_id):
            return None
        errors: list[str] = []
        daemon = None
        try:
            daemon = _read_state(base, job_id, dirs.job)
        except (InputError, OSError) as exc:
            errors.append(f"cannot read the MPS state: {exc}")
        if daemon is not None:
            uid, gid = daemon.uid, daemon.gid
        if uid is None:  # only the job's user's processes may be signalled: the pipe's owner is it
            uid = mps_dirs.pipe_owner(base, job_id)
        quit_error = _quit(mps_control, dirs, daemon, uid, gid, timeout)
        killed, stuck = _stop_processes(uid, dirs.pipe, daemon, grace, quit_error is None)
        try:
            mps_dirs.remove(base, job_id)
        except OSError as exc:
            errors.append(f"cannot remove {dirs.job}: {exc.strerror or exc}")
        return MpsStop(job_id, daemon, quit_error, killed, stuck, tuple(errors))
    finally:
        os.close(base)


def _quit(mps_control: str, dirs: MpsDirs, daemon: MpsDaemon | None, uid: int | None,
          gid: int | None, timeout: float) -> str | None:
    from gpuslurm.runner import run_command

    if uid is None:
        return "the job's uid is unknown: quit not sent"
    env = daemon_env(dirs.pipe, dirs.log, daemon.uuids if daemon else (), mps_control)
    try:
        run_command([mps_control], input_text="quit\n", env=env, user=uid,
                    group=uid if gid is None else gid, cwd="/", timeout=timeout)
    except CommandError as exc:
        return str(exc)
    return None


def _stop_processes(uid: int | None, pipe_dir: str, daemon: MpsDaemon | None, grace: float,
                    quit_sent: bool) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Wait for the daemon to leave after ``quit``, signal what is left: (signalled, stuck)."""
    if uid is None:  # whose processes they are is unknown: signal none (another user's, root's)
        return (), ()
    hint = _recorded_pid(daemon)
    left = _wait_gone(uid, pipe_dir, hint, grace if quit_sent else 0.0)
    if not left:
        return (), ()
    signalled = {t.pid for t in left}
    if not quit_sent:  # SIGTERM lets a daemon that never got quit clean up
        import signal  # only now: an enum-heavy module most hook runs never need

        send_signal(left, signal.SIGTERM)
        left = _wait_gone(uid, pipe_dir, hint, grace)
        signalled.update(t.pid for t in left)
    return tuple(sorted(signalled)), _kill_now(left, uid)


def _kill_now(targets: Sequence[Target], uid: int) -> tuple[int, ...]:
    """SIGKILL ``targets`` (each still the process the scan found, and ``uid``'s: pinned by a
    pidfd, start time and owner checked, :mod:`gpuslurm.isolate.kill`); the PIDs of those still
    alive ``KILL_WAIT_S`` later (stuck in the kernel)."""
    import signal

    mine = [t for t in targets if t.uid == uid]
    send_signal(mine, signal.SIGKILL)
    deadline = time.monotonic() + KILL_WAIT_S
    alive = [t for t in mine if _alive(t)]
    while alive and time.monotonic() < deadline:
        time.sleep(_POLL_S)
        alive = [t for t in alive if _alive(t)]
    return tuple(t.pid for t in alive)


def _wait_gone(uid: int | None, pipe_dir: str, hint: int | None, wait: float) -> list[Target]:
    deadline = time.monotonic() + wait
    while True:
        left = _daemon_processes(uid, pipe_dir, hint)
        if not left or time.monotonic() >= deadline:
            return left
        time.sleep(_POLL_S)


def _recorded_pid(daemon: MpsDaemon | None) -> int | None:
    """The recorded daemon pid if that process still is the one recorded (same start time)."""
    if daemon is None or daemon.pid is None or daemon.pid_start is None:
        return None
    return daemon.pid if _start_ticks(daemon.pid) == daemon.pid_start else None


def _read_state(base: int, job_id: str, job_path: str) -> MpsDaemon | None:
    path = os.path.join(job_path, STATE_FILE)
    job = os.open(job_id, DIR_FLAGS, dir_fd=base)
    try:
        try:
            fd = os.open(STATE_FILE, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=job)
        except FileNotFoundError:
            raise InputError("missing", source=path) from None
    finally:
        os.close(job)
    with os.fdopen(fd, "rb") as fh:
        st = os.fstat(fh.fileno())
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid():
            raise InputError("not a regular file of ours", source=path)
        data = fh.read(1 << 16)
    try:
        doc = json.loads(data)
        return state_from_dict(doc, path)
    except (ValueError, UnicodeDecodeError) as exc:
        raise InputError(f"not valid JSON: {exc}", source=path) from None


def state_from_dict(doc: object, source: str) -> MpsDaemon:
    """Validate a decoded ``mps.json``."""
    if not isinstance(doc, dict):
        raise InputError("not a JSON object", source=source)
    kinds: dict[str, Any] = {"job_id": str, "uid": int, "gid": int, "pipe_dir": str, "log_dir": str,
                             "uuids": list, "trigger": str, "active_thread_percentage": int,
                             "pid": (int, type(None)), "pid_start": (int, type(None))}
    for key, kind in kinds.items():
        if not isinstance(doc.get(key), kind) or isinstance(doc.get(key), bool):
            raise InputError(f"{key!r} missing or of the wrong type", source=source)
    if not all(isinstance(u, str) for u in doc["uuids"]):
        raise InputError("'uuids' must be strings", source=source)
    return MpsDaemon(**{k: doc[k] for k in kinds if k != "uuids"}, uuids=tuple(doc["uuids"]))


# --- processes ------------------------------------------------------------------------------


def _daemon_processes(uid: int | None, pipe_dir: str, hint: int | None = None) -> list[Target]:
    """Live processes of ``uid`` started with this pipe directory, or children of ``hint``, each
    with the start time read by this scan (the signal is sent only to that very process).

    Only ``uid``'s: anyone can put the job's pipe directory into their own environment, root
    included, and must not be killed for it. ``uid`` None finds nothing.
    """
    from gpuslurm.hw.live.procfs import ProcessProblem, list_pids, read_environ, read_identity, read_status

    if uid is None:
        return []
    needle = f"{PIPE_VAR}={pipe_dir}".encode()
    me = os.getpid()
    candidates: dict[int, tuple[int | None, int]] = {}  # pid -> (ppid, start ticks): uid's live ones
    found: set[int] = set()
    for pid in list_pids():
        if pid == me:
            continue
        before = read_identity(pid)
        status = read_status(pid)
        if isinstance(before, ProcessProblem) or isinstance(status, ProcessProblem) \
                or not status.alive or status.uid != uid:
            continue
        named = pid == hint or needle in read_environ(pid)
        after = read_identity(pid)  # the same process all along, or the facts mix two
        if isinstance(after, ProcessProblem) or after.start_ticks != before.start_ticks:
            continue
        candidates[pid] = (status.ppid, before.start_ticks)
        if named:
            found.add(pid)
    grew = True
    while grew:  # the daemon's servers, whatever their environment
        more = {p for p, (ppid, _) in candidates.items() if ppid in found} - found
        found |= more
        grew = bool(more)
    return [Target("", pid, None, candidates[pid][1], uid) for pid in sorted(found)]


def _alive(t: Target) -> bool:
    """Whether ``t`` still runs: the same start time, not a zombie."""
    from gpuslurm.hw.live.procfs import ProcessProblem, read_status

    if _start_ticks(t.pid) != t.start_ticks:
        return False
    status = read_status(t.pid)
    return not isinstance(status, ProcessProblem) and status.alive


def _start_ticks(pid: int | None) -> int | None:
    if pid is None:
        return None
    from gpuslurm.hw.live.procfs import ProcessProblem, read_identity

    ident = read_identity(pid)
    return None if isinstance(ident, ProcessProblem) else ident.start_ticks
