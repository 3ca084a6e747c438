"""A sample of hostile bundles and files through the real CLI: a documented exit code, never 70,
one line on stderr when it fails, no traceback, and done within a time bound.

Also nvml.json in-process, where examples are cheap.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tests.helpers.props_hostile import PIECES, mutated, one_line

from gpuslurm.errors import CaptureError
from gpuslurm.hw.formats.nvml_json import dump_node, load_partial
from gpuslurm.hw.source import BUILTIN_DIR, load_node

DOCUMENTED = {0, 1, 2, 3, 4}  # README: ok, check mismatch, bad input, hardware, external command
TIME_BOUND_S = 30
L40S = BUILTIN_DIR / "l40s-4x"
NVML_JSON = dump_node(load_node("l40s-4x"))
CLI = settings(max_examples=40, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                       HealthCheck.too_slow])


def run_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run([sys.executable, "-m", "gpuslurm", *args], capture_output=True, text=True,
                          errors="replace", timeout=TIME_BOUND_S, check=False,
                          env={**os.environ, "GPUSLURM_CONFIG": "/nonexistent-gpuslurm.toml", **(env or {})})
    assert proc.returncode in DOCUMENTED, (proc.returncode, proc.stderr)
    assert "Traceback" not in proc.stderr and "internal error" not in proc.stderr, proc.stderr
    if proc.returncode:
        assert one_line(proc.stderr), proc.stderr
    return proc


@st.composite
def json_value(draw: st.DrawFn) -> object:
    return draw(st.one_of(st.none(), st.booleans(), st.integers(-2**70, 2**70), st.text(max_size=8),
                          st.sampled_from([{}, [], [1, "x"], 1.5, -1, 2**64]),
                          st.sampled_from(PIECES)))


@st.composite
def nvml_doc(draw: st.DrawFn) -> str:
    """nvml.json with a few values swapped for hostile ones, or its text mutated."""
    doc = json.loads(NVML_JSON)
    gpus = list(doc["gpus"])
    for _ in range(draw(st.integers(1, 3))):
        obj = draw(st.sampled_from([doc, *gpus]))
        key = draw(st.sampled_from(sorted(obj)))
        obj[key] = draw(json_value())
    text = json.dumps(doc)
    if draw(st.booleans()):
        text = draw(mutated(text, edits=2))
    return text


@settings(max_examples=150)
@given(nvml_doc())
def test_nvml_json_in_process(text: str) -> None:
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "nvml.json"
        path.write_text(text, errors="surrogateescape")
        try:
            facts = load_partial(path)
        except CaptureError as exc:
            assert one_line(str(exc)) and str(exc).startswith(f"{path}: ")
            return
    # What is accepted is what the model promises: typed, in range, each minor and index once.
    for key in ("hostname", "driver_version", "cuda_version"):
        assert isinstance(facts.get(key, ""), str)
    assert type(facts.get("memory_mib", 0)) is int and facts.get("memory_mib", 0) >= 0
    gpus = facts.get("gpus", ())
    for g in gpus:
        for value in (g.index, g.minor, g.memory_mib):
            assert type(value) is int and value >= 0
        assert isinstance(g.uuid, str) and isinstance(g.name, str) and isinstance(g.bus_id, str)
        assert g.mig_mode in (None, True, False)
        assert all(type(c) is int and c >= 0 for c in g.cpu_affinity)
    assert len({g.minor for g in gpus}) == len(gpus) == len({g.index for g in gpus})


@pytest.fixture(scope="module")
def workdir() -> object:
    with tempfile.TemporaryDirectory() as d:
        yield Path(d)


def _bundle(root: Path, files: dict[str, str | bytes]) -> Path:
    bundle = Path(tempfile.mkdtemp(dir=root))
    for f in L40S.iterdir():
        shutil.copy(f, bundle / f.name)
    for name, content in files.items():
        data = content.encode("utf-8", "surrogateescape") if isinstance(content, str) else content
        (bundle / name).write_bytes(data)
    return bundle


bundle_file = st.sampled_from(["lscpu.csv", "nvidia-smi-topo.txt", "nvidia-smi-q.xml", "hostname",
                               "meminfo", "nvidia-smi-L.txt"])


@CLI
@given(st.data())
def test_discover_and_gres_conf_on_hostile_bundles(workdir: Path, data: st.DataObject) -> None:
    name = data.draw(bundle_file)
    base = (L40S / name).read_text()[:8000]
    files: dict[str, str | bytes] = {name: data.draw(mutated(base, edits=3))}
    if data.draw(st.booleans()):
        files["nvml.json"] = data.draw(nvml_doc())
    if data.draw(st.booleans()):
        files["health.json"] = data.draw(st.sampled_from(["{}", "[", '{"GPU-x": {"xid": [1e308]}}']))
    bundle = _bundle(workdir, files)
    run_cli(data.draw(st.sampled_from(["discover", "topo", "gres-conf", "node-conf"])), "--from", str(bundle))


GRES = "Name=gpu Type=l40s File=/dev/nvidia[0-3] Cores=0-31\n"


@CLI
@given(st.one_of(mutated(GRES, edits=3), st.binary(max_size=60).map(lambda b: b.decode("latin-1"))))
def test_gres_conf_check_on_hostile_files(workdir: Path, text: str) -> None:
    conf = Path(tempfile.mkdtemp(dir=workdir)) / "gres.conf"
    conf.write_bytes(text.encode("utf-8", "surrogateescape"))
    run_cli("gres-conf", "--from", "l40s-4x", "--check", str(conf))


CONFIG = "[monitor]\ninterval_s = 10.0\n[hooks]\ncommand_timeout_s = 5\n[throttle]\nsync_minutes = 120\n"


@CLI
@given(mutated(CONFIG, edits=3))
def test_config_on_hostile_files(workdir: Path, text: str) -> None:
    cfg = Path(tempfile.mkdtemp(dir=workdir)) / "gpuslurm.toml"
    cfg.write_text(text, errors="surrogateescape")
    run_cli("status", "--from", "l40s-4x", env={"GPUSLURM_CONFIG": str(cfg)})


@CLI
@given(st.sampled_from(PIECES), st.sampled_from(PIECES))
def test_hook_environment(workdir: Path, gpus: str, job: str) -> None:
    """The prolog with hostile SLURM_JOB_GPUS: a documented code, one line, never a hang."""
    env = {"SLURM_JOB_ID": "7", "SLURM_JOB_UID": "1000", "SLURM_JOB_USER": "bob",
           "SLURM_JOB_GPUS": f"0-1,{gpus}", "SLURMD_NODENAME": job.strip() or "n1",
           "GPUSLURM_CAPTURE": "l40s-4x", "GPUSLURM_STATE_DIR": str(workdir / "state")}
    clean = {k: v.replace("\x00", "") for k, v in env.items()}
    proc = subprocess.run([sys.executable, "-c", "from gpuslurm.slurm.entry import run; run()", "prolog"],
                          capture_output=True, text=True, timeout=TIME_BOUND_S, check=False,
                          env={**os.environ, **clean, "GPUSLURM_CONFIG": "/nonexistent.toml"})
    assert proc.returncode in DOCUMENTED, (proc.returncode, proc.stderr)
    assert "Traceback" not in proc.stderr
