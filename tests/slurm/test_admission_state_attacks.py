"""``gpuslurm throttle auto`` as root with a broken ``admission.json`` (a half-written file, a
hand edit, a disk error: a broken file can hold anything), through the real CLI as a process with
stand-in squeue/scontrol/sacctmgr. Whatever the file holds, the round runs (a malformed state is a
fresh start, as documented), never exit 70, never a traceback, and no NaN keeps a limit forever."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gpuslurm.policy.admission import AdmissionConfig, step
from gpuslurm.slurm.admission import STATE_FILE, load_state

SQUEUE_JSON = json.dumps({"jobs": [
    {"job_id": 1, "user_name": "alice", "user_id": 1000, "job_state": "RUNNING", "nodes": "n1",
     "start_time": 0, "gres_detail": ["gpu:h100:7(IDX:0-6)"]},
    {"job_id": 2, "user_name": "bob", "user_id": 1001, "job_state": "RUNNING", "nodes": "n1",
     "start_time": 0, "gres_detail": ["gpu:h100:1(IDX:7)"]}], "errors": []})

BROKEN = {
    "infinite limit": ('{"tier":1,"low_since":null,"backoff_s":null,"eased_at":null,'
                       '"limits":[["alice",1e400]]}'),
    "infinite tier": '{"tier":1e400,"low_since":null,"backoff_s":null,"eased_at":null,"limits":[]}',
    "tier past the tiers": '{"tier":7,"low_since":null,"backoff_s":null,"eased_at":null,"limits":[]}',
    "tier below none": '{"tier":-5,"low_since":null,"backoff_s":null,"eased_at":null,"limits":[]}',
    "boolean tier": '{"tier":true,"low_since":null,"backoff_s":null,"eased_at":null,"limits":[]}',
    "NaN times": '{"tier":1,"low_since":NaN,"backoff_s":NaN,"eased_at":NaN,"limits":[["alice",1]]}',
    "infinite times": '{"tier":1,"low_since":-Infinity,"backoff_s":Infinity,"eased_at":null,"limits":[]}',
    "negative back-off": '{"tier":1,"low_since":null,"backoff_s":-5,"eased_at":null,"limits":[]}',
    "negative limit": '{"tier":1,"low_since":null,"backoff_s":null,"eased_at":null,"limits":[["alice",-3]]}',
    "limit as text": '{"tier":1,"low_since":null,"backoff_s":null,"eased_at":null,"limits":[["alice","1"]]}',
    "a list": "[1, 2]",
    "deep": "[" * 100000 + "]" * 100000,
    "not UTF-8": b'{"tier":1,"limits":[["\xff",1]]}'.decode("latin-1"),
}


def _stand_ins(tmp_path: Path) -> dict[str, str]:
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (tmp_path / "squeue.json").write_text(SQUEUE_JSON)
    scripts = {
        "scontrol": "echo 'NodeName=n1 Arch=x86_64 Gres=gpu:h100:8(S:0-1) State=MIXED'",
        "squeue": f"cat {tmp_path / 'squeue.json'}",
        "sacctmgr": (f'case "$2" in show) printf "alice|\\nbob|\\n";; '
                     f'*) echo "$@" >> {tmp_path / "calls"};; esac'),
    }
    for name, body in scripts.items():
        path = bindir / name
        path.write_text(f"#!/bin/sh\n{body}\n")
        path.chmod(0o755)
    config = tmp_path / "gpuslurm.toml"
    config.write_text(f'[paths]\nscontrol = "{bindir}/scontrol"\nsqueue = "{bindir}/squeue"\n'
                      f'sacctmgr = "{bindir}/sacctmgr"\n')
    return {**os.environ, "GPUSLURM_CONFIG": str(config)}


@pytest.mark.parametrize("name", sorted(BROKEN))
def test_a_broken_state_file_is_a_fresh_start_never_a_crash(tmp_path: Path, name: str) -> None:
    env = _stand_ins(tmp_path)
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    (state / STATE_FILE).write_bytes(BROKEN[name].encode("latin-1"))
    (state / STATE_FILE).chmod(0o600)
    result = subprocess.run([sys.executable, "-m", "gpuslurm", "throttle", "auto", "--once",
                             "--state-dir", str(state)], env=env, capture_output=True, text=True,
                            timeout=60, check=False)
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr
    # load 100 % of 8 GPUs, alice holds 7 > fair share 4: limited to 1 (10 %)
    assert "set GrpTRES=gres/gpu=1 for alice" in result.stdout
    saved = json.loads((state / STATE_FILE).read_text())
    assert saved["tier"] == 1 and saved["limits"] == [["alice", 1]]


def test_nan_in_the_state_never_keeps_a_limit_forever(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    (state / STATE_FILE).write_text(BROKEN["NaN times"])
    (state / STATE_FILE).chmod(0o600)
    loaded = load_state(str(state))
    cfg = AdmissionConfig(backoff_s=60)
    low = loaded
    for now in (1000.0, 1100.0):  # the load stays low for more than the back-off: limits lifted
        low, _changes, _ = step(low, load=0.0, usage={}, total_gpus=8, now=now, cfg=cfg)
    assert low.tier == -1 and low.limits == ()
