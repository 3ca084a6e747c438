"""A PBS job's own MPS daemon in the real OpenPBS test cluster, as the real user ``gpuspbs1``.

``qsub -l gpuslurm_mps=true`` (the boolean server resource ``gpuslurm install --pbs`` creates)
asks for it: execjob_begin starts the daemon as the job's user inside the job's devices cgroup,
execjob_launch names its pipe and log directories in the task's environment, execjob_end stops it
and removes its directories. The hook is installed by the ``hooked`` fixture of
test_pbs_hooks_e2e (its own instance for this module); this module only adds the MPS control
program (the stand-in tests/helpers/fakes/nvidia-cuda-mps-control, shared with the Slurm MPS test
through tests/helpers/mps_helpers.py) and a share to its config, and puts the config back afterwards.
"""

from __future__ import annotations

import os
import pwd
import re
import signal
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from tests.helpers.mps_helpers import (
    devices_cgroup,
    fake_control,
    live_with_pipe_under,
    probe_devices,
    records,
)
from tests.helpers.pbs_helpers import Hooked, _job_report

from gpuslurm.hw.source import load_node
from gpuslurm.isolate.cgroup_v1 import v1_job_dir

pytestmark = pytest.mark.pbs

SHARE = 60


@dataclass
class MpsPbs:
    hooked: Hooked
    control: Path
    calls: Path

    @property
    def mps_dir(self) -> Path:
        return self.hooked.cluster.state_dir / "gs-run" / "mps"


@pytest.fixture(scope="module")
def mps_pbs(hooked: Hooked) -> Iterator[MpsPbs]:
    root = hooked.cluster.state_dir / "mps-stand-in"
    root.mkdir(mode=0o755)
    control, calls = fake_control(root)
    original = hooked.config.read_text()
    extra = f"[mps]\nactive_thread_percentage = {SHARE}\n[hooks]\ncommand_timeout_s = 15\n"
    paths = f'[paths]\nmps_control = "{control}"\n'
    hooked.config.write_text(original.replace("[paths]\n", paths, 1) + extra)
    try:
        yield MpsPbs(hooked, control, calls)
    finally:
        hooked.config.write_text(original)
        for pid in live_with_pipe_under(str(hooked.cluster.state_dir)):  # a failed run leaves none
            os.kill(pid, signal.SIGKILL)


JOB = """\
out={out}/$PBS_JOBID
echo "CVD=$CUDA_VISIBLE_DEVICES" > $out.tmp
echo "UID=$(id -u)" >> $out.tmp
env | grep -E "^CUDA_MPS_" >> $out.tmp
if [ -n "$CUDA_MPS_PIPE_DIRECTORY" ]; then
  echo "PIPE=$(stat -c '%a %u' "$CUDA_MPS_PIPE_DIRECTORY")" >> $out.tmp
  echo "DAEMON=$(cat "$CUDA_MPS_PIPE_DIRECTORY/nvidia-cuda-mps-control.pid")" >> $out.tmp
  echo "ASKED=$(echo get_default_active_thread_percentage | {control})" >> $out.tmp
fi
mv $out.tmp $out
while [ ! -e {out}/release-$PBS_JOBID ]; do sleep 0.2; done
"""


def _uid_of(pid: int) -> int:
    match = re.search(r"^Uid:\s+(\d+)", Path(f"/proc/{pid}/status").read_text(), re.M)
    assert match
    return int(match.group(1))


