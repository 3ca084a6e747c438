"""The installed hooks of a "live" node under the real slurmd: NVML through the replay library.

slurmd runs the prolog, epilog and task prolog with the job's SLURM_* variables only, so neither
``LD_LIBRARY_PATH`` nor ``GPUSLURM_NVML_REPLAY`` reaches them. The executables here are
``gpuslurm install`` without ``--replay``; their config names the library (``[paths]
nvml_library``, a root-owned directory of ours), which was built with the path of the nvml.json
beside it. Each job runs twice, once through those hooks and once through the same hooks
installed with ``--replay`` of the bundle the library serves (a differential): the same job map,
and for a health fault the same drain reason naming the GPU.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import pytest
from tests.helpers.cluster_fixture import install_hooks
from tests.helpers.nvml_replay import ReplayLib, driver_lacks
from tests.helpers.slurm_helpers import (
    NodeControl,
    conf_with,
    hook_lines,
    hooks_paths,
    hooks_root,
    short_hostname,
)

from gpuslurm.hw.replay.bundle import read_bundle
from gpuslurm.hw.replay.health import read_scenario
from gpuslurm.hw.replay.nvml_replay import dump_replay

if TYPE_CHECKING:
    from tests.helpers.cluster_fixture import SlurmCluster

pytestmark = pytest.mark.slurm

MODES = ("live", "replayed")


@dataclass
class LiveCluster(NodeControl):
    cluster: SlurmCluster
    root: Path
    bundle: Path
    nvml_json: Path
    prefixes: dict[str, Path]
    node: str
    uuids: list[str]
    original_conf: str
    in_use: str = ""
    pair: list[int] = field(default_factory=list)  # the GPU indices Slurm gives a 2-GPU job here
    node_timeout: ClassVar[float] = 60

    @property
    def jobs_dir(self) -> Path:
        return self.root / "run" / "jobs"

    def node_detail(self) -> str:
        return self.cluster.log_tail(40)

    def use(self, mode: str) -> None:
        """Name ``mode``'s executables in slurm.conf and apply it."""
        if mode == self.in_use:
            return
        self.cluster.conf.write_text(conf_with(self.original_conf, hook_lines(self.prefixes[mode])))
        self.scontrol("reconfigure")
        self.in_use = mode
        self.wait_node(r"^IDLE")

    def set_health(self, facts: dict[str, Any]) -> None:
        """The same facts for both modes: the bundle's health.json, and the library's nvml.json."""
        (self.bundle / "health.json").write_text(json.dumps(facts))
        _serve(self.bundle, self.nvml_json)

    def run_job(self, mode: str) -> tuple[str, dict[str, Any], list[int]]:
        """A ``--gres=gpu:2`` job through ``mode``'s hooks: its state, job map and GPU indices."""
        self.use(mode)
        script = (f'cat {self.jobs_dir}/$SLURM_JOB_ID.json; echo\n'
                  'echo "JOB_GPUS=$SLURM_JOB_GPUS"\n'
                  'echo "UUIDS=$GPUSLURM_GPU_UUIDS"\n')
        jobid = self.cluster.sbatch(["--gres=gpu:2"], script)
        state = self.cluster.wait(jobid, timeout=60)
        out = self.cluster.output(jobid)
        assert state == "COMPLETED", f"{mode}: {state}\n{out}\n{self.cluster.log_tail(40)}"
        jmap = json.loads(out.splitlines()[0])
        found = re.search(r"^JOB_GPUS=(.*)$", out, re.M)
        assert found is not None, out
        indices = [int(i) for i in found.group(1).split(",")]
        uuids = re.search(r"^UUIDS=(.*)$", out, re.M)
        assert uuids is not None and uuids.group(1) == ",".join(self.uuids[i] for i in indices), out
        assert not (self.jobs_dir / f"{jobid}.json").exists()  # the epilog removed it
        return state, jmap, indices


def _serve(bundle: Path, nvml_json: Path) -> None:
    """Write ``bundle`` (its health.json included) as the nvml.json the library serves, atomically:
    a hook may be reading it."""
    model = read_bundle(bundle)
    health = read_scenario(bundle / "health.json", [g.uuid for g in model.gpus])
    processes = {g.index: [(p.pid, p.used_mib) for p in health[g.uuid].processes or ()] for g in model.gpus}
    tmp = nvml_json.with_name(".nvml.json.tmp")
    tmp.write_text(dump_replay(model, processes=processes, health=health))
    tmp.chmod(0o644)
    tmp.replace(nvml_json)


