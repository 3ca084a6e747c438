"""gpuslurm's PBS hook in the real OpenPBS test cluster, as a real user.

The module fixture installs the hook into the running server with ``gpuslurm install --pbs`` (a
copy of the bundle it replays, a config of its own, a cgroup v1 devices hierarchy mounted where
pbs_mom's namespace sees it when the host has one), takes away the NUMA vnodes ``cluster.sh up``
inserted from a vnode file and restarts pbs_mom, so the vnodes the tests see are the ones the
hook's exechost_startup published. At the end it deletes the hook and puts the vnode file back.
"""

from __future__ import annotations

import json
import re
import shutil
import tempfile
import time
from pathlib import Path

import pytest
from tests.helpers.cluster_fixture import users_python
from tests.helpers.pbs_fixture import PREFIX
from tests.helpers.pbs_helpers import BUNDLE, HOST, JOB, QMGR, Hooked, _job_report, _online

from gpuslurm.gres.pbs_vnodes import plan_vnodes
from gpuslurm.hw.source import load_node
from gpuslurm.pbs.install import HOOK_FILES as HOOK_FILES

pytestmark = pytest.mark.pbs


def test_install_again_changes_nothing_and_mends_what_drifted(hooked: Hooked) -> None:
    again = hooked.install()
    assert again.returncode == 0
    assert "nothing to change: PBS has hook(s) gpuslurm, gpuslurm_throttle as wanted" in again.stdout
    hooked.cluster.run(QMGR, "-c", "set hook gpuslurm alarm = 7")
    dry = hooked.install("--dry-run")
    assert "would set hook gpuslurm alarm = 30" in dry.stdout, dry.stdout + dry.stderr
    assert "alarm = 7" in hooked.cluster.run(QMGR, "-c", "list hook gpuslurm")
    mended = hooked.install()
    assert "set hook gpuslurm alarm = 30" in mended.stdout and "would" not in mended.stdout
    assert "alarm = 30" in hooked.cluster.run(QMGR, "-c", "list hook gpuslurm")


def test_exechost_startup_publishes_cpus_memory_and_gpus_per_numa_vnode(hooked: Hooked) -> None:
    nodes = hooked.vnodes()
    assert nodes[HOST]["resources_available.ngpus"] == "0"
    for vnode in plan_vnodes(load_node(str(hooked.bundle))):
        attrs = nodes[f"{HOST}[{vnode.numa_node}]"]
        assert attrs["resources_available.ngpus"] == str(len(vnode.gpu_minors))
        assert attrs["resources_available.ncpus"] == str(len(vnode.cpus))
        assert attrs["resources_available.mem"] == f"{vnode.memory_mib}mb"
    assert "gpuslurm hook: exechost_startup answered" in hooked.mom_log()


def _exec_vnode_numa(status: str) -> int:
    match = re.search(r"^\s*exec_vnode = \(pbshost\[(\d+)\]:[^+)]*\)$", status, re.M)
    assert match, status
    return int(match.group(1))


def test_two_users_jobs_get_their_own_numa_local_gpus_mapped_while_they_run(hooked: Hooked) -> None:
    node = load_node(str(hooked.bundle))
    by_uuid = {g.uuid: g for g in node.gpus}
    script = JOB.format(out=hooked.out)
    jobs = [hooked.cluster.qsub(["-l", "select=1:ncpus=4:ngpus=2"], script) for _ in range(2)]
    reports = {j: _job_report(hooked, j) for j in jobs}
    seen: set[str] = set()
    for jobid, report in reports.items():
        uuids = report["CVD"].split(",")
        assert len(uuids) == 2 and all(u.startswith("GPU-") for u in uuids), report
        assert report["ORDER"] == "PCI_BUS_ID"
        # NUMA-local: the GPUs are the NUMA node's whose vnode PBS gave the chunk
        numa = _exec_vnode_numa(hooked.cluster.job(jobid))
        assert {by_uuid[u].numa_node for u in uuids} == {numa}
        # the map names them while the job runs, and no other job has them
        jmap = json.loads((hooked.jobs_dir / f"{jobid}.json").read_text())
        assert [g["uuid"] for g in jmap["gpus"]] == uuids and jmap["user"] == hooked.cluster.user
        assert not seen & set(uuids)
        seen |= set(uuids)
        if hooked.cgroup is not None:  # confined to its GPUs: the others are EPERM
            mine = {by_uuid[u].device_file for u in uuids}
            for gpu in node.gpus:
                what = report[gpu.device_file]
                if gpu.device_file in mine:
                    assert what != "Operation not permitted", report  # ENXIO: a fake device, no driver
                else:
                    assert what == "Operation not permitted", report
    for jobid in jobs:
        (hooked.out / f"release-{jobid}").touch()
    for jobid in jobs:
        status = hooked.cluster.wait(jobid)
        assert re.search(r"^\s*Exit_status = 0$", status, re.M), status
        assert not (hooked.jobs_dir / f"{jobid}.json").exists()
        summary = json.loads((hooked.summaries / f"{jobid}-summary.json").read_text())
        assert summary["scheduler"] == "pbs" and [g["uuid"] for g in summary["gpus"]] == \
            reports[jobid]["CVD"].split(",")


