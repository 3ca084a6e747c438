"""gpuslurm's own device isolation in the real test cluster, with Slurm's ConstrainDevices off.

For this module only, the cluster's cgroup.conf says ``ConstrainDevices=no`` (slurmd restarted
to read it) and slurm.conf gains Prolog=/Epilog=/TaskProlog= naming the executables ``gpuslurm
install --config --replay --python`` writes, with an interpreter the job's user can run (the task
prolog runs as the user, as on a real node: ``cluster_fixture.users_python``). Jobs run as
nobody, so the task prolog's move into the cgroup uses the user's own rights, as in production.
Both files are restored and slurmd restarted afterwards.
"""

from __future__ import annotations

import os
import pwd
import re
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from tests.helpers import slurm_roots
from tests.helpers.cluster_fixture import install_hooks, users_python
from tests.helpers.slurm_helpers import restart_slurmd

from gpuslurm.hw.source import BUILTIN_DIR

if TYPE_CHECKING:
    from tests.helpers.cluster_fixture import SlurmCluster

pytestmark = pytest.mark.slurm

SCONTROL = "/usr/bin/scontrol"
PYTHON = "/usr/bin/python3"
GPUS = 8
PROBE = f"""
grep devices /proc/self/cgroup | sed 's/^/CGROUP /'
echo "JOB_GPUS=$SLURM_JOB_GPUS"
{PYTHON} - <<'EOF'
import errno
for path in [f"/dev/nvidia{{i}}" for i in range({GPUS})] + ["/dev/nvidiactl", "/dev/null"]:
    try:
        open(path, "rb").close()
        print("DEV", path, "OK")
    except OSError as exc:
        print("DEV", path, errno.errorcode.get(exc.errno, exc.errno))
EOF
"""


@dataclass
class Site:
    cluster: SlurmCluster
    root: Path

    def configure(self, devices: str) -> None:
        cgroup_conf = self.cluster.conf.parent / "cgroup.conf"
        (self.root / "gpuslurm.toml").write_text(
            f'[paths]\nrun_dir = "{self.root / "run"}"\nstate_dir = "{self.root / "state"}"\n'
            f'scontrol = "{SCONTROL}"\nslurm_cgroup_conf = "{cgroup_conf}"\n'
            f'[cgroup]\ndevices = "{devices}"\n[hooks]\ncommand_timeout_s = 20\n')

    def run_probe(self, gres: str) -> tuple[int, str]:
        out = self.root / "out"
        # the uid, not the name: 26.05's sbatch refuses --uid=nobody ("Invalid --uid specification")
        jobid = self.cluster.sbatch([f"--gres={gres}", f"--uid={pwd.getpwnam('nobody').pw_uid}", "--chdir=/",
                                     f"--output={out}/slurm-%j.out"], PROBE)
        state = self.cluster.wait(jobid, timeout=60)
        path = out / f"slurm-{jobid}.out"
        text = path.read_text() if path.exists() else ""
        assert state == "COMPLETED", f"{state}\n{text}\n{self.hook_log()}\n{self.cluster.log_tail()}"
        return jobid, text

    def hook_log(self) -> str:
        """What the hooks wrote to stderr, as slurmd logged it."""
        path = self.cluster.log_dir / "slurmd.log"
        return path.read_text(errors="replace") if path.exists() else ""


@pytest.fixture(scope="module")
def site(slurm_cluster: SlurmCluster) -> Iterator[Site]:
    root = Path(tempfile.mkdtemp(prefix="gpuslurm-isolation-"))
    root.chmod(0o755)
    python = users_python(root)
    if not _runs_as_nobody(python):
        why = f"the job's user (nobody) cannot import gpuslurm with {python}: is the checkout readable?"
        if os.environ.get("GPUSLURM_REQUIRE_SLURM"):  # CI: a checkout nobody can read is the defect
            pytest.fail(why)
        pytest.skip(why)
    (root / "out").mkdir()
    (root / "out").chmod(0o1777)  # the job, as nobody, writes its output there
    shutil.copytree(BUILTIN_DIR / "dgx-h100", root / "bundle")
    s = Site(slurm_cluster, root)
    s.configure("auto")
    prefix = install_hooks(root, root / "gpuslurm.toml", root / "bundle", python)
    cgroup_conf = slurm_cluster.conf.parent / "cgroup.conf"
    original_conf, original_cgroup = slurm_cluster.conf.read_text(), cgroup_conf.read_text()
    lines = (f"Prolog={prefix}/gpuslurm-prolog\nEpilog={prefix}/gpuslurm-epilog\n"
             f"TaskProlog={prefix}/gpuslurm-task-prolog\n")
    slurm_cluster.conf.write_text(original_conf.replace("\nNodeName=", f"\n{lines}NodeName=", 1))
    cgroup_conf.write_text(re.sub(r"(?m)^ConstrainDevices=.*$", "ConstrainDevices=no", original_cgroup))
    try:
        restart_slurmd(slurm_cluster)
        yield s
    finally:
        slurm_cluster.conf.write_text(original_conf)
        cgroup_conf.write_text(original_cgroup)
        restart_slurmd(slurm_cluster)
        if not os.environ.get("GPUSLURM_KEEP_CLUSTER"):
            shutil.rmtree(root, ignore_errors=True)


def _devices(text: str) -> dict[str, str]:
    return dict(re.findall(r"^DEV (\S+) (\S+)$", text, re.M))


def test_gpuslurm_limits_a_four_gpu_job_to_its_devices(site: Site) -> None:
    site.configure("auto")  # cgroup.conf says ConstrainDevices=no: gpuslurm is the isolation
    jobid, out = site.run_probe("gpu:4")
    found = re.search(r"^JOB_GPUS=(.*)$", out, re.M)
    assert found, out
    mine = {int(i) for i in found.group(1).split(",")}
    assert len(mine) == 4
    devices = _devices(out)
    # dgx-h100: minor = index. ENXIO: let through to a device with no driver; EPERM: denied.
    assert {f"/dev/nvidia{i}": devices.get(f"/dev/nvidia{i}") for i in range(GPUS)} == {
        f"/dev/nvidia{i}": "ENXIO" if i in mine else "EPERM" for i in range(GPUS)}, out
    assert devices["/dev/nvidiactl"] == "ENXIO" and devices["/dev/null"] == "OK"
    if slurm_roots.runs_cgroup_v2():
        return  # the v2 layout: tests/cluster/test_cgroup_v2_e2e.py
    assert re.search(rf"^CGROUP \d+:devices:/gpuslurm/job_{jobid}$", out, re.M), out
    assert not Path(f"/sys/fs/cgroup/devices/gpuslurm/job_{jobid}").exists()  # the epilog removed it


def test_without_gpuslurm_isolation_every_gpu_opens(site: Site) -> None:
    site.configure("never")  # the negative control: ConstrainDevices=no and nothing else
    _, out = site.run_probe("gpu:4")
    devices = _devices(out)
    assert {devices.get(f"/dev/nvidia{i}") for i in range(GPUS)} == {"ENXIO"}, out
    if not slurm_roots.runs_cgroup_v2():
        assert re.search(r"^CGROUP \d+:devices:/$", out, re.M), out


def _runs_as_nobody(python: str) -> bool:
    """Whether nobody can start ``python`` and import gpuslurm with it (as the task prolog does)."""
    done = subprocess.run(slurm_roots.on_node(["/usr/sbin/runuser", "-u", "nobody", "--", python, "-I", "-c",
                                               "import gpuslurm.slurm.entry"]),
                          capture_output=True, timeout=60, check=False)
    return done.returncode == 0
