"""PBS's qstat / pbsnodes JSON and their field parsers on hostile text: a value or one InputError line."""

from __future__ import annotations

import json
import time
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st
from tests.helpers.props_hostile import PIECES, mutated, one_line

from gpuslurm.errors import InputError
from gpuslurm.pbs.cgroup_paths import parse_cgroup_path
from gpuslurm.pbs.qstat import (
    parse_exec_host,
    parse_exec_vnode,
    parse_pbs_time,
    parse_pbsnodes_json,
    parse_qstat_json,
)

DATA = Path(__file__).resolve().parents[1] / "pbs" / "data"
QSTAT = (DATA / "qstat-f-json.json").read_text()
PBSNODES = (DATA / "pbsnodes-av-json-offline.json").read_text()
PARSER = settings(max_examples=300)


def _value_or_one_line(call: object, *args: object) -> object:
    try:
        return call(*args)  # type: ignore[operator]
    except InputError as exc:
        assert one_line(str(exc)), repr(str(exc))
        return None


@PARSER
@given(mutated(QSTAT, edits=4))
def test_qstat_json_mutated(text: str) -> None:
    jobs = _value_or_one_line(parse_qstat_json, text)
    for job in jobs or ():  # type: ignore[attr-defined]
        assert "." in job.job_id and job.ngpus >= 0
        assert job.gpus_on("pbshost") >= 0  # checked at parse time: never raises later


@PARSER
@given(mutated(PBSNODES, edits=4))
def test_pbsnodes_json_mutated(text: str) -> None:
    _value_or_one_line(parse_pbsnodes_json, text)


json_value = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
                          lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6),
                                                                                      inner, max_size=3),
                          max_leaves=12)


@PARSER
@given(st.sampled_from(["Job_Owner", "euser", "job_state", "exec_host", "exec_vnode", "stime", "session_id",
                        "Resource_List", "Account_Name", "project", "queue"]), json_value)
def test_any_json_value_in_any_job_field(key: str, value: object) -> None:
    doc = json.loads(QSTAT)
    doc["Jobs"]["0.pbshost"][key] = value
    _value_or_one_line(parse_qstat_json, json.dumps(doc))


vnode = st.builds(lambda h, i: h if i is None else f"{h}[{i}]",
                  st.from_regex(r"[a-z][a-z0-9-]{0,8}", fullmatch=True), st.none() | st.integers(0, 64))
share = st.builds(lambda v, rs: ":".join([v, *(f"{k}={n}" for k, n in rs)]), vnode,
                  st.lists(st.tuples(st.sampled_from(["ncpus", "ngpus", "mem"]), st.integers(0, 4096)),
                           max_size=3))


@PARSER
@given(st.lists(st.lists(share, min_size=1, max_size=3), max_size=4))
def test_exec_vnode_as_pbs_writes_it(chunks: list[list[str]]) -> None:
    text = "+".join("(" + "+".join(c) + ")" for c in chunks)
    parsed = parse_exec_vnode(text)
    assert [[s.vnode for s in c] for c in parsed] == [[s.split(":")[0] for s in c] for c in chunks]


@PARSER
@given(st.one_of(st.text(max_size=60), mutated("(pbshost[0]:ncpus=4:ngpus=2)+(n2:ngpus=1)")))
def test_exec_vnode_and_host_hostile(text: str) -> None:
    _value_or_one_line(parse_exec_vnode, text)
    _value_or_one_line(parse_exec_host, text)


@PARSER
@given(st.integers(0, 4_000_000_000))
def test_pbs_time_round_trip(ts: int) -> None:
    text = time.strftime("%a %b %d %H:%M:%S %Y", time.localtime(ts))
    assert abs(parse_pbs_time(text) - ts) <= 3600  # a DST fold may name two instants


@PARSER
@given(st.one_of(st.text(max_size=40), mutated("Mon Nov 23 16:17:56 2026"), st.sampled_from(PIECES)))
def test_pbs_time_hostile(text: str) -> None:
    _value_or_one_line(parse_pbs_time, text)


@PARSER
@given(st.one_of(mutated("/pbs_jobs.service/jobid/123.pbshost", edits=2), st.text(max_size=60)))
def test_cgroup_path_names_only_valid_job_ids(path: str) -> None:
    from gpuslurm.jobid import valid_job_id

    job = parse_cgroup_path(path)
    assert job is None or job.job_id is None or valid_job_id(job.job_id)


@PARSER
@given(st.one_of(st.text(max_size=20), st.booleans(), st.integers(), st.none(),
                 st.lists(st.booleans(), max_size=2)))
def test_the_mps_field_is_a_boolean_or_one_line(value: object) -> None:
    """The PBS hook request's ``mps`` (the job's gpuslurm_mps): a bool, or one InputError line."""
    from gpuslurm.pbs.request import parse_request

    doc = {"format": 1, "event": "execjob_begin", "hostname": "h", "job_id": "1.h", "euser": "u",
           "mps": value}
    req = _value_or_one_line(parse_request, json.dumps(doc).encode(), "execjob_begin")
    assert req is None or isinstance(req.mps, bool)  # type: ignore[attr-defined]


@PARSER
@given(st.one_of(st.text(max_size=40), mutated("(pbshost[3]:ncpus=2:nmigs=1+pbshost[7]:ngpus=1)")))
def test_the_hook_requests_exec_vnode_with_mig_instances_hostile(text: str) -> None:
    """execjob_begin's exec_vnode (ngpus and nmigs per vnode): shares with small counts, or one line."""
    from gpuslurm.pbs.request import MAX_NGPUS, parse_request

    doc = {"format": 1, "event": "execjob_begin", "hostname": "pbshost", "job_id": "1.h", "euser": "u",
           "exec_vnode": text}
    req = _value_or_one_line(parse_request, json.dumps(doc).encode(), "execjob_begin")
    if req is not None:
        from gpuslurm.pbs.request import local_shares

        for share in local_shares(req):  # type: ignore[arg-type]
            assert 0 <= share.ngpus <= MAX_NGPUS and 0 <= share.nmigs <= MAX_NGPUS
            assert share.ngpus or share.nmigs
