"""The PBS hook's request: parsed, bounded and checked (gpuslurm.pbs.request); no PBS needed."""

from __future__ import annotations

import io
import json

import pytest

from gpuslurm.errors import InputError
from gpuslurm.pbs.request import (
    MAX_REQUEST_BYTES,
    PbsRequest,
    VnodeShare,
    local_shares,
    parse_exec_vnode,
    parse_request,
    read_request,
)

BEGIN = {"format": 1, "event": "execjob_begin", "hostname": "pbshost", "job_id": "12.pbshost",
         "euser": "alice", "exec_vnode": "(pbshost[0]:ncpus=4:ngpus=2)", "exec_host": "pbshost/0*4",
         "vnodes": ["pbshost[0]"], "pbs_cgroups": False}


def parse(doc: object, event: str = "execjob_begin") -> PbsRequest:
    return parse_request(json.dumps(doc).encode(), event)


def test_a_begin_request_is_read_whole() -> None:
    req = parse(BEGIN)
    assert req == PbsRequest("execjob_begin", "pbshost", "12.pbshost", "alice",
                             "(pbshost[0]:ncpus=4:ngpus=2)", "pbshost/0*4", ("pbshost[0]",), None, False)
    assert local_shares(req) == (VnodeShare("pbshost[0]", 2),)


def test_unknown_keys_are_ignored_so_a_newer_hook_is_read() -> None:
    assert parse({**BEGIN, "something_new": [1, 2]}).job_id == "12.pbshost"


def test_a_chunk_split_across_vnodes_counts_per_vnode_and_only_this_hosts_chunks() -> None:
    req = parse({**BEGIN, "exec_vnode": "(pbshost[0]:ncpus=2:ngpus=1+pbshost[1]:ncpus=2:ngpus=1)"
                                        "+(other[0]:ngpus=4)+(pbshost[1]:ngpus=2:mem=4gb)+(pbshost[0]:ncpus=1)",
                 "exec_host": "pbshost/0*4+other/0*4+pbshost.example.org/1+pbshost/2"})
    assert local_shares(req) == (VnodeShare("pbshost[0]", 1), VnodeShare("pbshost[1]", 3))


def test_without_exec_host_every_chunk_is_this_hosts() -> None:
    req = parse({**BEGIN, "exec_vnode": "(a:ngpus=1)+(b:ngpus=2)", "exec_host": None})
    assert local_shares(req) == (VnodeShare("a", 1), VnodeShare("b", 2))


def test_exec_vnode_grammar() -> None:
    assert parse_exec_vnode("(h[0]:ncpus=1+h[1]:ngpus=2)+(h:mem=1kb)") == [
        [("h[0]", {"ncpus": "1"}), ("h[1]", {"ngpus": "2"})], [("h", {"mem": "1kb"})]]


@pytest.mark.parametrize("change, says", [
    ({"job_id": "../12.pbshost"}, "not a PBS job id"),
    ({"job_id": "12.pbs/host"}, "not a PBS job id"),
    ({"job_id": "12"}, "not a PBS job id"),  # a Slurm id: not what PBS sends
    ({"job_id": "12.pbshost\n13"}, "printable line"),
    ({"euser": "-rf"}, "not a user name"),
    ({"euser": "a b"}, "not a user name"),
    ({"hostname": "../x"}, "not a PBS node name"),
    ({"exec_vnode": "(pbshost[0]:ngpus=99999999)"}, "not a GPU count"),
    ({"exec_vnode": "(pbshost[0]:ngpus=-1)"}, "not a GPU count"),
    ({"exec_vnode": "(pbshost[0]:ngpus=²)"}, "not a GPU count"),
    ({"exec_vnode": "((pbshost[0]:ngpus=1))"}, "unbalanced"),
    ({"exec_vnode": "pbshost[0]:ngpus=1"}, "not in parentheses"),
    ({"exec_vnode": "(pbshost[0]:ngpus)"}, "not resource=value"),
    ({"exec_vnode": "(../x:ngpus=1)"}, "not a vnode name"),
    ({"vnodes": ["ok", 3]}, "not a PBS vnode name"),
    ({"vnodes": "pbshost"}, "must be a list"),
    ({"pid": True}, "not a process id"),
    ({"pid": 1}, "not a process id"),
    ({"pbs_cgroups": "yes"}, "true or false"),
    ({"format": 2}, "format 2"),
    ({"event": "execjob_end"}, "is not the execjob_begin"),
    ({"euser": None}, "euser is missing"),
])
def test_bad_fields_are_refused_naming_them(change: dict[str, object], says: str) -> None:
    with pytest.raises(InputError, match=says) as info:
        parse({**BEGIN, **change})
    assert len(str(info.value).splitlines()) == 1


def test_bounded_read_and_undecodable_input() -> None:
    with pytest.raises(InputError, match="more than"):
        read_request(io.BytesIO(b" " * (MAX_REQUEST_BYTES + 1)), "execjob_end")
    with pytest.raises(InputError, match="not UTF-8"):
        parse_request(b'{"format": 1, "event": "\xff"}', "execjob_end")
    with pytest.raises(InputError, match=r"nested too deep|not valid JSON"):
        parse_request(b"[" * 100_000, "execjob_end")
    with pytest.raises(InputError, match="unknown event"):
        parse_request(b"{}", "queuejob")


def test_startup_needs_no_job() -> None:
    req = parse({"format": 1, "event": "exechost_startup", "hostname": "pbshost"}, "exechost_startup")
    assert req.job_id is None and local_shares(req) == ()


@pytest.mark.parametrize(("value", "asked"), [
    (None, False), (True, True), (False, False), ("True", True), ("False", False), ("true", True),
    ("1", True), ("0", False), ("yes", True), ("off", False)])
def test_the_mps_resource_as_pbs_spells_a_boolean(value: object, asked: bool) -> None:
    assert parse({**BEGIN, "mps": value}).mps is asked


@pytest.mark.parametrize("value", ["lots", "50", "2", "truefalse", "true" * 40, 1, [True], {"a": 1},
                                   "tr\x00ue"])
def test_a_bad_mps_value_is_one_line_naming_the_resource(value: object) -> None:
    with pytest.raises(InputError, match=r"gpuslurm_mps must be true or false, not ") as info:
        parse({**BEGIN, "mps": value})
    assert "\n" not in str(info.value) and len(str(info.value)) < 400


def test_mig_instances_are_counted_per_vnode_beside_whole_gpus() -> None:
    req = parse({**BEGIN, "exec_host": "pbshost/0*2+pbshost/1",
                 "exec_vnode": "(pbshost[3]:ncpus=2:nmigs=1+pbshost[7]:ngpus=1)+(pbshost[3]:nmigs=2)"})
    assert local_shares(req) == (VnodeShare("pbshost[3]", 0, 3), VnodeShare("pbshost[7]", 1, 0))
    with pytest.raises(InputError, match=r"nmigs='-1' on pbshost\[3\] is not a GPU count"):
        parse({**BEGIN, "exec_vnode": "(pbshost[3]:nmigs=-1)"})
