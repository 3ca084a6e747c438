"""One GPU out of service in the real PBS (docs/health.md, docs/pbs.md): its vnode publishes one GPU
fewer, execjob_begin never gives it, running jobs are untouched, ``gpu online`` restores it.

The jobs are the test user's (gpuspbs1), the commands root's, as an admin runs them on the node.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from tests.helpers.pbs_fixture import PBS_DIR, PREFIX
from tests.helpers.pbs_helpers import HOST, JOB, Hooked, _job_report

from gpuslurm.hw.source import load_node

pytestmark = pytest.mark.pbs

QDEL = str(PREFIX / "bin" / "qdel")
VNODE = f"{HOST}[0]"


@pytest.fixture
def admin(hooked: Hooked) -> Iterator[Path]:
    """gpuslurm's config for the admin's commands: the hook's state, PBS as the scheduler."""
    config = hooked.cluster.state_dir / "gpuslurm-admin.toml"
    config.write_text(hooked.config.read_text() + '\n[scheduler]\nkind = "pbs"\n'
                      '[health.xid]\naction = "gpu_out"\n')
    yield config
    record = hooked.cluster.state_dir / "gs-state" / "out-of-service.json"
    record.unlink(missing_ok=True)
    (hooked.bundle / "health.json").unlink(missing_ok=True)
    hooked.cluster.run(str(PREFIX / "bin" / "qmgr"), "-c", f"set node {VNODE} resources_available.ngpus = 4",
                       check=False)
    hooked.cluster.run(str(PREFIX / "bin" / "qmgr"), "-c", f"unset node {VNODE} comment", check=False)


def gpuslurm(hooked: Hooked, config: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """``gpuslurm ARGS`` as root inside the cluster's namespace, on the hook's bundle."""
    env = dict(hooked.cluster.env, GPUSLURM_CONFIG=str(config))
    argv = ["/bin/bash", str(PBS_DIR / "cluster.sh"), "exec", sys.executable, "-m", "gpuslurm", *args,
            "--from", str(hooked.bundle)]
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120, check=False)


def _vnode(hooked: Hooked) -> dict[str, str]:
    return hooked.vnodes()[VNODE]


def _index(hooked: Hooked, jobid: str) -> int:
    node = load_node(str(hooked.bundle))
    (uuid,) = _job_report(hooked, jobid)["CVD"].split(",")
    return next(g.index for g in node.gpus if g.uuid == uuid)


def test_gpu_offline_lowers_the_vnodes_ngpus_and_no_new_job_gets_it_until_online(
        hooked: Hooked, admin: Path) -> None:
    node = load_node(str(hooked.bundle))
    gpu3 = next(g for g in node.gpus if g.index == 3)
    assert gpu3.numa_node == 0
    pinned = ["-l", f"select=1:vnode={VNODE}:ncpus=1:ngpus=1"]
    script = JOB.format(out=hooked.out)
    jobs = [hooked.cluster.qsub(pinned, script) for _ in range(3)]
    try:
        held = {j: _index(hooked, j) for j in jobs}
        assert sorted(held.values()) == [0, 1, 2], held  # GPU 3 is the one left free
        done = gpuslurm(hooked, admin, "gpu", "offline", "index:3", "--node-name", HOST,
                        "--reason", 'fan "failed"; #1')  # qmgr would end the value, the command
        assert done.returncode == 0, done.stderr
        attrs = _vnode(hooked)
        assert attrs["resources_available.ngpus"] == "3", attrs
        assert gpu3.uuid in attrs["comment"] and "fan 'failed'; #1" in attrs["comment"], attrs
        assert attrs["state"] != "offline", attrs
        assert all(hooked.state(j) == "R" for j in jobs)  # the running jobs are not disturbed
        listed = json.loads(gpuslurm(hooked, admin, "gpu", "list", "--json").stdout)["gpus"]
        assert listed[3]["in_service"] is False

        # a new job on that vnode: PBS counts 3 GPUs, all assigned, so it waits...
        waiting = hooked.cluster.qsub(pinned, script)
        jobs.append(waiting)
        time.sleep(3)
        assert hooked.state(waiting) == "Q", hooked.cluster.job(waiting)
        # ...and runs when a GPU is free, on that GPU, never on GPU 3
        (hooked.out / f"release-{jobs[1]}").touch()
        hooked.wait_state(waiting, "R")
        assert _index(hooked, waiting) == held[jobs[1]]
        assert hooked.state(jobs[0]) == "R" and hooked.state(jobs[2]) == "R"

        # again: safe to repeat, nothing changes
        again = gpuslurm(hooked, admin, "gpu", "offline", "index:3", "--node-name", HOST, "--reason", "x")
        assert again.returncode == 0 and "already out of service" in again.stdout, again

        back = gpuslurm(hooked, admin, "gpu", "online", "index:3", "--node-name", HOST)
        assert back.returncode == 0, back.stderr
        attrs = _vnode(hooked)
        assert attrs["resources_available.ngpus"] == "4" and "comment" not in attrs, attrs
        after = hooked.cluster.qsub(pinned, script)
        jobs.append(after)
        assert _index(hooked, after) == 3  # the only free GPU, back in service
    finally:
        for job in jobs:
            (hooked.out / f"release-{job}").touch()
        for job in jobs:
            hooked.cluster.run(QDEL, "-W", "force", job, check=False)