PICK_JOB = """\
out={out}/$PBS_JOBID
echo "CVD=$CUDA_VISIBLE_DEVICES" > $out.tmp
{python} -I -c 'import sys; from gpuslurm.cli.fast import main; sys.argv[0] = "gpuslurm"; sys.exit(main())' \\
    pick 1 --from {bundle} --format json > $out.json 2>> $out.tmp
echo "RC=$?" >> $out.tmp
mv $out.tmp $out
"""


def test_pick_inside_a_pbs_job_keeps_to_the_gpus_the_hook_gave_it(hooked: Hooked) -> None:
    """``gpuslurm pick`` run by the user inside a PBS job chooses among the job's own GPUs (those
    execjob_launch named), never another of the node's."""
    root = Path(tempfile.mkdtemp(prefix="gpuslurm-pbs-pick-"))
    root.chmod(0o755)
    try:
        script = PICK_JOB.format(out=hooked.out, python=users_python(root), bundle=BUNDLE)
        jobid = hooked.cluster.qsub(["-l", "select=1:ncpus=2:ngpus=2"], script)
        report = _job_report(hooked, jobid)
        assert report["RC"] == "0", (report, hooked.cluster.job(jobid))
        mine = report["CVD"].split(",")
        [chosen] = json.loads((hooked.out / f"{jobid}.json").read_text())["gpus"]
        assert len(mine) == 2 and chosen["uuid"] in mine, (chosen, mine)
        hooked.cluster.wait(jobid)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def test_a_gpu_fault_takes_its_vnode_offline_and_the_job_does_not_run_there(hooked: Hooked) -> None:
    node = load_node(str(hooked.bundle))
    bad = next(g for g in sorted(node.gpus, key=lambda g: g.index) if g.numa_node == 0)
    health = hooked.bundle / "health.json"
    health.write_text(json.dumps({bad.uuid: {"xid": [79]}}))
    vnode = f"{HOST}[0]"
    try:
        pinned = hooked.cluster.qsub(["-l", f"select=1:vnode={vnode}:ncpus=1:ngpus=1"], "true\n")
        deadline = time.monotonic() + 60
        while hooked.vnodes()[vnode]["state"] != "offline":
            assert time.monotonic() < deadline, hooked.vnodes()[vnode]
            time.sleep(0.5)
        comment = hooked.vnodes()[vnode]["comment"]
        assert bad.uuid in comment and bad.device_file in comment and "Xid 79" in comment, comment
        time.sleep(3)  # a scheduling cycle or two: the job must not have run on the offline vnode
        assert hooked.state(pinned) in ("Q", "H"), hooked.cluster.job(pinned)
        assert "Exit_status" not in hooked.cluster.job(pinned)
        assert "execjob_begin request rejected by 'gpuslurm'" in hooked.mom_log()
        # the other NUMA vnode keeps running jobs
        other = hooked.cluster.qsub(["-l", "select=1:ncpus=1:ngpus=1"], "echo $CUDA_VISIBLE_DEVICES\n")
        status = hooked.cluster.wait(other)
        assert _exec_vnode_numa(status) == 1 and re.search(r"^\s*Exit_status = 0$", status, re.M), status
        hooked.cluster.run(str(PREFIX / "bin" / "qdel"), "-W", "force", pinned, check=False)
    finally:
        health.unlink(missing_ok=True)
        _online(hooked.cluster, vnode)


def test_gpuslurm_failing_refuses_begin_but_never_an_end(hooked: Hooked) -> None:
    health = hooked.bundle / "health.json"
    script = JOB.format(out=hooked.out)
    # a job already running when health.json breaks: its end still cleans up
    running = hooked.cluster.qsub(["-l", "select=1:ncpus=1:ngpus=1"], script)
    _job_report(hooked, running)
    health.write_text("{not json")
    try:
        (hooked.out / f"release-{running}").touch()
        status = hooked.cluster.wait(running)
        assert re.search(r"^\s*Exit_status = 0$", status, re.M), status
        assert not (hooked.jobs_dir / f"{running}.json").exists()
        # a new job cannot start while gpuslurm cannot check its GPUs: each begin is refused
        refused = hooked.cluster.qsub(["-l", "select=1:ncpus=1:ngpus=1"], "true\n")
        deadline = time.monotonic() + 60
        while not re.search(r"gpuslurm execjob_begin: gpuslurm failed \(exit 2\): gpuslurm pbs execjob_begin "
                            rf"job {re.escape(refused)}: .*health\.json", hooked.mom_log()):
            assert time.monotonic() < deadline, hooked.mom_log()[-3000:]
            time.sleep(0.5)
        assert "Exit_status" not in hooked.cluster.job(refused)
        assert not (hooked.jobs_dir / f"{refused}.json").exists()
    finally:
        health.unlink(missing_ok=True)
    # mended: PBS runs it
    hooked.cluster.run(str(PREFIX / "bin" / "qrls"), refused, check=False)
    status = hooked.cluster.wait(refused, timeout=120)
    assert re.search(r"^\s*Exit_status = 0$", status, re.M), status
