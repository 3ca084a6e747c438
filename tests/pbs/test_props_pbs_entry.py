"""Hostile input to the PBS hook's gpuslurm side (gpuslurm.pbs.entry): exit 2 and one line.

Whatever arrives on stdin (random bytes, non-UTF-8, a huge or deeply nested JSON, ids with ``..``,
``/`` or a line break), the answer is exit 0 with a JSON answer or exit 2 with one line on stderr
and nothing on stdout; never a traceback (exit 70) and never a file outside the jobs directory.
"""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from tests.helpers.props_hostile import mutated, one_line

from gpuslurm.pbs.entry import main
from gpuslurm.pbs.request import EVENTS, MAX_REQUEST_BYTES

GOOD = {"format": 1, "event": "execjob_end", "hostname": "pbshost", "job_id": "12.pbshost",
        "euser": "root", "exec_vnode": "(pbshost[0]:ncpus=4:ngpus=2)", "exec_host": "pbshost/0*4"}


@pytest.fixture(autouse=True)
def site(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path_factory.mktemp("pbs-props")
    config = root / "gpuslurm.toml"
    config.write_text(f'[paths]\nrun_dir = "{root}/run"\nstate_dir = "{root}/state"\n'
                      f'cgroup_root = "{root}/no-cgroup"\n')
    monkeypatch.setenv("GPUSLURM_CONFIG", str(config))
    monkeypatch.setenv("GPUSLURM_CAPTURE", "dgx-h100")
    return root


def call(event: str, data: bytes) -> tuple[int, str, list[str]]:
    out, err = io.StringIO(), io.StringIO()
    rc = main([event], io.BytesIO(data), out, err)
    return rc, out.getvalue(), err.getvalue().splitlines()


def refused(event: str, data: bytes) -> str:
    rc, out, lines = call(event, data)
    assert (rc, out) == (2, ""), (rc, out, lines)
    assert len(lines) == 1 and one_line(lines[0]), lines
    return lines[0]


@given(event=st.sampled_from(EVENTS), data=st.binary(max_size=600))
def test_random_bytes_are_exit_2_and_one_line(event: str, data: bytes) -> None:
    refused(event, data)


@given(job_id=mutated("12.pbshost", edits=2), user=mutated("root", edits=1),
       exec_vnode=mutated("(pbshost[0]:ncpus=4:ngpus=2)", edits=2))
def test_mutated_fields_are_answered_or_refused_never_a_traceback(job_id: str, user: str,
                                                                  exec_vnode: str) -> None:
    doc = {**GOOD, "job_id": job_id, "euser": user, "exec_vnode": exec_vnode}
    rc, out, lines = call("execjob_end", json.dumps(doc).encode())
    if rc == 0:
        assert json.loads(out)["accept"] is True  # execjob_end never refuses
        assert ".." not in job_id and "/" not in job_id
    else:
        assert (rc, out) == (2, "") and len(lines) >= 1 and one_line(lines[-1]), (rc, lines)


@pytest.mark.parametrize("job_id", ["../12.pbshost", "12.pbshost/../../etc", "..", "12..pbshost",
                                    "12.pbshost\n13.x", "12.pbs host", "-1.pbshost", "１２.pbshost",
                                    "12." + "a" * 300])
def test_ids_a_path_could_be_built_from_are_refused(job_id: str) -> None:
    assert "job_id" in refused("execjob_end", json.dumps({**GOOD, "job_id": job_id}).encode())


def test_huge_deep_and_undecodable_requests_are_refused() -> None:
    assert "more than" in refused("execjob_begin", b" " * MAX_REQUEST_BYTES + b"{}")
    assert "nested too deep" in refused("execjob_end", b"[" * 200_000) \
        or "not valid JSON" in refused("execjob_end", b"[" * 200_000)
    assert "not UTF-8" in refused("execjob_end", json.dumps(GOOD).encode().replace(b"root", b"r\xffot"))
    huge_vnode = json.dumps({**GOOD, "exec_vnode": "(a:ngpus=1)+" * 40_000 + "(a:ngpus=1)"}).encode()
    assert "exec_vnode" in refused("execjob_end", huge_vnode)


def test_the_event_word_is_checked_before_anything_is_read() -> None:
    rc, out, lines = call("queuejob", json.dumps(GOOD).encode())
    assert (rc, out) == (2, "") and lines[0].startswith("usage:")
