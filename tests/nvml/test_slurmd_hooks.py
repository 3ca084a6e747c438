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
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from tests.nvml.conftest import ReplayLib, driver_lacks

from cluster_fixture import install_hooks
from gpuslurm.hw.bundle import read_bundle
from gpuslurm.hw.health import read_scenario
from gpuslurm.hw.nvml_replay import dump_replay
from gpuslurm.hw.source import BUILTIN_DIR

if TYPE_CHECKING:
    from cluster_fixture import SlurmCluster

pytestmark = pytest.mark.slurm

SCONTROL = "/usr/bin/scontrol"
MODES = ("live", "replayed")


@dataclass
class LiveCluster:
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

    @property
    def jobs_dir(self) -> Path:
        return self.root / "run" / "jobs"

    def scontrol(self, *args: str) -> str:
        return subprocess.run([SCONTROL, *args], env=self.cluster.env, capture_output=True, text=True,
                              check=True, timeout=30).stdout

    def node_field(self, name: str) -> str:
        out = self.scontrol("-o", "show", "node", self.node)
        match = re.search(rf"\b{name}=(.*?)(?= \w+=|$)", out.strip())
        return match.group(1) if match else ""

    def wait_node(self, pattern: str, timeout: float = 60) -> str:
        deadline = time.monotonic() + timeout
        state = ""
        while time.monotonic() < deadline:
            state = self.node_field("State")
            if re.search(pattern, state):
                return state
            time.sleep(0.3)
        raise TimeoutError(f"node {self.node} is {state}, not {pattern}\n{self.cluster.log_tail(40)}")

    def use(self, mode: str) -> None:
        """Name ``mode``'s executables in slurm.conf and apply it."""
        if mode == self.in_use:
            return
        prefix = self.prefixes[mode]
        lines = (f"Prolog={prefix}/gpuslurm-prolog\nEpilog={prefix}/gpuslurm-epilog\n"
                 f"TaskProlog={prefix}/gpuslurm-task-prolog\n")
        self.cluster.conf.write_text(self.original_conf.replace("\nNodeName=", f"\n{lines}NodeName=", 1))
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
    root = Path(tempfile.mkdtemp(prefix="gpuslurm-live-hooks-"))
    root.chmod(0o755)  # the task prolog runs as the job's user
    bundle = root / "bundle"
    shutil.copytree(BUILTIN_DIR / "dgx-h100", bundle)
    model = read_bundle(bundle)
    nvml_dir = root / "nvml"  # root's, 0755, like a driver's directory
    nvml_dir.mkdir(mode=0o755)
    nvml_json = nvml_dir / "nvml.json"
    _serve(bundle, nvml_json)
    built = replay_lib.without(*driver_lacks(model.driver_version)).serving(nvml_json)
    library = nvml_dir / "libnvidia-ml.so.1"
    shutil.copy(built.directory / "libnvidia-ml.so.1", library)
    library.chmod(0o644)
    paths = (f'[paths]\nrun_dir = "{root / "run"}"\nstate_dir = "{root / "state"}"\n'
             f'scontrol = "{SCONTROL}"\n'
             f'slurm_cgroup_conf = "{slurm_cluster.conf.parent / "cgroup.conf"}"\n')
    prefixes = {}
    for mode in MODES:
        (root / mode).mkdir(mode=0o755)
        config = root / f"{mode}.toml"
        extra = f'nvml_library = "{library}"\n' if mode == "live" else ""
        config.write_text(paths + extra + "[hooks]\ncommand_timeout_s = 20\n")
        prefixes[mode] = install_hooks(root / mode, config, bundle if mode == "replayed" else None)
    assert "GPUSLURM_CAPTURE" not in (prefixes["live"] / "gpuslurm-prolog").read_text()
    node = subprocess.run(["/bin/hostname", "-s"], capture_output=True, text=True, check=True).stdout.strip()
    lc = LiveCluster(slurm_cluster, root, bundle, nvml_json, prefixes, node, [g.uuid for g in model.gpus],
                     slurm_cluster.conf.read_text())
    try:
        yield lc
    finally:
        slurm_cluster.conf.write_text(lc.original_conf)
        subprocess.run([SCONTROL, "reconfigure"], env=slurm_cluster.env, capture_output=True, timeout=30,
                       check=False)
        subprocess.run([SCONTROL, "update", f"NodeName={node}", "State=RESUME"], env=slurm_cluster.env,
                       capture_output=True, timeout=30, check=False)
        try:
            lc.wait_node(r"^IDLE")
        except TimeoutError as exc:
            print(f"node did not come back: {exc}")
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
