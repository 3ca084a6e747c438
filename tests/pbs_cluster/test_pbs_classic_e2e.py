"""gpuslurm's classic PBS prologue and epilogue in the real OpenPBS test cluster, as a real user.

The module fixture writes ``mom_priv/prologue`` and ``epilogue`` with ``gpuslurm install --pbs
--classic`` (a copy of the bundle replayed, a config of its own, no hooks), and removes them at the
end. The NUMA vnodes are those ``cluster.sh up`` inserted from ``gpuslurm pbs-conf``: PBS places
the job, and the scripts find its GPUs from ``exec_vnode`` (every GPU of its vnode here).
"""

from __future__ import annotations

import json
import os
import re
import signal
import stat
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import pytest
from tests.helpers.pbs_fixture import PREFIX, PbsCluster
from tests.helpers.pbs_helpers import HOST, Installed, _online, copy_bundle

from gpuslurm.hw.source import load_node

pytestmark = pytest.mark.pbs

QDEL = str(PREFIX / "bin" / "qdel")


@dataclass
class Classic(Installed):
    """The classic scripts (``install --pbs --classic``)."""

    run_name: ClassVar[str] = "cl-run"
    state_name: ClassVar[str] = "cl-state"
    install_flags: ClassVar[tuple[str, ...]] = ("--classic",)

    @property
    def mom_priv(self) -> Path:
        return self.cluster.state_dir / "home" / "mom_priv"


@pytest.fixture(scope="module")
def classic(pbs_cluster: PbsCluster, pbs_bin: Path) -> Iterator[Classic]:
    """pbs_mom gives the scripts its own environment, without the cluster's PBS_CONF_FILE (a real
    execution host has /etc/pbs.conf): qstat and qmgr are conftest's wrappers that set it."""
    state = pbs_cluster.state_dir
    bundle = state / "classic-bundle"
    copy_bundle(bundle)
    config = state / "classic.toml"
    config.write_text(f'[paths]\nrun_dir = "{state}/cl-run"\nstate_dir = "{state}/cl-state"\n'
                      f'cgroup_root = "{state}/no-cgroup"\nqstat = "{pbs_bin}/qstat"\n'
                      f'qmgr = "{pbs_bin}/qmgr"\n[epilog]\nkill_grace_s = 1\n')
    config.chmod(0o644)
    found = Classic(pbs_cluster, bundle, config)
    try:
        installed = found.install()
        assert installed.returncode == 0, installed.stderr
        assert installed.stdout.count("create ") == 2, installed.stdout
        yield found
    finally:
        for kind in ("prologue", "epilogue"):
            (found.mom_priv / kind).unlink(missing_ok=True)


def test_install_writes_root_owned_scripts_pbs_mom_runs_and_again_changes_nothing(classic: Classic) -> None:
    for kind in ("prologue", "epilogue"):
        st = (classic.mom_priv / kind).stat()
        assert st.st_uid == 0 and stat.S_IMODE(st.st_mode) == 0o755 and stat.S_ISREG(st.st_mode)
    again = classic.install()
    assert again.returncode == 0 and "nothing to change" in again.stdout, again.stdout + again.stderr
    (classic.mom_priv / "epilogue").chmod(0o775)  # group-writable: pbs_mom would refuse to run it
    dry = classic.install("--dry-run")
    assert f"would set {classic.mom_priv / 'epilogue'} root's, mode 0755" in dry.stdout, dry.stdout
    assert stat.S_IMODE((classic.mom_priv / "epilogue").stat().st_mode) == 0o775
    mended = classic.install()
    assert f"set {classic.mom_priv / 'epilogue'} root's, mode 0755" in mended.stdout
    assert stat.S_IMODE((classic.mom_priv / "epilogue").stat().st_mode) == 0o755


def test_bad_input_is_one_line_and_exit_2(classic: Classic) -> None:
    prologue = str(classic.mom_priv / "prologue")
    for argv, says in (([prologue, "1.pbshost", "root"], "the prologue takes 3 arguments"),
                       ([prologue, "../../etc/passwd", "root", "root"], "job id"),
                       ([prologue, "1.pbshost", "-rf", "root"], "not a user name"),
                       ([str(classic.mom_priv / "epilogue"), "1.pbshost", "root", "root"],
                        "the epilogue takes 10 arguments")):
        done = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
        assert done.returncode == 2, (argv, done.stderr)
        lines = done.stderr.splitlines()
        assert len(lines) == 1 and says in lines[0], (argv, lines)


JOB = """\
setsid /bin/sleep 300 </dev/null >/dev/null 2>&1 &
echo $! > {out}/$PBS_JOBID.leftover.tmp
mv {out}/$PBS_JOBID.leftover.tmp {out}/$PBS_JOBID.leftover
while [ ! -e {out}/release-$PBS_JOBID ]; do sleep 0.2; done
"""


def _wait_file(path: Path, classic: Classic, jobid: str, timeout: float = 60) -> str:
    deadline = time.monotonic() + timeout
    while not path.exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{path} not written:\n{classic.cluster.job(jobid)}\n"
                               f"{classic.mom_log()[-3000:]}")
        time.sleep(0.3)
    return path.read_text()