def test_a_fault_with_action_gpu_out_takes_only_that_gpu_out_through_the_same_path(
        hooked: Hooked, admin: Path) -> None:
    node = load_node(str(hooked.bundle))
    gpu3 = next(g for g in node.gpus if g.index == 3)
    (hooked.bundle / "health.json").write_text(json.dumps({gpu3.uuid: {"xid": [79]}}))
    acted = gpuslurm(hooked, admin, "health", "--act", "--node-name", HOST)
    assert acted.returncode == 1, acted  # unhealthy: exit 1, and acted upon
    attrs = _vnode(hooked)
    assert attrs["resources_available.ngpus"] == "3" and "Xid 79" in attrs["comment"], attrs
    assert attrs["state"] != "offline" and hooked.vnodes()[HOST]["state"] != "offline"
    # online re-checks health first: still faulty, refused, nothing changed
    refused = gpuslurm(hooked, admin, "gpu", "online", "index:3", "--node-name", HOST)
    assert refused.returncode != 0 and "still unhealthy" in refused.stderr, refused
    assert _vnode(hooked)["resources_available.ngpus"] == "3"
    (hooked.bundle / "health.json").unlink()
    back = gpuslurm(hooked, admin, "gpu", "online", "index:3", "--node-name", HOST)
    assert back.returncode == 0, back.stderr
    assert _vnode(hooked)["resources_available.ngpus"] == "4"


def test_the_monitor_takes_a_live_faulty_gpu_out_on_pbs(hooked: Hooked, admin: Path) -> None:
    node = load_node(str(hooked.bundle))
    gpu3 = next(g for g in node.gpus if g.index == 3)
    config = hooked.cluster.state_dir / "gpuslurm-monitor.toml"
    config.write_text(admin.read_text() + f'[monitor]\nhealth = true\nnode_name = "{HOST}"\n')
    (hooked.bundle / "health.json").write_text(json.dumps({gpu3.uuid: {"xid": [79]}}))
    cycle = gpuslurm(hooked, config, "monitor", "--once", "--db",
                     str(hooked.cluster.state_dir / "gs-state" / "monitor-test.db"))
    assert cycle.returncode == 0, cycle.stderr
    attrs = _vnode(hooked)
    assert attrs["resources_available.ngpus"] == "3" and gpu3.uuid in attrs["comment"], (attrs, cycle.stderr)
    assert "Xid 79" in attrs["comment"] and hooked.vnodes()[HOST]["state"] != "offline"
    (hooked.bundle / "health.json").unlink()
    back = gpuslurm(hooked, admin, "gpu", "online", "index:3", "--node-name", HOST)
    assert back.returncode == 0, back.stderr
    assert _vnode(hooked)["resources_available.ngpus"] == "4"


