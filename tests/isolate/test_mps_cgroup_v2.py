"""The MPS daemon inside the job's device limits on cgroup v2, tried as the job's user would.

This machine's hierarchy is v1 with a hybrid cgroup2 mount at ``/sys/fs/cgroup/unified``, where
BPF device programs attach and hold (tests/isolate/test_bpf_v2.py); ``[paths] cgroup_root``
pointed there makes gpuslurm see cgroup v2. The job's user is ``nobody``, its GPUs fake device
files (ENXIO: let through, no driver; EPERM: refused by the cgroup). Root only.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from tests.helpers.cgroup_helpers import UNIFIED, as_nobody, probe_as_nobody_in, v2_unavailable
from tests.helpers.mps_helpers import (
    JOB,
    SYSTEM_PYTHON,
    Mps,
    hook_site,
    job_env,
    live,
    quiet,
)
from tests.helpers.mps_helpers import (
    live_with_pipe_under as processes_with,
)

from gpuslurm.isolate import bpf
from gpuslurm.isolate.cgroup_v2 import V2_MPS_PARENT, v2_mps_dir
from gpuslurm.isolate.cgroupfs import cgroup_version, remove_cgroup
from gpuslurm.slurm.hooks import run_epilog, run_prolog

# As the job's user: write argv[2] into the cgroup.procs argv[1]; prints OK or the errno name.
MOVE = """
import errno, sys
try:
    with open(sys.argv[1], "w") as fh:
        fh.write(sys.argv[2])
    print("OK")
except OSError as exc:
    print(errno.errorcode.get(exc.errno, exc.errno))
"""


def _skip_reason() -> str | None:
    return v2_unavailable("cgroup v2 MPS tests")


pytestmark = pytest.mark.skipif(_skip_reason() is not None, reason=str(_skip_reason()))


@pytest.fixture(autouse=True, scope="module")
def _host_left_as_found() -> Iterator[None]:
    """The parent the prolog makes stays on a real node; on this host it goes if it was not there."""
    parent = Path(UNIFIED) / V2_MPS_PARENT
    existed = parent.exists()
    yield
    if not existed:
        try:
            parent.rmdir()
        except OSError:
            pass


def v2_site(mps: Mps, devices: str, control: str | None = None) -> dict[str, str]:
    """The hook site of test_mps_daemon with ``cgroup_root`` on the cgroup2 mount, where Slurm
    constrains the tasks' devices."""
    site = hook_site(mps, control)
    slurm_cgroup = mps.root / "cgroup.conf"
    slurm_cgroup.write_text("CgroupPlugin=cgroup/v2\nConstrainDevices=yes\n")
    config = Path(site.env["GPUSLURM_CONFIG"])
    text = config.read_text().replace('devices = "never"', f'devices = "{devices}"')
    config.write_text(text.replace("[paths]\n", f'[paths]\ncgroup_root = "{UNIFIED}"\n'
                                                f'slurm_cgroup_conf = "{slurm_cgroup}"\n'))
    return job_env(site, SLURM_JOB_COMMENT="gpuslurm:mps")


def v2_cgroup_of(pid: int) -> str:
    lines = Path(f"/proc/{pid}/cgroup").read_text().splitlines()
    return next(line.split(":", 2)[2] for line in lines if line.startswith("0::"))


