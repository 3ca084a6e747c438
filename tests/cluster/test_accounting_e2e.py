"""Accounting in the real test cluster: slurmdbd with a private MariaDB (``up --with-slurmdbd``).

slurmctld 22.05 refuses ``scontrol update ... AdminComment=`` once a job has finished, and the
epilog runs after that; with slurmdbd the epilog writes its summary into the job's accounting
record instead (``sacctmgr modify job``), where ``sacct`` shows it. The fair-share tree that
``sshare`` reads is made of the accounts and users added with ``sacctmgr``.

The hooks are installed as in test_hooks_e2e.py: the executables ``gpuslurm install --config
--replay`` writes (cluster_fixture.install_hooks), named by Prolog=/Epilog= lines added to the
cluster's slurm.conf for this module, undone afterwards.
"""

from __future__ import annotations

import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from tests.helpers import slurm_roots
from tests.helpers.cluster_fixture import install_hooks, slurm_accounting_cluster  # noqa: F401 - module fixture
from tests.helpers.slurm_helpers import SCONTROL, conf_with, hook_lines, hooks_paths, hooks_root

from gpuslurm.hooks.epilog import admin_comment
from gpuslurm.slurm.scontrol import own_admin_comment

if TYPE_CHECKING:
    from tests.helpers.cluster_fixture import SlurmCluster

pytestmark = pytest.mark.slurm

SACCT = "/usr/bin/sacct"
SSHARE = "/usr/bin/sshare"


def _run(cluster: SlurmCluster, *argv: str) -> str:
    return subprocess.run(list(argv), env=cluster.env, capture_output=True, text=True, check=True,
                          timeout=30).stdout


def _wait_idle(cluster: SlurmCluster, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    out = ""
    while time.monotonic() < deadline:
        out = _run(cluster, "/usr/bin/sinfo", "-h", "-N", "-o", "%T")
        if out.strip() == "idle":
            return
        time.sleep(0.3)
    raise TimeoutError(f"node is {out.strip()!r}, not idle\n{cluster.log_tail()}")


class Hooked:
    def __init__(self, cluster: SlurmCluster, root: Path) -> None:
        self.cluster = cluster
        self.root = root

    def log(self) -> str:
        """slurmd's log: the installed hooks' stderr goes to slurmd, which logs a failing one's."""
        path = self.cluster.log_dir / "slurmd.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def summary(self, jobid: int) -> Path:
        return self.root / "state" / "jobs" / f"{jobid}-summary.json"

    def diagnostics(self) -> str:
        dbd = self.cluster.log_dir / "slurmdbd.log"
        tail = "\n".join(dbd.read_text(errors="replace").splitlines()[-20:]) if dbd.exists() else ""
        return f"{self.log()}\n{self.cluster.log_tail()}\n--- {dbd}\n{tail}"


@pytest.fixture(scope="module")
def hooked(slurm_accounting_cluster: SlurmCluster) -> Iterator[Hooked]:  # noqa: F811
    cluster = slurm_accounting_cluster
    root, bundle = hooks_root("gpuslurm-acct-")
    config = root / "gpuslurm.toml"
    config.write_text(hooks_paths(root, cluster) + 'sacctmgr = "/usr/bin/sacctmgr"\n'
                      '[hooks]\ncommand_timeout_s = 20\n[epilog]\nadmin_comment = true\n')
    prefix = install_hooks(root, config, bundle)
    original = cluster.conf.read_text()
    cluster.conf.write_text(conf_with(original, hook_lines(prefix, task_prolog=False)))
    try:
        _run(cluster, SCONTROL, "reconfigure")
        _wait_idle(cluster)
        yield Hooked(cluster, root)
    finally:
        cluster.conf.write_text(original)
        _run(cluster, SCONTROL, "reconfigure")
        shutil.rmtree(root, ignore_errors=True)


def _sacct_admin_comment(cluster: SlurmCluster, jobid: int, timeout: float = 30) -> str:
    """The job's AdminComment in slurmdbd, once it has one (slurmctld sends records asynchronously)."""
    deadline = time.monotonic() + timeout
    value = ""
    while time.monotonic() < deadline:
        value = _run(cluster, SACCT, "-j", str(jobid), "-X", "-n", "-P", "-o", "AdminComment").strip()
        if value:
            break
        time.sleep(0.5)
    return value


def test_epilog_summary_lands_in_sacct_after_the_job_ended(hooked: Hooked) -> None:
    cluster = hooked.cluster
    jobid = cluster.sbatch(["--gres=gpu:2"], "echo ran\n")
    state = cluster.wait(jobid, timeout=60)
    assert state == "COMPLETED", hooked.diagnostics()
    deadline = time.monotonic() + 30
    while not hooked.summary(jobid).exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert hooked.summary(jobid).exists(), hooked.diagnostics()
    # no monitor ran: the summary says so; 22.05's slurmdbd stores the value lowercased, 24.11's
    # and 26.05's as written (docs/compatibility.md)
    expected = own_admin_comment(admin_comment(2, [], 0))
    assert expected == "gpuslurm/1: 2 GPU, no monitor data"
    stored = expected.lower() if slurm_roots.selected() is None else expected
    assert _sacct_admin_comment(cluster, jobid) == stored, hooked.diagnostics()
    # (the epilog's info line saying so goes to its stderr, which slurmd does not log for a
    # hook that succeeded: the sacct record above is what shows it)
    # slurmctld itself refused the update: its copy of the finished job has none (22.05 then
    # leaves the field out of `scontrol show job`)
    shown = _run(cluster, SCONTROL, "show", "job", str(jobid))
    assert f"JobId={jobid} " in shown and "AdminComment=" not in shown, shown


def test_accounts_and_users_added_with_sacctmgr_show_in_sshare(slurm_accounting_cluster: SlurmCluster,  # noqa: F811
                                                              ) -> None:
    cluster = slurm_accounting_cluster
    cluster.sacctmgr("add", "account", "gputeam", "Description=gpu team", "Organization=test")
    try:
        cluster.sacctmgr("add", "user", "nobody", "account=gputeam", "fairshare=5")
        out = _run(cluster, SSHARE, "-P", "-a", "-o", "Account,User,RawShares,NormShares")
        rows = [line.split("|") for line in out.splitlines()]
        assert rows[0] == ["Account", "User", "RawShares", "NormShares"], out
        # -P keeps the tree's indentation in the Account column
        assert ["gputeam", "nobody", "5"] in [[a.strip(), u, r] for a, u, r, _n in rows[1:]], out
        assert ["root", "root", "1"] in [[a.strip(), u, r] for a, u, r, _n in rows[1:]], out
    finally:
        cluster.sacctmgr("delete", "user", "nobody", "account=gputeam")
        cluster.sacctmgr("delete", "account", "gputeam")