def test_a_job_runs_mapped_to_its_vnodes_gpus_and_its_leftover_is_killed_after_it(classic: Classic) -> None:
    """The prologue maps every GPU of the job's vnode (PBS chose no device); a process the job
    left behind in its own session (``setsid``: pbs_mom does not kill it), listed on one of those
    GPUs, is killed by the epilogue, which writes the summary."""
    node = load_node(str(classic.bundle))
    jobid = classic.cluster.qsub(["-l", "select=1:ncpus=1:ngpus=1"], JOB.format(out=classic.out))
    pid = int(_wait_file(classic.out / f"{jobid}.leftover", classic, jobid))
    pidfd = os.pidfd_open(pid)
    health = classic.bundle / "health.json"
    try:
        numa = int(re.search(r"exec_vnode = \(pbshost\[(\d+)\]", classic.cluster.job(jobid)).group(1))  # type: ignore[union-attr]
        vnode_gpus = sorted(g.uuid for g in node.gpus if g.numa_node == numa)
        jmap = json.loads((classic.jobs_dir / f"{jobid}.json").read_text())
        assert sorted(g["uuid"] for g in jmap["gpus"]) == vnode_gpus and jmap["user"] == classic.cluster.user
        gpu = vnode_gpus[0]
        health.write_text(json.dumps({gpu: {"processes": [{"pid": pid, "user": classic.cluster.user}]}}))
        (classic.out / f"release-{jobid}").touch()
        status = classic.cluster.wait(jobid)
        assert re.search(r"^\s*Exit_status = 0$", status, re.M), status
        import select

        assert select.select([pidfd], [], [], 15)[0], f"pid {pid} still runs\n{classic.mom_log()[-3000:]}"
        summary_path = classic.summaries / f"{jobid}-summary.json"
        deadline = time.monotonic() + 30
        while not summary_path.exists() and time.monotonic() < deadline:
            time.sleep(0.2)
        summary = json.loads(summary_path.read_text())
        assert summary["scheduler"] == "pbs" and summary["user"] == classic.cluster.user
        assert sorted(g["uuid"] for g in summary["gpus"]) == vnode_gpus
        assert summary["leftovers"] == [{"gpu": gpu, "pid": pid, "user": classic.cluster.user,
                                         "outcome": "exited after SIGTERM"}], summary
        assert not (classic.jobs_dir / f"{jobid}.json").exists()
        assert classic.vnodes()[f"{HOST}[{numa}]"]["state"] == "free"
    finally:
        health.unlink(missing_ok=True)
        try:
            signal.pidfd_send_signal(pidfd, signal.SIGKILL)
        except ProcessLookupError:
            pass
        os.close(pidfd)


def test_an_unhealthy_gpu_takes_the_vnode_offline_and_the_job_is_requeued_not_run(classic: Classic) -> None:
    node = load_node(str(classic.bundle))
    bad = next(g for g in sorted(node.gpus, key=lambda g: g.index) if g.numa_node == 0)
    health = classic.bundle / "health.json"
    health.write_text(json.dumps({bad.uuid: {"xid": [79]}}))
    vnode = f"{HOST}[0]"
    pinned = None
    try:
        pinned = classic.cluster.qsub(["-l", f"select=1:vnode={vnode}:ncpus=1:ngpus=1"],
                                      f"touch {classic.out}/ran-$PBS_JOBID\n")
        deadline = time.monotonic() + 60
        while classic.vnodes()[vnode]["state"] != "offline":
            assert time.monotonic() < deadline, (classic.vnodes()[vnode], classic.mom_log()[-3000:])
            time.sleep(0.5)
        comment = classic.vnodes()[vnode]["comment"]
        assert bad.uuid in comment and bad.device_file in comment and "Xid 79" in comment, comment
        # pbs_mom requeues a job whose prologue exits with anything but 0 and 1
        assert re.search(rf"{re.escape(pinned)};pro/epilogue failed, file: \S+/prologue, exit: 3",
                         classic.mom_log()), classic.mom_log()[-3000:]
        time.sleep(3)  # a scheduling cycle or two: the job must not have run on the offline vnode
        assert classic.state(pinned) in ("Q", "H"), classic.cluster.job(pinned)
        assert not (classic.out / f"ran-{pinned}").exists()
        assert not (classic.jobs_dir / f"{pinned}.json").exists()
        summary = json.loads((classic.summaries / f"{pinned}-summary.json").read_text())
        assert summary["refused_by"] == "prolog" and summary["faults"][0]["uuid"] == bad.uuid
    finally:
        health.unlink(missing_ok=True)
        if pinned is not None:
            classic.cluster.run(QDEL, "-W", "force", pinned, check=False)
        _online(classic.cluster, vnode)


def test_a_job_with_a_huge_account_string_still_has_its_leftover_killed(classic: Classic) -> None:
    """The attacker's own job sets an account of 8000 characters (``qsub -A``: PBS bounds it
    nowhere); pbs_mom passes it to the epilogue, which must still kill the leftover (it refused
    its arguments before: "an argument is too long", exit 2)."""
    node = load_node(str(classic.bundle))
    jobid = classic.cluster.qsub(["-A", "acct" * 2000, "-l", "select=1:ncpus=1:ngpus=1"],
                                 JOB.format(out=classic.out))
    pid = int(_wait_file(classic.out / f"{jobid}.leftover", classic, jobid))
    pidfd = os.pidfd_open(pid)
    health = classic.bundle / "health.json"
    try:
        numa = int(re.search(r"exec_vnode = \(pbshost\[(\d+)\]", classic.cluster.job(jobid)).group(1))  # type: ignore[union-attr]
        gpu = min((g for g in node.gpus if g.numa_node == numa), key=lambda g: g.index).uuid
        health.write_text(json.dumps({gpu: {"processes": [{"pid": pid, "user": classic.cluster.user}]}}))
        (classic.out / f"release-{jobid}").touch()
        classic.cluster.wait(jobid)
        import select

        assert select.select([pidfd], [], [], 15)[0], f"pid {pid} still runs\n{classic.mom_log()[-3000:]}"
        assert not (classic.jobs_dir / f"{jobid}.json").exists()
    finally:
        health.unlink(missing_ok=True)
        try:
            signal.pidfd_send_signal(pidfd, signal.SIGKILL)
        except ProcessLookupError:
            pass
        os.close(pidfd)