def test_on_cgroup_v2_the_prolog_confines_the_daemon_in_its_own_cgroup(mps: Mps) -> None:
    """Slurm constrains the tasks (ConstrainDevices=yes), the node is v2: the daemon starts in
    ``gpuslurm.mps/mps_<id>`` with a BPF program denying every GPU but the job's 2 and 3. The
    user, inside it as their daemon is (ptrace gives them no more), opens only those; they can
    move neither the daemon nor themselves out; the epilog kills and removes it."""
    env = v2_site(mps, "auto")
    cgroup = Path(v2_mps_dir(UNIFIED, JOB))
    assert cgroup_version(UNIFIED) == 2
    log = quiet("prolog")
    try:
        assert run_prolog(env, log) == 0, log.lines
        [pid] = processes_with(mps.run_dir)
        assert v2_cgroup_of(pid) == f"/{V2_MPS_PARENT}/mps_{JOB}"
        assert (cgroup / "cgroup.procs").stat().st_uid == 0  # not the user's to join or leave
        assert cgroup.parent.stat().st_uid == 0
        fd = os.open(cgroup, os.O_RDONLY | os.O_DIRECTORY)
        try:
            assert len(bpf.attached_program_ids(fd)) == 1
        finally:
            os.close(fd)
        # as the user, in the daemon's cgroup (dgx-h100: minor = index)
        assert probe_as_nobody_in(str(cgroup / "cgroup.procs")) == {
            f"nvidia{m}": "ENXIO" if m in (2, 3) else "EPERM" for m in range(8)}
        for target in (f"{UNIFIED}/cgroup.procs", f"{UNIFIED}/{V2_MPS_PARENT}/cgroup.procs"):
            attempt = as_nobody([SYSTEM_PYTHON, "-c", MOVE, target, str(pid)])
            assert attempt.communicate(timeout=30)[0].strip() == "EACCES"  # the daemon stays in
        assert v2_cgroup_of(pid) == f"/{V2_MPS_PARENT}/mps_{JOB}"
        log = quiet("epilog")
        assert run_epilog(env, log) == 0, log.lines
        assert not live(pid) and not cgroup.exists()
        assert any(str(cgroup) in line for line in log.lines), log.lines
    finally:
        remove_cgroup(str(cgroup))


def test_on_cgroup_v2_a_daemon_that_fails_to_start_leaves_no_cgroup(mps: Mps) -> None:
    """The prolog's failure path: the user's daemon does not start (the job is refused, the node
    stays up) and the cgroup made for it is removed at once."""
    env = v2_site(mps, "auto", mps.control("failing", GPUSLURM_FAKE_MPS_FAIL_START="1"))
    cgroup = Path(v2_mps_dir(UNIFIED, JOB))
    log = quiet("prolog")
    try:
        assert run_prolog(env, log) == 0, log.lines
        assert any("refused this job" in line for line in log.lines), log.lines
        assert processes_with(mps.run_dir) == []
        assert not cgroup.exists()
    finally:
        remove_cgroup(str(cgroup))


def test_on_cgroup_v2_devices_never_makes_no_cgroup_for_the_daemon(mps: Mps) -> None:
    env = v2_site(mps, "never")
    log = quiet("prolog")
    try:
        assert run_prolog(env, log) == 0, log.lines
        [pid] = processes_with(mps.run_dir)
        assert not v2_cgroup_of(pid).startswith(f"/{V2_MPS_PARENT}/")
        assert not Path(v2_mps_dir(UNIFIED, JOB)).exists()
        assert run_epilog(env, quiet("epilog")) == 0
        assert not live(pid)
    finally:
        remove_cgroup(v2_mps_dir(UNIFIED, JOB))


def test_on_cgroup_v2_where_gpuslurm_isolates_the_daemon_still_has_its_own_cgroup(mps: Mps) -> None:
    """``devices = "always"``: the job's tasks get ``<v2_job_parent>/job_<id>`` (Slurm's place,
    made here as a test directory) and the daemon ``gpuslurm.mps/mps_<id>``, never ``job_<id>``
    itself; the epilog removes both."""
    parent = Path(UNIFIED) / f"gpuslurm-test-{os.getpid()}"
    parent.mkdir()
    env = v2_site(mps, "always")
    config = Path(env["GPUSLURM_CONFIG"])
    config.write_text(config.read_text() + f'v2_job_parent = "{parent.name}"\n')  # [cgroup] is last
    cgroup, job = Path(v2_mps_dir(UNIFIED, JOB)), parent / f"job_{JOB}"
    log = quiet("prolog")
    try:
        assert run_prolog(env, log) == 0, log.lines
        assert job.is_dir()
        [pid] = processes_with(mps.run_dir)
        assert v2_cgroup_of(pid) == f"/{V2_MPS_PARENT}/mps_{JOB}"
        # as the user, in the daemon's cgroup (dgx-h100: minor = index)
        assert probe_as_nobody_in(str(cgroup / "cgroup.procs")) == {
            f"nvidia{m}": "ENXIO" if m in (2, 3) else "EPERM" for m in range(8)}
        log = quiet("epilog")
        assert run_epilog(env, log) == 0, log.lines
        assert not live(pid) and not cgroup.exists() and not job.exists()
    finally:
        remove_cgroup(str(cgroup))
        remove_cgroup(str(job))
        parent.rmdir()
