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


def _hostile_job(name: str, comment: str = "") -> str:
    """Mallory's job 107 as scontrol 22.05 prints it, her name and comment verbatim."""
    return (f"\nJobId=107 JobName={name}\n   UserId=mallory(1066) GroupId=mallory(1066) MCS_label=N/A\n"
            "   JobState=RUNNING Reason=None Dependency=(null)\n   NodeList=l40s01\n   JOB_GRES=gpu:1\n"
            "     Nodes=l40s01 CPU_IDs=10-11 Mem=0 GRES=gpu:nvidia_l40s:1(IDX:2)\n"
            f"   Command=/home/mallory/x.sh\n   Comment={comment}\n   TresPerNode=gres:gpu:1\n")


def test_a_job_name_holding_jobid_on_its_line_takes_no_record() -> None:
    """`-J 'x JobId=101 UserId=mallory(1066) JobState=RUNNING'`: scontrol prints it on the job's
    first line; read anywhere on a line, it used to start job 101 again with mallory's lines."""
    text = RECORDED.read_text() + _hostile_job("x JobId=101 UserId=mallory(1066) JobState=RUNNING")
    jobs = {j.job_id: j for j in parse_job_detail(text)}
    assert jobs["101"].user == "alice" and jobs["101"].on("l40s01").gpu_idx == (0, 1)  # type: ignore[union-attr]
    assert jobs["107"].user == "mallory" and jobs["107"].on("l40s01").gpu_idx == (2,)  # type: ignore[union-attr]


def test_forged_lines_in_a_name_make_the_victim_ambiguous_not_hers() -> None:
    """Slurm 22.05 keeps newlines in names and comments: mallory writes job 101's first lines
    herself, with all four GPUs. Two records for 101: both are left out (a recording cannot
    tell which is Slurm's), and her forged user and GPUs reach no row."""
    forged = ("x\nJobId=101 JobName=good\n   UserId=mallory(1066) GroupId=mallory(1066)\n"
              "   JobState=RUNNING\n     Nodes=l40s01 CPU_IDs=0-7 Mem=0 GRES=gpu:4(IDX:0-3)")
    jobs = parse_job_detail(RECORDED.read_text() + _hostile_job(forged))
    assert "101" not in {j.job_id for j in jobs} and jobs.doubtful == ("101",)
    assert all(j.user != "mallory" for j in jobs)  # 107's own lines went to the forged record


def test_contradicting_lines_leave_the_job_out() -> None:
    """A comment that adds a second JobState= or UserId= line to the job's own record."""
    jobs = parse_job_detail(RECORDED.read_text() + _hostile_job("x", "c\n   UserId=alice(1001)"))
    assert "107" not in {j.job_id for j in jobs} and jobs.doubtful == ("107",)


def test_a_second_detail_line_for_the_node_makes_the_share_unknown() -> None:
    """Her comment adds a detail line for her own job claiming other CPUs: which is Slurm's?"""
    text = RECORDED.read_text() + _hostile_job(
        "x", "c\n     Nodes=l40s01 CPU_IDs=0-3 Mem=0 GRES=gpu:nvidia_l40s:1(IDX:2)")
    jobs = {j.job_id: j for j in parse_job_detail(text)}
    assert jobs["107"].on("l40s01") is None


def test_live_jobs_trust_squeue_and_each_jobs_own_text() -> None:
    """Live: ids, users and GPU IDX from squeue --json; CPUs from `scontrol show -d job ID`, only
    when that text names the same GPUs and has one line for the node."""
    from gpuslurm.slurm.job_detail import live_jobs
    from gpuslurm.slurm.squeue import SqueueJob

    def sq(job_id: str, user: str, detail: str) -> SqueueJob:
        return SqueueJob(job_id, user, 1000, None, "RUNNING", ("l40s01",), 0.0, (detail,))

    texts = {"101": "JobId=101 JobName=good\n   UserId=alice(1001)\n   JobState=RUNNING\n"
                    "     Nodes=l40s01 CPU_IDs=0-3 Mem=0 GRES=gpu:nvidia_l40s:2(IDX:0-1)\n",
             "107": _hostile_job("x\nJobId=108 JobName=y").lstrip("\n")}
    jobs = live_jobs([sq("101", "alice", "gpu:nvidia_l40s:2(IDX:0-1)"),
                      sq("107", "mallory", "gpu:nvidia_l40s:1(IDX:2)")], "l40s01", texts.__getitem__)
    got = {j.job_id: (j.user, j.shares[0].cpu_ids, j.shares[0].gpu_idx) for j in jobs}
    assert got == {"101": ("alice", (0, 1, 2, 3), (0, 1)), "107": ("mallory", (), (2,))}


