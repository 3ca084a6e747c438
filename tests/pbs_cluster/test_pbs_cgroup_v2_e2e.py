"""gpuslurm's PBS hook confining jobs on cgroup v2, through the real pbs_mom, as a real user.

The module fixture installs the hook as tests/pbs_cluster/test_pbs_hooks_e2e.py does (with
pbs_helpers.hooks_installed), ``[paths] cgroup_root`` on a cgroup2 mount: the host's one hierarchy
mounted again where pbs_mom's namespace sees it (``ip netns exec`` mounts its own /sys, without the
host's /sys/fs/cgroup). execjob_begin makes ``gpuslurm.pbs/job_<id>`` with the BPF device program,
execjob_launch moves the job's shell into it, the job (as ``gpuspbs1``) opens every GPU and tries
to leave, execjob_end removes the cgroup.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from tests.helpers.pbs_fixture import PREFIX, STATE_PARENT, PbsCluster
from tests.helpers.pbs_helpers import Hooked, _job_report, copy_bundle, hooks_installed

from gpuslurm.errors import HardwareError
from gpuslurm.hw.source import load_node
from gpuslurm.isolate import bpf
from gpuslurm.isolate.cgroup_v2 import V2_PBS_PARENT

pytestmark = pytest.mark.pbs

UNIFIED = Path("/sys/fs/cgroup/unified")


def _skip_reason() -> str | None:
    if os.geteuid() != 0:
        return "needs root"
    if not any((p / "cgroup.controllers").exists() for p in (UNIFIED, Path("/sys/fs/cgroup"))):
        return "no cgroup2 hierarchy on this host"
    try:
        os.close(bpf.load_device_program(bpf.deny_program([])))
    except HardwareError as exc:
        return f"bpf(2) is not permitted here: {exc}"
    return None


@pytest.fixture(scope="module")
def hooked_v2(pbs_cluster: PbsCluster) -> Iterator[Hooked]:
    if (reason := _skip_reason()) is not None:
        pytest.skip(reason)
    state = pbs_cluster.state_dir
    bundle = state / "bundle-v2"
    copy_bundle(bundle)
    cgroup = Path(tempfile.mkdtemp(prefix="gpuslurm-pbs-cgroup2-", dir=STATE_PARENT))
    subprocess.run(["mount", "-t", "cgroup2", "gpuslurm-pbs-test", str(cgroup)], check=True, timeout=30)
    config = state / "gpuslurm-v2.toml"
    config.write_text(f'[paths]\nrun_dir = "{state}/gs-run"\nstate_dir = "{state}/gs-state"\n'
                      f'cgroup_root = "{cgroup}"\n[cgroup]\ndevices = "always"\n')
    config.chmod(0o644)
    existed = (cgroup / V2_PBS_PARENT).exists()
    try:
        with hooks_installed(Hooked(pbs_cluster, bundle, config, cgroup)) as hooked:
            yield hooked
    finally:
        if not existed:
            try:
                (cgroup / V2_PBS_PARENT).rmdir()
            except OSError:
                pass
        subprocess.run(["umount", str(cgroup)], check=False, timeout=30)
        shutil.rmtree(cgroup, ignore_errors=True)


JOB = """\
out={out}/$PBS_JOBID
echo "CVD=$CUDA_VISIBLE_DEVICES" > $out.tmp
echo "CGROUP=$(grep '^0::' /proc/self/cgroup)" >> $out.tmp
for dev in /dev/nvidia[0-9]*; do
    err=$( (exec 3<"$dev") 2>&1 ) && echo "$dev opened" >> $out.tmp || echo "$dev ${{err##*: }}" >> $out.tmp
done
for target in {cgroup}/cgroup.procs {cgroup}/{parent}/cgroup.procs; do
    err=$( (echo $$ > "$target") 2>&1 ) && echo "MOVE=left via $target" >> $out.tmp \\
        || echo "MOVE=${{err##*: }}" >> $out.tmp
done
echo "AFTER=$(grep '^0::' /proc/self/cgroup)" >> $out.tmp
mv $out.tmp $out
while [ ! -e {out}/release-$PBS_JOBID ]; do sleep 0.2; done
"""


def test_a_pbs_job_on_cgroup_v2_opens_only_its_gpus_and_cannot_leave(hooked_v2: Hooked) -> None:
    assert hooked_v2.cgroup is not None
    node = load_node(str(hooked_v2.bundle))
    by_uuid = {g.uuid: g for g in node.gpus}
    script = JOB.format(out=hooked_v2.out, cgroup=hooked_v2.cgroup, parent=V2_PBS_PARENT)
    jobid = hooked_v2.cluster.qsub(["-l", "select=1:ncpus=2:ngpus=2"], script)
    text = ""
    try:
        report = _job_report(hooked_v2, jobid)
        text = (hooked_v2.out / jobid).read_text()
        uuids = report["CVD"].split(",")
        assert len(uuids) == 2, report
        assert report["CGROUP"] == f"0::/{V2_PBS_PARENT}/job_{jobid}", report
        mine = {by_uuid[u].device_file for u in uuids}
        for gpu in node.gpus:
            what = report[gpu.device_file]
            if gpu.device_file in mine:
                assert what != "Operation not permitted", report  # ENXIO: a fake device, no driver
            else:
                assert what == "Operation not permitted", report
        assert re.findall(r"^MOVE=(.*)$", text, re.M) == ["Permission denied"] * 2, text
        assert report["AFTER"] == report["CGROUP"], report
        assert (hooked_v2.cgroup / V2_PBS_PARENT / f"job_{jobid}").is_dir()
    finally:
        (hooked_v2.out / f"release-{jobid}").touch()
    status = hooked_v2.cluster.wait(jobid)
    assert re.search(r"^\s*Exit_status = 0$", status, re.M), (status, text)
    assert not (hooked_v2.cgroup / V2_PBS_PARENT / f"job_{jobid}").exists()


ATTACH_JOB = """\
{attach} -j $PBS_JOBID -p {victim} > {out}/$PBS_JOBID.attach 2>&1
echo "rc=$?" >> {out}/$PBS_JOBID.attach
"""


def test_pbs_attach_of_a_root_process_neither_moves_nor_kills_it(hooked_v2: Hooked) -> None:
    """The job's user (``gpuspbs1``) runs ``pbs_attach -p`` with a root daemon's pid: pbs_mom runs
    execjob_attach before it checks the process's owner, and gpuslurm moved the daemon into the
    job's cgroup, whose end killed it. Now the attach is refused and the daemon lives on."""
    assert hooked_v2.cgroup is not None
    victim = subprocess.Popen(["/bin/sleep", "300"])  # root's
    try:
        before = Path(f"/proc/{victim.pid}/cgroup").read_text()
        script = ATTACH_JOB.format(attach=PREFIX / "bin" / "pbs_attach", victim=victim.pid,
                                   out=hooked_v2.out)
        jobid = hooked_v2.cluster.qsub(["-l", "select=1:ncpus=1:ngpus=1"], script)
        hooked_v2.cluster.wait(jobid)
        said = (hooked_v2.out / f"{jobid}.attach").read_text()
        assert "rc=0" not in said, said
        assert victim.poll() is None, said
        assert Path(f"/proc/{victim.pid}/cgroup").read_text() == before, said
    finally:
        victim.kill()
        victim.wait()