def test_a_job_asking_for_mps_gets_its_own_confined_daemon_stopped_at_its_end(mps_pbs: MpsPbs) -> None:
    site = mps_pbs.hooked
    user = pwd.getpwnam(site.cluster.user)
    node = load_node(str(site.bundle))
    jobid = site.cluster.qsub(["-l", "select=1:ncpus=1:ngpus=1", "-l", "gpuslurm_mps=true"],
                                JOB.format(out=site.out, control=mps_pbs.control))
    report = _job_report(site, jobid)
    job_dir = mps_pbs.mps_dir / jobid
    try:
        # the task's environment names the job's own pipe and log directories, the user's alone
        assert report["UID"] == str(user.pw_uid)
        if report.get("CUDA_MPS_PIPE_DIRECTORY") != str(job_dir / "pipe"):
            pytest.fail(f"no MPS pipe directory: {report}\n{site.cluster.job(jobid)}\n"
                        f"{site.mom_log()[-6000:]}")
        assert report["CUDA_MPS_LOG_DIRECTORY"] == str(job_dir / "log")
        assert report["PIPE"] == f"700 {user.pw_uid}"
        assert report["ASKED"] == f"{SHARE}.0"  # the job reached its daemon, configured by the begin
        # the daemon runs as the job's user, on the job's GPU only
        daemon = int(report["DAEMON"])
        assert _uid_of(daemon) == user.pw_uid
        start = next(r for r in records(mps_pbs.calls, "start") if r["env"]["CUDA_MPS_PIPE_DIRECTORY"]
                     == str(job_dir / "pipe"))
        assert (start["uid"], start["gid"]) == (user.pw_uid, user.pw_gid)
        assert start["env"]["CUDA_VISIBLE_DEVICES"] == report["CVD"] and report["CVD"].startswith("GPU-")
        if site.cgroup is not None:  # in the job's own devices cgroup: the job's GPU opens, no other
            cgroup = Path(v1_job_dir(str(site.cgroup), jobid))
            assert devices_cgroup(daemon) == f"/gpuslurm/job_{jobid}"
            mine = next(g.device_file for g in node.gpus if g.uuid == report["CVD"])
            opened = probe_devices([g.device_file for g in node.gpus], user.pw_uid, user.pw_gid,
                                   str(cgroup / "cgroup.procs"))
            assert opened.pop(mine) == "ENXIO", opened  # a fake device: allowed, no driver behind
            assert set(opened.values()) == {"EPERM"}, opened
    finally:
        (site.out / f"release-{jobid}").touch()
    status = site.cluster.wait(jobid)
    assert re.search(r"^\s*Exit_status = 0$", status, re.M), status
    # after the job: quit sent as the user, the daemon gone, its directories and cgroup too
    commands = [r for r in records(mps_pbs.calls, "command") if r["pid"] == daemon]
    assert commands and commands[-1]["command"] == "quit", commands
    quit_by = [r for r in records(mps_pbs.calls, "client") if r["stdin"] == ["quit"]
               and r["env"]["CUDA_MPS_PIPE_DIRECTORY"] == str(job_dir / "pipe")]
    assert [r["uid"] for r in quit_by] == [user.pw_uid]
    deadline = time.monotonic() + 10
    while live_with_pipe_under(str(job_dir)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert live_with_pipe_under(str(job_dir)) == []
    assert not job_dir.exists()
    if site.cgroup is not None:
        assert not Path(v1_job_dir(str(site.cgroup), jobid)).exists()
        assert not Path(v1_job_dir(str(site.cgroup), jobid, "mps")).exists()


def test_a_job_that_did_not_ask_gets_no_daemon(mps_pbs: MpsPbs) -> None:
    site = mps_pbs.hooked
    before = len(records(mps_pbs.calls, "start"))
    for ask in ([], ["-l", "gpuslurm_mps=false"]):
        jobid = site.cluster.qsub(["-l", "select=1:ncpus=1:ngpus=1", *ask],
                                    JOB.format(out=site.out, control=mps_pbs.control))
        report = _job_report(site, jobid)
        (site.out / f"release-{jobid}").touch()
        assert "CUDA_MPS_PIPE_DIRECTORY" not in report and report["CVD"].startswith("GPU-"), report
        assert not (mps_pbs.mps_dir / jobid).exists()
        site.cluster.wait(jobid)
    assert len(records(mps_pbs.calls, "start")) == before


def test_a_malformed_mps_request_is_refused_at_qsub_in_one_line(mps_pbs: MpsPbs) -> None:
    """The resource is PBS's boolean: qsub itself refuses any other value, before a node sees it."""
    for bad in ("lots", "50"):
        with pytest.raises(RuntimeError) as info:
            mps_pbs.hooked.cluster.qsub(["-l", "select=1:ncpus=1:ngpus=1", "-l", f"gpuslurm_mps={bad}"],
                                        "true\n")
        message = str(info.value).split(": ", 1)[1]
        assert "gpuslurm_mps" in message and "\n" not in message.strip(), message