def test_a_gpu_out_fault_at_execjob_begin_takes_only_that_gpu_and_the_job_runs_on_another(
        hooked: Hooked, admin: Path) -> None:
    node = load_node(str(hooked.bundle))
    first = next(g for g in sorted(node.gpus, key=lambda g: g.index) if g.numa_node == 0)  # begin's pick
    saved = hooked.config.read_text()
    hooked.config.write_text(saved + '[health.xid]\naction = "gpu_out"\n')
    (hooked.bundle / "health.json").write_text(json.dumps({first.uuid: {"xid": [79]}}))
    jobs: list[str] = []
    try:
        pinned = ["-l", f"select=1:vnode={VNODE}:ncpus=1:ngpus=1"]
        job = hooked.cluster.qsub(pinned, JOB.format(out=hooked.out))
        jobs.append(job)
        assert _job_report(hooked, job)["CVD"] != first.uuid
        attrs = _vnode(hooked)
        assert attrs["state"] != "offline" and attrs["resources_available.ngpus"] == "3", attrs
        listed = json.loads(gpuslurm(hooked, admin, "gpu", "list", "--json").stdout)["gpus"]
        assert [r["uuid"] for r in listed if not r["in_service"]] == [first.uuid]
    finally:
        hooked.config.write_text(saved)
        for j in jobs:
            (hooked.out / f"release-{j}").touch()
            hooked.cluster.run(QDEL, "-W", "force", j, check=False)


def test_a_job_on_the_gpu_taken_out_is_requeued_when_configured_and_runs_on_another(
        hooked: Hooked, admin: Path) -> None:
    config = hooked.cluster.state_dir / "gpuslurm-requeue.toml"
    config.write_text(admin.read_text() + '[gpu_out]\njob_on_gpu = "requeue"\n')
    node = load_node(str(hooked.bundle))
    script = JOB.format(out=hooked.out)
    pinned = ["-l", f"select=1:vnode={VNODE}:ncpus=1:ngpus=1"]
    jobs = [hooked.cluster.qsub(pinned, script) for _ in range(2)]
    try:
        victim, other = jobs
        before = _job_report(hooked, victim)["CVD"]
        kept = _job_report(hooked, other)["CVD"]
        (hooked.out / victim).unlink()
        index = next(g.index for g in node.gpus if g.uuid == before)
        done = gpuslurm(hooked, config, "gpu", "offline", f"index:{index}", "--node-name", HOST,
                        "--reason", "fan failed")
        assert done.returncode == 0, done.stderr
        after = _job_report(hooked, victim)["CVD"]  # its second run
        assert after not in (before, kept), (before, after, kept)
        assert "run_count = 2" in hooked.cluster.job(victim)
        assert hooked.state(other) == "R" and "run_count = 1" in hooked.cluster.job(other)
    finally:
        for job in jobs:
            (hooked.out / f"release-{job}").touch()
            hooked.cluster.run(QDEL, "-W", "force", job, check=False)


QUOTED_REASONS = {
    "a trailing backslash": "controller lost \\",
    "double quotes and a trailing backslash": 'said "bad" \\',
    "single and double quotes": "it's \"fan\" 'failed'",
    "a backslash before a quote, then qmgr syntax": 'a\\"; unset node x #',
}


@pytest.mark.parametrize("name", sorted(QUOTED_REASONS))
def test_a_reason_with_quotes_or_a_trailing_backslash_reaches_the_vnode_comment_through_qmgr(
        hooked: Hooked, admin: Path, name: str) -> None:
    """The reason is the last thing in the double-quoted ``comment = "..."`` qmgr gets: a trailing
    backslash must not swallow the closing quote, nor a quote end the value. The comment arrives
    as written (double quotes as single: ``pbs.gpu_out.clean_value``), and ``online`` clears it."""
    from gpuslurm.pbs.gpu_out import clean_value

    reason = QUOTED_REASONS[name]
    done = gpuslurm(hooked, admin, "gpu", "offline", "index:3", "--node-name", HOST, "--reason", reason)
    assert done.returncode == 0, done.stderr
    attrs = _vnode(hooked)
    assert attrs["resources_available.ngpus"] == "3", attrs
    assert attrs["comment"].endswith(f"): {clean_value(reason)}"), (attrs["comment"], reason)
    assert "x" not in hooked.vnodes(), "qmgr ran a second command"
    back = gpuslurm(hooked, admin, "gpu", "online", "index:3", "--node-name", HOST)
    assert back.returncode == 0, back.stderr
    attrs = _vnode(hooked)
    assert attrs["resources_available.ngpus"] == "4" and "comment" not in attrs, attrs
