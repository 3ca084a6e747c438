"""``gpuslurm placement``: scontrol's detail lines parsed, IDX and CPU_IDs mapped on l40s-4x."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner
from hypothesis import given
from hypothesis import strategies as st

from gpuslurm.cli.main import cli, main
from gpuslurm.errors import InputError
from gpuslurm.hw.source import load_node
from gpuslurm.place.quality import os_cpus_of_abstract
from gpuslurm.ranges import format_ranges
from gpuslurm.slurm.job_detail import parse_job_detail
from gpuslurm.topo.cores import LayoutError

RECORDED = Path(__file__).parent / "data" / "scontrol-show-d-job-l40s.txt"


def test_parse_recorded_output() -> None:
    jobs = {j.job_id: j for j in parse_job_detail(RECORDED.read_text())}
    assert set(jobs) == {"101", "102", "103", "104", "105", "106"}
    assert jobs["101"].user == "alice" and jobs["101"].state == "RUNNING"
    share = jobs["103"].on("l40s01")
    assert share is not None and share.cpu_ids == (6, 7, 64, 65) and share.gpu_idx == (1, 2)
    assert jobs["104"].on("l40s01").gpu_idx == ()  # type: ignore[union-attr]
    assert jobs["105"].shares == () and jobs["106"].on("other02") is not None


@given(st.lists(st.integers(0, 255), min_size=1, unique=True), st.lists(st.integers(0, 15), unique=True),
       st.sampled_from(["gpu", "gpu:nvidia_l40s", "gpu:a100"]))
def test_detail_line_round_trip(cpus: list[int], idx: list[int], kind: str) -> None:
    gres = f"GRES={kind}:{len(idx)}(IDX:{format_ranges(idx)})" if idx else "GRES="
    text = (f"JobId=7 JobName=x\n   JobState=RUNNING\n"
            f"     Nodes=n[1-2] CPU_IDs={format_ranges(cpus)} Mem=0 {gres}\n")
    (job,) = parse_job_detail(text)
    assert job.shares[0].nodes == ("n1", "n2")
    assert job.shares[0].cpu_ids == tuple(sorted(cpus)) and job.shares[0].gpu_idx == tuple(sorted(idx))


def test_bad_detail_line_names_the_job() -> None:
    with pytest.raises(InputError, match="job 9"):
        parse_job_detail("JobId=9\n     Nodes=n1 CPU_IDs=3-1 Mem=0 GRES=gpu:1(IDX:0)\n")


def test_abstract_cpus_on_interleaved_hyperthreaded_node() -> None:
    node = load_node("l40s-4x")  # even OS CPUs socket 0, odd socket 1, sibling of n is n + 64
    assert os_cpus_of_abstract(node, [0, 1, 2, 3]) == (0, 2, 64, 66)
    assert os_cpus_of_abstract(node, [64, 65]) == (1, 65)  # Slurm core 32: socket 1's first
    with pytest.raises(LayoutError):
        os_cpus_of_abstract(node, [128])


def test_placement_command_on_l40s() -> None:
    result = CliRunner().invoke(cli, ["placement", "--from", "l40s-4x", "--node", "l40s01",
                                      "--input", str(RECORDED), "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.output)
    rows = {r["job"]: r for r in doc["jobs"]}
    assert set(rows) == {"101", "102", "103"}  # running, with GPUs, on this node
    assert [(g["index"], g["minor"]) for g in rows["101"]["gpus"]] == [(0, 2), (1, 3)]  # IDX = position
    assert rows["101"]["cpus"] == "0,2,64,66" and rows["101"]["numa_affine"] == "yes"
    assert rows["101"]["weakest_link"] == "PIX"
    assert rows["102"]["numa_affine"] == "no"
    assert rows["102"]["gpu_numa"] == [1] and rows["102"]["cpu_numa"] == [0]
    assert rows["103"]["weakest_link"] == "SYS" and rows["103"]["numa_affine"] == "yes"
    assert doc["summary"] == ("l40s01: 3 GPU job(s); NUMA-affine 2, partly 0, misplaced 1, unknown 0; "
                              "weakest links PIX, SYS")
    text = CliRunner().invoke(cli, ["placement", "--from", "l40s-4x", "--node", "l40s01", "--input",
                                    str(RECORDED)])
    assert text.exit_code == 0 and "     102 bob        3" in text.output and " no " in text.output


def test_idx_beyond_the_node_is_bad_input(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rec = tmp_path / "rec.txt"
    rec.write_text("JobId=1\n   JobState=RUNNING\n     Nodes=l40s01 CPU_IDs=0 Mem=0 GRES=gpu:1(IDX:7)\n")
    assert main(["placement", "--from", "l40s-4x", "--node", "l40s01", "--input", str(rec)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "GPU IDX 7 but l40s01 has 4 gpu GRES" in err
