"""squeue --json parsing (22.05 and 23.02+ shapes), host lists, GRES indices → UUIDs."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tests.helpers.squeue_samples import HOSTILE_SQUEUE, _job_text

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


@pytest.mark.parametrize("name", sorted(HOSTILE_SQUEUE))
def test_malformed_squeue_json_is_one_clear_input_error(name: str) -> None:
    with pytest.raises(InputError) as caught:
        parse_squeue_json(HOSTILE_SQUEUE[name])
    message = str(caught.value)
    assert message.startswith("squeue --json: ") and "\n" not in message and len(message) < 300, message


def test_an_answer_past_the_size_bound_is_refused_before_it_is_parsed(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from gpuslurm.slurm import squeue

    monkeypatch.setattr(squeue, "MAX_SQUEUE_CHARS", 1000)  # the real bound is 256 MiB
    assert parse_squeue_json(_job_text(name='"' + "x" * 800 + '"'))[0].name == "x" * 800
    with pytest.raises(InputError, match="longer than 1000 characters"):
        parse_squeue_json(_job_text(name='"' + "x" * 1000 + '"'))


def test_wrong_types_and_ranges_are_refused_by_name() -> None:
    for fields, words in ((dict(user_id="-1"), "user_id"), (dict(user_id="1.5"), "user_id"),
                          (dict(user_id="4294967296"), "user_id"), (dict(job_id="0"), "job_id"),
                          (dict(job_id="true"), "job_id"), (dict(nodes="[1]"), "nodes"),
                          (dict(gres_detail='[{"a": 1}]'), "gres_detail"), (dict(job_state="5"), "job_state"),
                          (dict(start_time="-5"), "start_time"), (dict(account="{}"), "account")):
        with pytest.raises(InputError, match=words):
            parse_squeue_json(_job_text(**fields))
    # 23.02+'s unset or infinite numbers are no number, not an error
    job, = parse_squeue_json(_job_text(user_id='{"set": false, "number": 0}',
                                       start_time='{"set": true, "infinite": true, "number": 0}'))
    assert (job.uid, job.user, job.start) == (-1, "alice", 0.0)


def _json_values() -> st.SearchStrategy[Any]:
    leaves = st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20) | \
        st.sampled_from(["gpu:h100:2(IDX:0-1)", "gpu(IDX:0-99999)", "gpu(IDX:4095)", "gpu02", "n[1-3]",
                         "RUNNING", "n[0-99999999999]"])
    return st.recursive(leaves, lambda inner: st.lists(inner, max_size=3)
                        | st.dictionaries(st.text(max_size=8), inner, max_size=3), max_leaves=8)


FIELDS = ("job_id", "user_id", "user_name", "account", "job_state", "nodes", "start_time", "gres_detail",
          "name", "errors", "jobs")


@given(changes=st.lists(st.tuples(st.sampled_from(FIELDS), _json_values()), max_size=4),
       cut=st.integers(min_value=0, max_value=400), junk=st.text(max_size=3), mangle=st.booleans())
@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
def test_any_mangled_squeue_answer_parses_or_is_refused_and_every_reader_then_holds(
        changes: list[tuple[str, Any]], cut: int, junk: str, mangle: bool) -> None:
    """A squeue answer with any field replaced by any JSON value (inf, NaN, huge numbers, nesting),
    or cut and spliced as text: an InputError or CommandError of one line, else jobs that every
    reader (the monitor's allocations, placement's live jobs, throttle's count) reads without error."""
    from gpuslurm.slurm.admission import gpus_held
    from gpuslurm.slurm.job_detail import live_jobs

    doc = json.loads(json.dumps(DOC_2205))
    for field, value in changes:
        if field in ("errors", "jobs"):
            doc[field] = value
        elif isinstance(doc["jobs"], list) and doc["jobs"] and isinstance(doc["jobs"][0], dict):
            doc["jobs"][0][field] = value
    text = json.dumps(doc)
    if mangle:
        text = text[:cut] + junk + text[cut + len(junk):]
    try:
        jobs = parse_squeue_json(text)
    except (InputError, CommandError) as exc:
        assert "\n" not in str(exc) and len(str(exc)) < 400
        return
    gpus_held(jobs)
    for node in ("gpu01", "gpu02"):
        allocations_on(jobs, node, NODE)
        live_jobs(jobs, node, lambda job_id: "")
