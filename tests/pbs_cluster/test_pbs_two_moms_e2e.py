"""A PBS job over two execution hosts: one server and two pbs_mom (pbsmom1 replaying dgx-h100,
pbsmom2 l40s-4x), each in namespaces of its own (tests/helpers/pbs_moms.py), with gpuslurm's hooks.
One ``qsub -l select=2:ncpus=1:ngpus=2 -l place=scatter`` job: each mom's execjob_begin maps two
of its own GPUs, the job's shell on the primary and a ``pbsdsh`` task on the sister each see their
host's GPUs, and execjob_end removes the map and writes a summary on both.

Opt-in (``GPUSLURM_PBS_MULTI=1``), as the Slurm multi-node suite is; once opted in, the PBS
fixtures skip or fail (``CI``, ``GPUSLURM_REQUIRE_PBS``) as for every PBS test.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from tests.helpers.pbs_fixture import PREFIX
from tests.helpers.pbs_helpers import Hooked
from tests.helpers.pbs_moms import Mom, namespaces_unavailable, two_moms

from gpuslurm.hw.source import load_node

pytestmark = [pytest.mark.pbs, pytest.mark.skipif(
    not os.environ.get("GPUSLURM_PBS_MULTI"),
    reason="the two-mom PBS suite runs only with GPUSLURM_PBS_MULTI=1 (.ci/run: a session of its own)")]

# On the primary: its own view, then one task on the sister (node index 1 of $PBS_NODEFILE) through
# pbs_mom's task manager; each writes HOST, CVD (CUDA_VISIBLE_DEVICES) and UUIDS lines, and what
# opening each /dev/nvidiaN gave (a fake device: ENXIO when let through, EPERM when denied).
VIEW = """\
out=$1
{ echo "HOST=$(hostname)"; echo "CVD=${CUDA_VISIBLE_DEVICES-unset}"
  echo "UUIDS=${GPUSLURM_GPU_UUIDS-unset}"
  for dev in /dev/nvidia[0-9]*; do
      err=$( (exec 3<"$dev") 2>&1 ) && echo "$dev=opened" || echo "$dev=${err##*: }"
  done; } > $out.tmp && mv $out.tmp $out
"""
JOB = """\
out={out}/$PBS_JOBID
sort -u $PBS_NODEFILE > $out.nodes
/bin/sh {view} $out.primary
{pbsdsh} -n 1 -- /bin/sh {view} $out.sister
echo "PBSDSH=$?" > $out.done
while [ ! -e {out}/release-$PBS_JOBID ]; do sleep 0.2; done
"""


@pytest.fixture(scope="module")
def moms(hooked: Hooked) -> Iterator[list[Mom]]:
    reason = namespaces_unavailable()
    if reason:
        if os.environ.get("CI") or os.environ.get("GPUSLURM_REQUIRE_PBS"):
            pytest.fail(f"GPUSLURM_REQUIRE_PBS or CI is set, but {reason}", pytrace=False)
        pytest.skip(reason)
    with two_moms(hooked) as moms:
        yield moms


def _read(path: Path, timeout: float = 90) -> dict[str, str]:
    deadline = time.monotonic() + timeout
    while not path.exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{path} never appeared")
        time.sleep(0.3)
    return dict(line.partition("=")[::2] for line in path.read_text().splitlines())


def _uuids(bundle: str) -> set[str]:
    return {g.uuid for g in load_node(bundle).gpus}


def test_a_two_host_job_maps_each_mom_s_own_gpus(hooked: Hooked, moms: list[Mom]) -> None:
    cluster = hooked.cluster
    view = hooked.out / "view.sh"
    view.write_text(VIEW)
    view.chmod(0o755)
    script = JOB.format(out=hooked.out, view=view, pbsdsh=PREFIX / "bin" / "pbsdsh")
    job = cluster.qsub(["-l", "select=2:ncpus=1:ngpus=2:mpiprocs=1", "-l", "place=scatter"], script)
    out = hooked.out / job
    try:
        done = _read(Path(f"{out}.done"))
        hosts = Path(f"{out}.nodes").read_text().split()
        primary, sister = _read(Path(f"{out}.primary")), _read(Path(f"{out}.sister"))
        maps = {m.name: json.loads((m.jobs_dir / f"{job}.json").read_text()) for m in moms}
    except TimeoutError:
        logs = "\n".join(f"--- {m.name}\n{m.mom_log()[-3000:]}" for m in moms)
        raise AssertionError(f"{cluster.job(job)}\n{logs}") from None
    finally:
        (hooked.out / f"release-{job}").touch()
    assert sorted(hosts) == ["pbsmom1", "pbsmom2"]  # place=scatter: one chunk on each mom
    by_name = {m.name: m for m in moms}
    mapped = {name: [g["uuid"] for g in doc["gpus"]] for name, doc in maps.items()}
    for name, uuids in mapped.items():  # each mom chose two of its own GPUs
        assert len(uuids) == 2 and set(uuids) <= _uuids(by_name[name].bundle_name), (name, uuids)
    # the job's shell runs on the primary; pbsdsh's task on the sister: each sees its host's GPUs
    assert done == {"PBSDSH": "0"}
    assert primary["HOST"] in hosts
    assert sister["HOST"] != primary["HOST"] and sister["HOST"] in hosts
    for seen in (primary, sister):
        assert seen["CVD"].split(",") == mapped[seen["HOST"]], seen
        assert seen["UUIDS"].split(",") == mapped[seen["HOST"]], seen
        # confined to its share of its own host's GPUs (each task in that host's job cgroup)
        minors = {g.uuid: g.minor for g in load_node(by_name[seen["HOST"]].bundle_name).gpus}
        opened = {minor: seen[f"/dev/nvidia{minor}"] for minor in minors.values()}
        assert {m: o for m, o in opened.items() if o == "Operation not permitted"} == \
            {minors[u]: "Operation not permitted" for u in minors if u not in mapped[seen["HOST"]]}, seen

    cluster.wait(job, timeout=120)
    for mom in moms:  # execjob_end on both: the map gone, the summary written
        deadline = time.monotonic() + 60
        while (mom.jobs_dir / f"{job}.json").exists() or not (mom.summaries / f"{job}-summary.json").exists():
            assert time.monotonic() < deadline, mom.mom_log()[-3000:]
            time.sleep(0.3)
        summary = json.loads((mom.summaries / f"{job}-summary.json").read_text())
        assert (summary["job_id"], summary["node"], summary["scheduler"]) == (job, mom.name, "pbs")
        assert sorted(g["uuid"] for g in summary["gpus"]) == sorted(mapped[mom.name])
