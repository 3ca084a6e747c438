"""plugins/pbs/gpuslurm_throttle.py in the real pbs_server: a throttled user's qsub with GPUs is refused
with the message, without GPUs it passes, a cap refuses only what is over it, a corrupt file lets jobs
through, a qalter to more GPUs is refused, and a queue's default ngpus is caught at runjob."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from tests.helpers.pbs_fixture import PREFIX, ROOT, PbsCluster

from gpuslurm.policy.throttle import Throttle
from gpuslurm.slurm.throttle import write_throttle_file

pytestmark = pytest.mark.pbs

HOOK = "gpuslurm_throttle"
QMGR = str(PREFIX / "bin" / "qmgr")


def _qmgr(cluster: PbsCluster, command: str, check: bool = True) -> str:
    return cluster.run(QMGR, "-c", command, check=check)


@pytest.fixture(scope="module")
def throttle_file(pbs_cluster: PbsCluster) -> Iterator[Path]:
    """The hook imported with qmgr (events, alarm, its JSON config); removed again at the end."""
    directory = pbs_cluster.state_dir / "throttle"
    directory.mkdir(mode=0o755, exist_ok=True)
    path = directory / "gpuslurm-throttle"
    config = pbs_cluster.state_dir / "gpuslurm_throttle.json"
    config.write_text(json.dumps({"python_path": [str(ROOT / "src")], "throttle_file": str(path),
                                  "contact": "hpc-help@example.org"}))
    _qmgr(pbs_cluster, f"create hook {HOOK}")
    try:
        _qmgr(pbs_cluster, f"set hook {HOOK} event = 'queuejob,modifyjob,movejob,runjob'")
        _qmgr(pbs_cluster, f"set hook {HOOK} alarm = 10")
        _qmgr(pbs_cluster, f"import hook {HOOK} application/x-python default "
                           f"{ROOT / 'plugins' / 'pbs' / 'gpuslurm_throttle.py'}")
        _qmgr(pbs_cluster, f"import hook {HOOK} application/x-config default {config}")
        yield path
    finally:
        _qmgr(pbs_cluster, f"delete hook {HOOK}", check=False)


def _throttle(path: Path, mode: str = "reject", value: int = 0) -> None:
    now = int(time.time())
    throttle = Throttle("gpuspbs1", now + 3600, mode, value, now, "", "rogue processes")
    write_throttle_file(str(path), [throttle])


def _refused(cluster: PbsCluster, args: list[str]) -> str:
    with pytest.raises(RuntimeError) as caught:
        job = cluster.qsub(args, "sleep 1\n")
        cluster.run(str(PREFIX / "bin" / "qdel"), "-W", "force", job, check=False)
    return str(caught.value)


def _passes(cluster: PbsCluster, args: list[str], hold: bool = True) -> str:
    job = cluster.qsub(["-h", *args] if hold else args, "sleep 1\n")
    assert job.endswith(".pbshost")
    return job


def _qdel(cluster: PbsCluster, *jobs: str) -> None:
    for job in jobs:
        cluster.run(str(PREFIX / "bin" / "qdel"), "-W", "force", job, check=False)


def test_reject_refuses_gpu_jobs_with_the_message(pbs_cluster: PbsCluster, throttle_file: Path) -> None:
    _throttle(throttle_file)
    message = _refused(pbs_cluster, ["-l", "select=1:ncpus=1:ngpus=1"])
    assert "GPU jobs of user gpuspbs1 are refused until" in message
    assert "rogue processes" in message and "hpc-help@example.org" in message
    assert "job-wide" not in message
    assert "refused" in _refused(pbs_cluster, ["-l", "ngpus=2"])  # a job-wide request counts too
    job = _passes(pbs_cluster, ["-l", "select=1:ncpus=1"])
    _qdel(pbs_cluster, job)


def test_cap_refuses_only_over_the_cap(pbs_cluster: PbsCluster, throttle_file: Path) -> None:
    _throttle(throttle_file, "cap", 2)
    message = _refused(pbs_cluster, ["-l", "select=3:ncpus=1:ngpus=1"])
    assert "limited to 2 GPU(s) per job, this job asks for 3" in message
    job = _passes(pbs_cluster, ["-l", "select=1:ncpus=1:ngpus=2"])
    _qdel(pbs_cluster, job)


def test_a_corrupt_or_missing_file_lets_jobs_through(pbs_cluster: PbsCluster, throttle_file: Path) -> None:
    throttle_file.write_bytes(b"gpuspbs1\t\xff\xfe\tnonsense\n\x00" * 50)
    first = _passes(pbs_cluster, ["-l", "select=1:ncpus=1:ngpus=1"])
    throttle_file.unlink()
    second = _passes(pbs_cluster, ["-l", "select=1:ncpus=1:ngpus=1"])
    _qdel(pbs_cluster, first, second)


def test_qalter_to_gpus_is_refused(pbs_cluster: PbsCluster, throttle_file: Path) -> None:
    _throttle(throttle_file)
    job = _passes(pbs_cluster, ["-l", "select=1:ncpus=1"])
    try:
        conf = pbs_cluster.env["PBS_CONF_FILE"]
        with pytest.raises(RuntimeError) as caught:
            pbs_cluster.run("runuser", "-u", pbs_cluster.user, "--", "env", f"PBS_CONF_FILE={conf}",
                            str(PREFIX / "bin" / "qalter"), "-l", "select=1:ncpus=1:ngpus=1", job)
        assert "GPU jobs of user gpuspbs1 are refused" in str(caught.value)
        # root (a manager) may change it: the throttle binds the user's own requests only
        pbs_cluster.run(str(PREFIX / "bin" / "qalter"), "-l", "select=1:ncpus=1:ngpus=1", job)
    finally:
        _qdel(pbs_cluster, job)


def test_a_queue_default_is_caught_at_runjob(pbs_cluster: PbsCluster, throttle_file: Path) -> None:
    _qmgr(pbs_cluster, "create queue gpuq queue_type=execution,enabled=true,started=true")
    try:
        _qmgr(pbs_cluster, "set queue gpuq default_chunk.ngpus = 1")
        _throttle(throttle_file)
        job = pbs_cluster.qsub(["-q", "gpuq", "-l", "select=1:ncpus=1"], "sleep 1\n")  # no ngpus asked
        try:
            deadline = time.monotonic() + 30
            item: dict[str, object] = {}
            while time.monotonic() < deadline:
                doc = json.loads(pbs_cluster.run(str(PREFIX / "bin" / "qstat"), "-f", "-F", "json", job))
                item = doc["Jobs"][job]
                if "refused" in str(item.get("comment", "")):
                    break
                time.sleep(1)
            assert item["job_state"] == "Q", item  # backpressure: kept queued, not run
            comment = str(item.get("comment", ""))
            assert "GPU jobs of user gpuspbs1 are refused" in comment, comment
        finally:
            _qdel(pbs_cluster, job)
    finally:
        _qmgr(pbs_cluster, "delete queue gpuq", check=False)


def test_priority_lowers_the_jobs_priority(pbs_cluster: PbsCluster, throttle_file: Path) -> None:
    _throttle(throttle_file, "priority", 100)
    job = _passes(pbs_cluster, ["-p", "20", "-l", "select=1:ncpus=1:ngpus=1"])
    try:
        doc = json.loads(pbs_cluster.run(str(PREFIX / "bin" / "qstat"), "-f", "-F", "json", job))
        assert doc["Jobs"][job]["Priority"] == -80
    finally:
        _qdel(pbs_cluster, job)
