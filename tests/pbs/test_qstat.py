"""qstat -f -F json and pbsnodes -av -F json, as OpenPBS 23.06 printed them in the test cluster."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from gpuslurm.errors import InputError
from gpuslurm.hw.source import load_node
from gpuslurm.pbs.qstat import (
    VnodeShare,
    parse_exec_host,
    parse_exec_vnode,
    parse_pbs_time,
    parse_pbsnodes_json,
    parse_qstat_json,
)
from gpuslurm.pbs.scheduler import job_name, vnode_gpus

DATA = Path(__file__).parent / "data"
QSTAT = (DATA / "qstat-f-json.json").read_text()
PBSNODES = (DATA / "pbsnodes-av-json-offline.json").read_text()


def test_recorded_qstat_gives_the_running_jobs() -> None:
    jobs = parse_qstat_json(QSTAT)
    assert [(j.job_id, j.user, j.state, j.queue, j.ngpus, j.session_id) for j in jobs] == [
        ("0.pbshost", "gpuspbs1", "R", "workq", 2, 31845),
        ("1.pbshost", "gpuspbs1", "R", "workq", 0, 31846),
    ]
    gpu_job = jobs[0]
    assert gpu_job.exec_hosts == ("pbshost",)
    assert gpu_job.chunks == ((VnodeShare("pbshost[0]", (("ncpus", "4"), ("ngpus", "2"))),),)
    assert gpu_job.gpus_on("pbshost") == 2 and gpu_job.gpus_on("other") == 0
    assert gpu_job.runs_on("pbshost") and not gpu_job.runs_on("pbshost2")
    assert gpu_job.account is None  # the default project is no account
    assert gpu_job.start == time.mktime((2026, 11, 23, 16, 17, 56, 0, 0, -1))


def test_no_jobs_is_an_empty_answer() -> None:
    assert parse_qstat_json('{"timestamp": 1, "pbs_version": "23.06.06", "pbs_server": "pbshost"}') == ()


def test_account_and_project() -> None:
    doc = json.loads(QSTAT)
    doc["Jobs"]["0.pbshost"]["project"] = "physics"
    assert parse_qstat_json(json.dumps(doc))[0].account == "physics"
    doc["Jobs"]["0.pbshost"]["Account_Name"] = "chem\u2028x"
    assert parse_qstat_json(json.dumps(doc))[0].account == "chem x"


@pytest.mark.parametrize(("change", "says"), [
    (lambda d: d["Jobs"].update({"../x": {}}), "not a PBS job id"),
    (lambda d: d["Jobs"].update({"12": {}}), "not a PBS job id"),
    (lambda d: d["Jobs"]["0.pbshost"].update(exec_vnode="pbshost[0]:ngpus=2"), "must start with '('"),
    (lambda d: d["Jobs"]["0.pbshost"].update(exec_vnode="(pbshost[0]:ngpus=99999999)"), "not a count"),
    (lambda d: d["Jobs"]["0.pbshost"].update(exec_host="pbshost"), "not host/slot"),
    (lambda d: d["Jobs"]["0.pbshost"].update(stime="yesterday"), "not a PBS time"),
    (lambda d: d["Jobs"]["0.pbshost"]["Resource_List"].update(ngpus=-1), "non-negative integer"),
    (lambda d: d["Jobs"]["0.pbshost"].update(session_id="12"), "non-negative integer"),
    (lambda d: d["Jobs"]["0.pbshost"].update(euser="a b"), "no user name"),
    (lambda d: d.update(Jobs=[]), "is not an object"),
])
def test_a_broken_document_is_one_line_naming_the_job(change: object, says: str) -> None:
    doc = json.loads(QSTAT)
    change(doc)  # type: ignore[operator]
    with pytest.raises(InputError) as caught:
        parse_qstat_json(json.dumps(doc))
    message = str(caught.value)
    assert says in message and len(message.splitlines()) == 1
    assert message.startswith("qstat -f -F json: ")


def test_not_json_and_too_deep() -> None:
    for text in ("", "[", "[]", "[" * 100_000 + "]" * 100_000):
        with pytest.raises(InputError):
            parse_qstat_json(text)


def test_exec_vnode_split_chunks() -> None:
    chunks = parse_exec_vnode("(n1[0]:ncpus=2:ngpus=1+n1[1]:ngpus=1)+(n2:ncpus=1)")
    assert [[s.vnode for s in c] for c in chunks] == [["n1[0]", "n1[1]"], ["n2"]]
    assert [s.host for s in chunks[0]] == ["n1", "n1"]
    assert parse_exec_vnode("") == ()
    for bad in ("(", "()", "(a:ngpus)", "(a)+", "(a)x", "(a[x])", "(a b)"):
        with pytest.raises(InputError):
            parse_exec_vnode(bad)


def test_exec_host() -> None:
    assert parse_exec_host("pbshost/0*4+n2/1") == ("pbshost", "n2")
    for bad in ("", "pbshost", "pbshost[0]/1", "/1"):
        with pytest.raises(InputError):
            parse_exec_host(bad)


def test_pbs_time() -> None:
    assert parse_pbs_time("Thu Jan  1 00:00:00 1970") == time.mktime((1970, 1, 1, 0, 0, 0, 0, 0, -1))
    for bad in ("Mon Foo 23 16:17:56 2026", "Mon Nov 32 16:17:56 2026", "Mon Nov 23 16:17 2026",
                "Mon Nov 23 16:17:56 99999", "Mon Nov ١ 16:17:56 2026"):
        with pytest.raises(InputError):
            parse_pbs_time(bad)


def test_recorded_pbsnodes_offline_with_comment() -> None:
    nodes = {n.name: n for n in parse_pbsnodes_json(PBSNODES)}
    assert set(nodes) == {"pbshost", "pbshost[0]", "pbshost[1]"}
    first = nodes["pbshost[0]"]
    assert first.states == ("offline",) and first.comment == "gpuslurm test: GPU-x xid 79"
    assert (first.host, first.ngpus, first.ngpus_assigned) == ("pbshost", 4, 2)
    assert first.jobs == ("0.pbshost", "1.pbshost")
    assert nodes["pbshost"].ngpus == 0


def test_vnode_gpus_are_known_only_when_the_job_holds_the_whole_vnode() -> None:
    node = load_node("dgx-h100")  # 8 GPUs, 4 on each of NUMA nodes 0 and 1
    job = parse_qstat_json(QSTAT)[0]
    assert vnode_gpus(job, "pbshost", node) == ()  # 2 of the 4 GPUs of pbshost[0]: PBS did not say which
    whole = job._replace(chunks=parse_exec_vnode("(pbshost[1]:ncpus=4:ngpus=4)"))
    numa1 = [g.uuid for g in sorted(node.gpus, key=lambda g: g.minor) if g.numa_node == 1]
    assert len(numa1) == 4 and sorted(vnode_gpus(whole, "pbshost", node)) == sorted(numa1)
    assert vnode_gpus(whole, "elsewhere", node) == ()


def test_a_finished_job_s_name_through_qstat_x(tmp_path: Path) -> None:
    """[notify]: the job's name from ``qstat -x -f -F json ID`` (the user's text, unchanged), for
    the job asked only."""
    doc = json.loads(QSTAT)
    first, second = list(doc["Jobs"])
    doc["Jobs"][first]["Job_Name"] = 'x "y"\n{{ z }}\x1b[31m'
    doc["Jobs"][second]["Job_Name"] = "other"
    answer = tmp_path / "answer.json"
    answer.write_text(json.dumps(doc))
    fake = tmp_path / "qstat"
    fake.write_text(f'#!/bin/sh\necho "$@" > {tmp_path}/args\ncat {answer}\n')
    fake.chmod(0o755)
    assert job_name(first, qstat=str(fake), timeout=5) == 'x "y"\n{{ z }}\x1b[31m'
    assert (tmp_path / "args").read_text().split() == ["-x", "-f", "-F", "json", first]
    assert job_name("9.pbshost", qstat=str(fake), timeout=5) is None
