"""cgroup v1 device limits for real: the job's cgroup, joining it as the user, and what the user
cannot do to it. Runs on the host's /sys/fs/cgroup/devices (root only)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from tests.helpers.cgroup_helpers import (
    NOBODY,
    PROBE,
    SYSTEM_PYTHON,
    as_nobody,
    make_gpu_files,
    parse_probe,
    unavailable,
)

from gpuslurm.errors import HardwareError
from gpuslurm.isolate.cgroup_v1 import join_v1, remove_v1, setup_v1, v1_job_dir
from gpuslurm.isolate.cgroupfs import cgroup_version
from gpuslurm.isolate.denylist import Device

ROOT = "/sys/fs/cgroup"


def _skip_reason() -> str | None:
    reason = unavailable("cgroup v1 tests")
    if reason is None and cgroup_version(ROOT) != 1:
        reason = f"{ROOT} has no cgroup v1 devices hierarchy"
    return reason


pytestmark = pytest.mark.skipif(_skip_reason() is not None, reason=str(_skip_reason()))


@pytest.fixture
def job_id() -> Iterator[str]:
    # Far above the test cluster's job ids, and one per test process.
    jid = str(900_000_000 + os.getpid() % 1_000_000)
    yield jid
    assert remove_v1(ROOT, jid)


@pytest.fixture
def gpu_dir() -> Iterator[Path]:
    yield from make_gpu_files(range(8))


def _probe_in_cgroup(cgroup: str, gpu_dir: Path) -> dict[str, str]:
    """A process of nobody that joins ``cgroup`` itself, then opens every device."""
    paths = [str(gpu_dir / f"nvidia{i}") for i in range(8)]
    script = f"echo $$ > {cgroup}/cgroup.procs && exec {SYSTEM_PYTHON} -c \"$0\" \"$@\""
    proc = as_nobody(["/bin/sh", "-c", script, PROBE, *paths])
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    return parse_probe(out)


def test_denied_gpus_are_eperm_others_open_through(job_id: str, gpu_dir: Path) -> None:
    path = setup_v1(ROOT, job_id, NOBODY, [Device(195, 1), Device(195, 6)])
    assert path == v1_job_dir(ROOT, job_id)
    assert os.stat(f"{path}/cgroup.procs").st_uid == NOBODY
    assert os.stat(f"{path}/devices.deny").st_uid == 0 and os.stat(path).st_uid == 0
    result = _probe_in_cgroup(path, gpu_dir)
    assert result == {f"nvidia{i}": "EPERM" if i in (1, 6) else "ENXIO" for i in range(8)}
    # Control: outside the cgroup the same process opens all eight through to the (absent) driver.
    proc = subprocess.run([sys.executable, "-c", PROBE, *(str(gpu_dir / f"nvidia{i}") for i in range(8))],
                          capture_output=True, text=True, check=True, timeout=30)
    assert set(parse_probe(proc.stdout).values()) == {"ENXIO"}


USER_ATTEMPTS = """
import os, sys
cg, root = sys.argv[1], sys.argv[2]
def attempt(name, fn):
    try:
        fn()
        print(name, "DONE")
    except OSError as exc:
        print(name, "REFUSED", exc.errno)
def write(path, text):
    with open(path, "w") as fh:
        fh.write(text)
write(cg + "/cgroup.procs", str(os.getpid()))  # join: allowed
attempt("allow", lambda: write(cg + "/devices.allow", "a *:* rwm"))
attempt("leave", lambda: write(root + "/cgroup.procs", str(os.getpid())))
attempt("mkdir", lambda: os.mkdir(cg + "/escape"))
attempt("move-root-process", lambda: write(cg + "/cgroup.procs", sys.argv[3]))
"""


def test_the_user_can_join_but_not_loosen_leave_or_pull_in_others(job_id: str) -> None:
    path = setup_v1(ROOT, job_id, NOBODY, [Device(195, 0)])
    holder = subprocess.Popen(["/bin/sleep", "30"])  # a root process the user must not move
    try:
        proc = as_nobody([SYSTEM_PYTHON, "-c", USER_ATTEMPTS, path, f"{ROOT}/devices", str(holder.pid)])
        out, err = proc.communicate(timeout=30)
    finally:
        holder.kill()
        holder.wait()
    assert proc.returncode == 0, err
    results = dict(line.split(" ", 1) for line in out.splitlines())
    assert {k: v.split()[0] for k, v in results.items()} == dict.fromkeys(
        ("allow", "leave", "mkdir", "move-root-process"), "REFUSED"), out


def test_join_moves_a_process_of_the_users_own(job_id: str, gpu_dir: Path) -> None:
    assert join_v1(ROOT, job_id, os.getpid()) is None  # no cgroup for the job: nothing to join
    path = setup_v1(ROOT, job_id, NOBODY, [Device(195, 2)])
    task = as_nobody([SYSTEM_PYTHON, "-c", "import sys; sys.stdin.readline(); exec(sys.argv.pop(1))", PROBE,
                      str(gpu_dir / "nvidia2"), str(gpu_dir / "nvidia3")], stdin=subprocess.PIPE)
    try:
        assert join_v1(ROOT, job_id, task.pid) == path  # root may move anyone
        out, _ = task.communicate("go\n", timeout=30)
    finally:
        task.kill()
    assert parse_probe(out) == {"nvidia2": "EPERM", "nvidia3": "ENXIO"}


def test_remove_kills_stragglers_and_a_stale_cgroup_is_remade(job_id: str) -> None:
    path = setup_v1(ROOT, job_id, NOBODY, [Device(195, 0)])
    straggler = as_nobody(["/bin/sh", "-c", f"echo $$ > {path}/cgroup.procs && exec /bin/sleep 60"])
    for _ in range(100):
        if Path(f"{path}/cgroup.procs").read_text().split():
            break
        subprocess.run(["/bin/sleep", "0.02"], check=True)
    # The prolog of a job id that is seen again clears the old cgroup first.
    setup_v1(ROOT, job_id, NOBODY, [Device(195, 1)])
    assert straggler.wait(timeout=10) == -9
    assert Path(f"{path}/cgroup.procs").read_text() == ""
    assert remove_v1(ROOT, job_id)
    assert not os.path.exists(path)
    assert remove_v1(ROOT, job_id)  # idempotent


def test_setup_failure_is_a_hardware_error_and_leaves_nothing(job_id: str) -> None:
    with pytest.raises(HardwareError, match="cannot set up"):
        setup_v1(ROOT, job_id, NOBODY, [Device(195, 0), Device(-1, 0)])
    assert not os.path.exists(v1_job_dir(ROOT, job_id))
    with pytest.raises(HardwareError, match="cannot make"):
        setup_v1("/nonexistent-cgroup-root", job_id, NOBODY, [])
