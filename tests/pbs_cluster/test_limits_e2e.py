"""max_run_res.ngpus in the real pbs_server: a user over the limit keeps a job queued, not refused."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from tests.helpers.pbs_fixture import PREFIX, PbsCluster

from gpuslurm.pbs.limits import read_user_gpu_limits, set_user_gpu_limits

pytestmark = pytest.mark.pbs


def _states(cluster: PbsCluster, *jobs: str) -> dict[str, tuple[str, str]]:
    out = {}
    for job in jobs:  # one qstat per job: with several ids, -F json printed only the first one's
        doc = json.loads(cluster.run(str(PREFIX / "bin" / "qstat"), "-x", "-f", "-F", "json", job))
        out.update({j: (v["job_state"], str(v.get("comment", ""))) for j, v in doc["Jobs"].items()})
    return out


def test_a_users_gpu_limit_keeps_the_second_job_queued(pbs_cluster: PbsCluster, pbs_bin: Path) -> None:
    qmgr, qstat = str(pbs_bin / "qmgr"), str(pbs_bin / "qstat")
    jobs: list[str] = []
    try:
        assert set_user_gpu_limits(qmgr, {pbs_cluster.user: 1}, timeout=30) == f"[u:{pbs_cluster.user}=1]"
        assert read_user_gpu_limits(qstat, timeout=30) == {pbs_cluster.user: 1}
        jobs = [pbs_cluster.qsub(["-l", "select=1:ncpus=1:ngpus=1"], "sleep 120\n") for _ in range(2)]
        deadline = time.monotonic() + 40
        while True:
            states = _states(pbs_cluster, *jobs)
            if sorted(s for s, _ in states.values()) == ["Q", "R"] and \
                    any("limit" in c for s, c in states.values() if s == "Q"):
                break
            assert time.monotonic() < deadline, states
            time.sleep(1)
        set_user_gpu_limits(qmgr, {}, timeout=30)
        assert read_user_gpu_limits(qstat, timeout=30) == {}
        deadline = time.monotonic() + 40
        while True:  # the queued one starts (running, or already past it)
            states = _states(pbs_cluster, *jobs)
            if len(states) == 2 and all(s != "Q" for s, _ in states.values()):
                break
            assert time.monotonic() < deadline, states
            time.sleep(1)
    finally:
        pbs_cluster.run(str(PREFIX / "bin" / "qmgr"), "-c", "unset server max_run_res.ngpus", check=False)
        for job in jobs:
            pbs_cluster.run(str(PREFIX / "bin" / "qdel"), "-W", "force", job, check=False)
