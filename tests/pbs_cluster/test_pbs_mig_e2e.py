"""MIG instances as PBS candidates in the real OpenPBS test cluster, as the real user ``gpuspbs1``.

The hook (the ``hooked`` fixture of test_pbs_hooks_e2e, this module's own instance) is installed
again replaying the built-in ``a100-mig`` bundle (GPU index 0, minor 1, on NUMA node 3 in MIG mode
with four instances; GPU index 1, minor 0, on NUMA node 7 whole), ``nmigs`` is added to
sched_config's resources, and pbs_mom restarted: exechost_startup publishes ``nmigs`` on the NUMA
vnodes. A job asking for ``nmigs=1`` gets one MIG instance of its vnode, named by MIG UUID in
``CUDA_VISIBLE_DEVICES`` and the map, confined to the instance's parent GPU device. The fake
devices are the session cluster's ``/dev/nvidia0..7``; no ``nvidia-caps`` driver is loaded here, so
the capability devices are not part of the check (isolate tests cover their rules).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import time
from collections.abc import Iterator

import pytest
from tests.helpers.pbs_helpers import (
    QMGR,
    Hooked,
    _job_report,
    _restart_mom,
    _wait_vnodes,
)

from gpuslurm.gres.pbs_vnodes import plan_vnodes
from gpuslurm.hw.source import bundle_path, load_node

pytestmark = pytest.mark.pbs

HOST = "pbshost"


def _mom_has_hook_config(site: Hooked, timeout: float = 90) -> None:
    """Wait until pbs_mom holds the hook config naming ``site.bundle``: the server copies it to the
    mom some time after ``import hook`` (exechost_startup runs with the mom's copy)."""
    hooks = site.cluster.state_dir / "home" / "mom_priv" / "hooks"
    deadline = time.monotonic() + timeout
    while not any(str(site.bundle) in p.read_text(errors="replace") for p in hooks.glob("gpuslurm.CF")):
        if time.monotonic() > deadline:
            raise TimeoutError(f"pbs_mom's copy of the gpuslurm hook config does not name {site.bundle}")
        time.sleep(0.5)


def _hup_sched(site: Hooked) -> None:
    lock = site.cluster.state_dir / "home" / "sched_priv" / "sched.lock"
    os.kill(int(lock.read_text().split()[0]), signal.SIGHUP)


@pytest.fixture(scope="module")
def mig_site(hooked: Hooked) -> Iterator[Hooked]:
    source = bundle_path("a100-mig")
    assert source is not None
    bundle = hooked.cluster.state_dir / "bundle-mig"
    shutil.copytree(source, bundle)
    site = Hooked(hooked.cluster, bundle, hooked.config, hooked.cgroup)
    sched_config = hooked.cluster.state_dir / "home" / "sched_priv" / "sched_config"
    original = sched_config.read_text()
    numa = [f"{HOST}[{v.numa_node}]" for v in plan_vnodes(load_node(str(bundle)))]
    try:
        installed = site.install()
        assert installed.returncode == 0, installed.stderr
        _mom_has_hook_config(site)
        wanted = re.sub(r'^resources: "(.*)"$', r'resources: "\1, nmigs"', original, flags=re.M)
        sched_config.write_text(wanted)
        _hup_sched(site)
        _restart_mom(hooked.cluster)
        nodes = _wait_vnodes(hooked.cluster, numa)
        assert nodes[f"{HOST}[3]"]["resources_available.nmigs"] == "4", nodes[f"{HOST}[3]"]
        yield site
    finally:
        sched_config.write_text(original)
        _hup_sched(site)
        hooked.install()  # the session bundle again, published by a fresh pbs_mom
        _mom_has_hook_config(hooked)
        _restart_mom(hooked.cluster)
        session = [f"{HOST}[{v.numa_node}]" for v in plan_vnodes(load_node(str(hooked.bundle)))]
        _wait_vnodes(hooked.cluster, session)
        for name in set(numa) - set(session):  # a100-mig's alone: gone from the server
            hooked.cluster.run(QMGR, "-c", f"delete node {name}", check=False)
        shutil.rmtree(bundle, ignore_errors=True)


JOB = """\
out={out}/$PBS_JOBID
echo "CVD=$CUDA_VISIBLE_DEVICES" > $out.tmp
for dev in {devices}; do
    err=$( (exec 3<"$dev") 2>&1 ) && echo "$dev opened" >> $out.tmp || echo "$dev ${{err##*: }}" >> $out.tmp
done
mv $out.tmp $out
while [ ! -e {out}/release-$PBS_JOBID ]; do sleep 0.2; done
"""


def test_a_job_asking_for_one_mig_instance_gets_one_mig_uuid_and_is_confined(mig_site: Hooked) -> None:
    site = mig_site
    node = load_node(str(site.bundle))
    parent = next(g for g in node.gpus if g.mig_mode)
    whole = next(g for g in node.gpus if not g.mig_mode)
    instances = {m.uuid for m in parent.mig_devices}
    script = JOB.format(out=site.out, devices=" ".join(g.device_file for g in node.gpus))
    jobs = [site.cluster.qsub(["-l", "select=1:ncpus=1:nmigs=1"], script) for _ in range(2)]
    try:
        reports = {j: _job_report(site, j) for j in jobs}
        seen = set()
        for jobid, report in reports.items():
            status = site.cluster.job(jobid)
            assert re.search(r"exec_vnode = \(pbshost\[3\]:ncpus=1:nmigs=1\)", status), status
            [uuid] = report["CVD"].split(",")
            assert uuid in instances and uuid not in seen, (report, instances)
            seen.add(uuid)
            jmap = json.loads((site.jobs_dir / f"{jobid}.json").read_text())
            assert [(g["uuid"], g["parent_uuid"]) for g in jmap["gpus"]] == [(uuid, parent.uuid)]
            if site.cgroup is not None:  # the parent GPU's device opens (ENXIO: no driver), the other not
                assert report[parent.device_file] != "Operation not permitted", report
                assert report[whole.device_file] == "Operation not permitted", report
    finally:
        for jobid in jobs:
            (site.out / f"release-{jobid}").touch()
    for jobid in jobs:
        status = site.cluster.wait(jobid)
        assert re.search(r"^\s*Exit_status = 0$", status, re.M), status
        assert not (site.jobs_dir / f"{jobid}.json").exists()