@pytest.fixture(scope="module")
def live_cluster(slurm_cluster: SlurmCluster, replay_lib: ReplayLib) -> Iterator[LiveCluster]:
    root, bundle = hooks_root("gpuslurm-live-hooks-")
    model = read_bundle(bundle)
    nvml_dir = root / "nvml"  # root's, 0755, like a driver's directory
    nvml_dir.mkdir(mode=0o755)
    nvml_json = nvml_dir / "nvml.json"
    _serve(bundle, nvml_json)
    built = replay_lib.without(*driver_lacks(model.driver_version)).serving(nvml_json)
    library = nvml_dir / "libnvidia-ml.so.1"
    shutil.copy(built.directory / "libnvidia-ml.so.1", library)
    library.chmod(0o644)
    paths = hooks_paths(root, slurm_cluster)
    prefixes = {}
    for mode in MODES:
        (root / mode).mkdir(mode=0o755)
        config = root / f"{mode}.toml"
        extra = f'nvml_library = "{library}"\n' if mode == "live" else ""
        config.write_text(paths + extra + "[hooks]\ncommand_timeout_s = 20\n")
        prefixes[mode] = install_hooks(root / mode, config, bundle if mode == "replayed" else None)
    assert "GPUSLURM_CAPTURE" not in (prefixes["live"] / "gpuslurm-prolog").read_text()
    lc = LiveCluster(slurm_cluster, root, bundle, nvml_json, prefixes, short_hostname(),
                     [g.uuid for g in model.gpus], slurm_cluster.conf.read_text())
    try:
        yield lc
    finally:
        lc.restore(lc.original_conf)
        if not os.environ.get("GPUSLURM_KEEP_CLUSTER"):
            shutil.rmtree(root, ignore_errors=True)


def _healthy_pair(lc: LiveCluster) -> list[int]:
    if not lc.pair:
        lc.pair = lc.run_job("live")[2]
    return lc.pair


def test_two_gpu_job_maps_the_same_uuids_live_and_replayed(live_cluster: LiveCluster) -> None:
    maps = {}
    for mode in MODES:
        _, jmap, indices = live_cluster.run_job(mode)
        assert [g["uuid"] for g in jmap["gpus"]] == [live_cluster.uuids[i] for i in indices], mode
        maps[mode] = (indices, jmap["gpus"])
        if mode == "live":
            live_cluster.pair = indices
    assert maps["live"] == maps["replayed"]
    assert len(maps["live"][0]) == 2


def test_a_fault_the_library_serves_drains_naming_the_gpu(live_cluster: LiveCluster) -> None:
    lc = live_cluster
    sick = _healthy_pair(lc)[1]
    reasons = {}
    try:
        lc.set_health({lc.uuids[sick]: {"ecc_uncorrectable": 3}})
        for mode in MODES:
            lc.use(mode)
            jobid = lc.cluster.sbatch(["--gres=gpu:2"], "echo should not run\n")
            try:
                lc.wait_node(r"DRAIN")
                reasons[mode] = lc.node_field("Reason")
                assert lc.cluster.state(jobid) != "COMPLETED"
                assert not (lc.jobs_dir / f"{jobid}.json").exists()
            finally:
                subprocess.run(["/usr/bin/scancel", str(jobid)], env=lc.cluster.env, timeout=30, check=False)
                lc.scontrol("update", f"NodeName={lc.node}", "State=RESUME")
                lc.wait_node(r"^IDLE")
    finally:
        (lc.bundle / "health.json").unlink(missing_ok=True)
        _serve(lc.bundle, lc.nvml_json)
    named = f"GPU index {sick} (/dev/nvidia{sick}, {lc.uuids[sick]})"  # dgx-h100: minor == index
    assert named in reasons["live"] and "uncorrectable" in reasons["live"].lower(), reasons
    # slurmctld appends who drained it and when: " [root@2026-11-23T17:23:09]"
    live, replayed = (re.sub(r" \[[^]]*\]$", "", reasons[mode]) for mode in MODES)
    assert live == replayed, reasons
