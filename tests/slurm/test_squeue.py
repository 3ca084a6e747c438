"""squeue --json parsing (22.05 and 23.02+ shapes), host lists, GRES indices → UUIDs."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from gpuslurm.errors import CommandError, InputError
from gpuslurm.hw.source import load_node
from gpuslurm.slurm.hookenv import gres_devices
from gpuslurm.slurm.squeue import (
    allocations_on,
    expand_hostlist,
    gpu_indices,
    node_allocations,
    parse_squeue_json,
)

NODE = load_node("dgx-h100")
TABLE = gres_devices(NODE)


def test_hostlists() -> None:
    # NodeSet orders the names of one item its own way; items keep their written order.
    assert sorted(expand_hostlist("gpu[01-03,7],login")) == ["gpu01", "gpu02", "gpu03", "gpu7", "login"]
    assert expand_hostlist("b[1],a[2]") == ("b1", "a2")
    assert expand_hostlist("n[8-10]-ib") == ("n8-ib", "n9-ib", "n10-ib")
    assert expand_hostlist("") == ()
    with pytest.raises(ValueError):
        expand_hostlist("n[a-b]")
    for hostile in ("n[0-99999999999]", "n[4-]", "n[0-1e308]", "n[1-9]x[0-99999]", "n[1", "n]"):
        with pytest.raises(ValueError):
            expand_hostlist(hostile)


def test_gres_detail_indices() -> None:
    assert gpu_indices("gpu:h100:2(IDX:0-1)") == (0, 1)
    assert gpu_indices("gpu(IDX:3,5-6)") == (3, 5, 6)
    assert gpu_indices("gpu:a:1(IDX:0),gpu:b:1(IDX:3),mps:100(0/100,0/100)") == (0, 3)
    assert gpu_indices("gpu:0(IDX:)") == ()
    assert gpu_indices("") == ()


DOC_2205 = {"meta": {}, "errors": [], "jobs": [
    {"job_id": 12, "user_id": 1000, "user_name": "alice", "account": "phys", "job_state": "RUNNING",
     "nodes": "gpu[01-02]", "start_time": 1700000000,
     "gres_detail": ["gpu:h100:1(IDX:4)", "gpu:h100:2(IDX:0-1)"]},
    {"job_id": 13, "user_id": 1001, "user_name": "bob", "account": "", "job_state": "PENDING",
     "nodes": "", "start_time": 0, "gres_detail": []},
    {"job_id": 14, "user_id": 1001, "user_name": "bob", "job_state": "RUNNING", "nodes": "gpu02",
     "start_time": 1700000100}]}
DOC_2302 = {"errors": [], "jobs": [
    {"job_id": 15, "user_id": 1002, "user_name": "carol", "account": "chem", "job_state": ["RUNNING"],
     "nodes": "gpu02", "start_time": {"set": True, "infinite": False, "number": 1700000200},
     "gres_detail": ["gpu:1(IDX:7)"]}]}


def test_running_jobs_on_a_node_with_their_gpus() -> None:
    jobs = parse_squeue_json(json.dumps(DOC_2205)) + parse_squeue_json(json.dumps(DOC_2302))
    found = allocations_on(jobs, "gpu02", NODE)
    assert [(j.job.job_id, j.job.user, j.job.uid, j.job.account, j.job.start, j.uuids) for j in found] == [
        ("12", "alice", 1000, "phys", 1700000000.0, (TABLE[0].uuid, TABLE[1].uuid)),
        ("14", "bob", 1001, None, 1700000100.0, ()),
        ("15", "carol", 1002, "chem", 1700000200.0, (TABLE[7].uuid,)),
    ]
    assert [j.job.job_id for j in allocations_on(jobs, "gpu01", NODE)] == ["12"]


def test_errors_in_the_document_are_failures_even_with_exit_0() -> None:
    doc = {"errors": [{"error": "Unable to contact slurm controller (connect failure)", "error_number": 1}],
           "jobs": []}
    with pytest.raises(CommandError, match="Unable to contact slurm controller"):
        parse_squeue_json(json.dumps(doc))
    with pytest.raises(InputError, match="not valid JSON"):
        parse_squeue_json("squeue: error: something")
    with pytest.raises(InputError, match="numeric job_id"):
        parse_squeue_json('{"jobs": [{"job_id": "x"}]}')


def test_a_real_run_through_the_runner(tmp_path: Path) -> None:
    """A stand-in squeue that exits 0 with an error document, as the real one does."""
    fake = tmp_path / "squeue"
    fake.write_text("#!/bin/sh\necho \"$@\" > " + str(tmp_path / "args") + "\n"
                    "echo '{\"errors\": [{\"error\": \"Invalid user\"}], \"jobs\": []}'\n")
    fake.chmod(0o755)
    with pytest.raises(CommandError, match="Invalid user"):
        node_allocations(str(fake), "gpu02", NODE, timeout=5)
    assert (tmp_path / "args").read_text().split() == ["--json", "--nodelist=gpu02", "--states=RUNNING"]
    slow = tmp_path / "slow"
    slow.write_text("#!/bin/sh\nexec sleep 30\n")
    slow.chmod(0o755)
    with pytest.raises(CommandError, match="timed out"):
        node_allocations(str(slow), "gpu02", NODE, timeout=0.3)
    assert os.access(fake, os.X_OK)
