"""Every node's monitor and exporter, one Prometheus scraping them all, in the real multi-node cluster.

``multinode.sh monitors`` starts ``gpuslurm monitor`` in each node's namespaces (its exporter on the
node's own 192.0.2.x address, its violations in the one directory every node writes) and one
Prometheus in the controller's namespace, which reaches the exporters over the bridge. They run for
this module only: the other modules' tests drive each node's health by hand.
"""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from tests.helpers.multinode_fixture import MultiNodeCluster

pytestmark = pytest.mark.slurm

NOBODY = 65534
PROM = "prometheus:http://192.0.2.1:9090"


@pytest.fixture(scope="module")
def monitored(multinode_cluster: MultiNodeCluster) -> Iterator[MultiNodeCluster]:
    multinode_cluster.monitors("monitors")
    try:
        yield multinode_cluster
    finally:
        multinode_cluster.monitors("monitors-down")
        for node in ("mnode1", "mnode2", "mnode3"):
            (multinode_cluster.node_dir(node) / "scenario.json").unlink(missing_ok=True)


def _until(what: str, probe: Any, timeout: float = 60) -> Any:
    """``probe()``'s first true value; AssertionError naming ``what`` (and the last value) if none
    comes in time."""
    deadline = time.monotonic() + timeout
    while True:
        got = probe()
        if got:
            return got
        assert time.monotonic() < deadline, f"{what}: still {got!r} after {timeout}s"
        time.sleep(0.5)


def _write_scenario(cluster: MultiNodeCluster, node: str, scenario: dict[str, Any]) -> None:
    """The node's replayed processes and load, rewritten atomically (its monitor re-reads it)."""
    path = cluster.node_dir(node) / "scenario.json"
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(scenario))
    tmp.replace(path)


def _config(cluster: MultiNodeCluster, tmp_path: Path) -> Path:
    """A controller's config: the throttle file and Prometheus as the utilisation source."""
    config = tmp_path / "controller.toml"
    config.write_text(f'[paths]\nstate_dir = "{tmp_path}"\n[scheduler]\nkind = "slurm"\n'
                      f'[throttle]\nfile = "{tmp_path / "throttle"}"\n'
                      f'[throttle.auto]\nutilisation_source = "{PROM}"\n')
    config.chmod(0o644)
    return config


def _gres_gpus(cluster: MultiNodeCluster, node: str) -> int:
    gres = cluster.node_field(node, "Gres")
    return sum(int(n) for n in re.findall(r"\bgpu(?::[^:,(]+)?:(\d+)", gres))