@given(st.text(max_size=80))
def test_any_name_leaves_the_other_jobs_as_they_were(name: str) -> None:
    """Whatever her job's name holds, every other job reads the same: either exactly as without
    her job, or (her text copied a job's first line) left out as ambiguous — never changed."""
    clean = {j.job_id: j for j in parse_job_detail(RECORDED.read_text())}
    try:
        jobs = parse_job_detail(RECORDED.read_text() + _hostile_job(name))
    except InputError:
        return  # a forged detail line that does not parse: one line, exit 2
    for j in jobs:
        if j.job_id in clean:
            assert j == clean[j.job_id] or j.job_id in name
    assert set(clean) - {j.job_id for j in jobs} <= set(jobs.doubtful)


def test_a_recording_of_another_node_is_bad_input_naming_its_nodes(
        real_fixtures: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # the real dual A5000: a recording made on a5000-01 read for the bundle's own name said
    # "0 GPU job(s)" and exit 0, as if the node were empty
    bundle = tmp_path / "a5000"
    bundle.mkdir()
    xml = real_fixtures / "nvidia-smi-q-x" / "dual_a5000-v13.xml"
    (bundle / "nvidia-smi-q.xml").write_text(xml.read_text())
    (bundle / "lscpu.csv").write_text("# CPU,Core,Socket,Node\n0,0,0,0\n1,1,0,0\n2,2,0,0\n3,3,0,0\n")
    rec = tmp_path / "rec.txt"
    rec.write_text("JobId=7 JobName=train\n   UserId=alice(1001) GroupId=alice(1001) MCS_label=N/A\n"
                   "   JobState=RUNNING Reason=None Dependency=(null)\n   NodeList=a5000-01\n"
                   "     Nodes=a5000-01 CPU_IDs=0-1 Mem=0 GRES=gpu:nvidia_rtx_a5000:1(IDX:1)\n"
                   "JobId=8 JobName=cpu\n   UserId=bob(1002) GroupId=bob(1002) MCS_label=N/A\n"
                   "   JobState=RUNNING Reason=None Dependency=(null)\n   NodeList=cpu-01\n"
                   "     Nodes=cpu-01 CPU_IDs=0-1 Mem=0\n")
    assert main(["placement", "--from", str(bundle), "--input", str(rec)]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err == ("gpuslurm: scontrol show -d job: no running GPU job on a5000; its running "
                                 "GPU jobs are on a5000-01 (name the node with --node)\n")
    assert main(["placement", "--from", str(bundle), "--input", str(rec), "--node", "a5000-01"]) == 0
    assert "a5000-01: 1 GPU job(s)" in capsys.readouterr().out
    # a recording with no running GPU job anywhere is a true "0 GPU job(s)"
    rec.write_text(rec.read_text().split("JobId=8")[0].replace("RUNNING", "PENDING"))
    assert main(["placement", "--from", str(bundle), "--input", str(rec)]) == 0
    assert "a5000: 0 GPU job(s)" in capsys.readouterr().out


def test_a_whole_cluster_recording_names_a_bounded_list_of_nodes(tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    rec = tmp_path / "rec.txt"
    rec.write_text("".join(f"JobId={i}\n   JobState=RUNNING\n"
                           f"     Nodes=gn{i:03d} CPU_IDs=0 Mem=0 GRES=gpu:1(IDX:0)\n" for i in range(100)))
    assert main(["placement", "--from", "l40s-4x", "--node", "l40s01", "--input", str(rec)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "gn000,gn001," in err and "gn007 and 92 more" in err