def test_a_two_node_job_reaches_prometheus_from_both_nodes_and_its_rogue_process_everywhere(
        monitored: MultiNodeCluster, tmp_path: Path) -> None:
    """A two-node job of ``nobody``: both nodes' exporters carry its GPUs with its id, and
    Prometheus has both; its process on a GPU of mnode1 not its own is a rogue violation that
    mnode1's monitor writes to the shared directory and exports; ``gpuslurm jobstats`` on each node
    gives that node's share of the job; ``throttle sync`` reads the violation from
    either, and ``throttle auto`` reads the load of all three nodes and the utilisation of their
    GPUs through Prometheus."""
    cluster = monitored
    outdir = cluster.state_dir / "jobs" / str(NOBODY)
    script = f"""
srun --ntasks-per-node=1 bash -c 'echo $$ > {outdir}/pid-$SLURM_JOB_ID-$SLURMD_NODENAME; exec sleep 300'
"""
    job = cluster.sbatch(["-N2", "-w", "mnode1,mnode2", "--gres=gpu:4", "--time=5"], script, uid=NOBODY)
    try:
        pids = {node: int(_until(f"the task on {node}",
                                 lambda node=node: (outdir / f"pid-{job}-{node}").exists()
                                 and (outdir / f"pid-{job}-{node}").read_text().strip()))
                for node in ("mnode1", "mnode2")}
        shares = {node: [g["uuid"] for g in json.loads(cluster.job_map(node, job).read_text())["gpus"]]
                  for node in pids}
        rogue_gpu = next(u for u in cluster.uuids("mnode1") if u not in shares["mnode1"])
        for node, pid in pids.items():
            procs = [{"pid": pid, "gpu": uuid, "mem_mib": 1000, "sm": 80} for uuid in shares[node]]
            if node == "mnode1":  # the job's process on a GPU of the node that is not the job's
                procs.append({"pid": pid, "gpu": rogue_gpu, "mem_mib": 50})
            _write_scenario(cluster, node, {"gpus": {u: {"util": 80} for u in shares[node]},
                                            "procs": procs})

        # both nodes' series, with the job's id, in the one Prometheus
        def allocated() -> dict[str, set[str]]:
            found: dict[str, set[str]] = {}
            for series in cluster.prom_query(f'gpuslurm_gpu_allocated{{job_id="{job}"}} == 1'):
                labels = series["metric"]
                found.setdefault(labels["node"], set()).add(labels["gpu_uuid"])
            return found if set(found) == {"mnode1", "mnode2"} else {}
        assert _until("the job's GPUs in Prometheus", allocated) == \
            {node: set(own) for node, own in shares.items()}
        users = {s["metric"]["user"] for s in
                 cluster.prom_query(f'gpuslurm_job_start_timestamp_seconds{{job_id="{job}"}}')}
        assert users == {"nobody"}
        # every node's monitor has cycled and been scraped (the job's two nodes are, by now; the
        # third, which holds no job, may still be in its first cycle on a loaded machine)
        def nodes_seen() -> set[str]:
            seen = {s["metric"]["node"] for s in
                    cluster.prom_query("gpuslurm_monitor_last_cycle_timestamp_seconds")}
            return seen if seen == {"mnode1", "mnode2", "mnode3"} else set()
        assert _until("every node's last cycle in Prometheus", nodes_seen)

        # the rogue process: in the shared directory (written by mnode1's monitor) and in Prometheus
        def in_directory() -> list[dict[str, Any]]:
            lines = [json.loads(line) for f in cluster.violations_dir.iterdir() if f.is_file()
                     for line in f.read_text().splitlines() if line.strip()]
            return [v for v in lines if v.get("kind") == "rogue"]
        rogue = _until("the rogue violation in the shared directory", in_directory)
        assert {(v["node"], v["pid"], v["gpu_uuid"], v["job_id"], v["user"]) for v in rogue} == \
            {("mnode1", pids["mnode1"], rogue_gpu, str(job), "nobody")}, rogue
        exported = _until("the rogue violation in Prometheus", lambda: cluster.prom_query(
            'gpuslurm_violation_active{kind="rogue"}'))
        assert {(s["metric"]["node"], s["metric"]["gpu_uuid"], s["metric"]["job_id"],
                 s["metric"]["user"]) for s in exported} == {("mnode1", rogue_gpu, str(job), "nobody")}

        # each node's own store (by now it has sampled the scenario): `gpuslurm jobstats JOBID`
        # there gives that node's share of the job
        for node, own in shares.items():
            said = cluster.in_node(node, "env", f"GPUSLURM_CONFIG={cluster.node_dir(node) / 'gpuslurm.toml'}",
                                   cluster.env["GPUSLURM_BIN"], "jobstats", str(job), "--json")
            assert said.returncode == 0, said.stderr
            stats = json.loads(said.stdout)
            assert stats["node"] == node and {g["uuid"] for g in stats["gpus"]} == set(own), stats
            assert all(g["util_max_pct"] == 80 for g in stats["gpus"] if g["samples"]), stats["gpus"]

        config = _config(cluster, tmp_path)
        gpuslurm = cluster.env["GPUSLURM_BIN"]
        for source in (["--violations-dir", str(cluster.violations_dir)], ["--source", PROM]):
            said = cluster.client("/usr/bin/env", f"GPUSLURM_CONFIG={config}", gpuslurm, "throttle",
                                  "sync", "--dry-run", *source, check=False)
            assert said.returncode == 0, said.stderr
            assert re.search(r"\bnobody\b", said.stdout), (source, said.stdout, said.stderr)

        # throttle auto: the load of every node (the job's 8 GPUs of all three nodes' GPUs) and the
        # utilisation Prometheus has of all of them (nobody alone holds GPUs: no limit is set)
        total = sum(_gres_gpus(cluster, node) for node in ("mnode1", "mnode2", "mnode3"))
        assert total > max(_gres_gpus(cluster, node) for node in ("mnode1", "mnode2", "mnode3"))
        said = cluster.client("/usr/bin/env", f"GPUSLURM_CONFIG={config}", gpuslurm, "throttle", "auto",
                              "--once", "--dry-run", "--state-dir", str(tmp_path), check=False)
        assert said.returncode == 0, said.stderr
        figures = re.search(r"load (\d+)% of (\d+) GPUs, utilisation (\d+)%", said.stdout)
        assert figures, said.stdout + said.stderr
        gres = [cluster.node_field(n, "Gres") for n in ("mnode1", "mnode2", "mnode3")]
        assert int(figures.group(2)) == total, gres
        assert int(figures.group(1)) == round(100 * 8 / total)
        assert int(figures.group(3)) > 0
    finally:
        cluster.client("/usr/bin/scancel", str(job), check=False)
    assert cluster.wait(job) in ("CANCELLED", "COMPLETED"), cluster.log_tail()


def test_every_exporter_listens_on_its_nodes_address_only(monitored: MultiNodeCluster) -> None:
    """An exporter listens on its node's own address (192.0.2.1I), not on the node's loopback;
    Prometheus, in the controller's namespace, scrapes all three as up over the bridge."""
    cluster = monitored
    want = {f"192.0.2.{10 + i}:9402": "1" for i in (1, 2, 3)}
    _until("every exporter up", lambda: {s["metric"]["instance"]: s["value"][1]
                                         for s in cluster.prom_query("up")} == want)
    probe = ("import socket, sys\ntry:\n    socket.create_connection((sys.argv[1], 9402), 3).close()\n"
             "    print('open')\nexcept OSError:\n    print('refused')\n")
    for i, node in enumerate(("mnode1", "mnode2", "mnode3"), start=1):
        own = cluster.in_node(node, cluster.users_python, "-c", probe, f"192.0.2.{10 + i}")
        loop = cluster.in_node(node, cluster.users_python, "-c", probe, "127.0.0.1")
        assert (own.stdout.strip(), loop.stdout.strip()) == ("open", "refused"), (own, loop)
    assert os.path.isdir(cluster.violations_dir)
