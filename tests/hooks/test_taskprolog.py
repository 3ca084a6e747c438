"""The task prolog's export lines, on the replayed DGX H100 and the MIG bundle."""

from __future__ import annotations

import io
from pathlib import Path

from tests.helpers.hook_helpers import make_site

from gpuslurm.hooks.log import HookLog
from gpuslurm.slurm.hooks import run_task_prolog, task_prolog_lines


def exports(lines: list[str]) -> dict[str, str]:
    out = {}
    for line in lines:
        assert line.startswith("export ") and "\n" not in line
        name, _, value = line[len("export "):].partition("=")
        out[name] = value
    return out


def test_slurms_cuda_visible_devices_is_kept(tmp_path: Path) -> None:
    site = make_site(tmp_path)
    env = site.environ(gpus="4,5,6,7", CUDA_VISIBLE_DEVICES="0,1,2,3", SLURM_LOCALID="5")
    got = exports(task_prolog_lines(env))
    assert "CUDA_VISIBLE_DEVICES" not in got
    assert got["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    assert got["GPUSLURM_GPU_UUIDS"] == ",".join(site.uuids[4:8])
    # local task 5 of 4 GPUs: the job's second GPU, index 5, on socket 1
    assert got["GPUSLURM_LOCAL_GPU"] == "1"
    assert got["GPUSLURM_GPU_UUID"] == site.uuids[5]
    assert got["GPUSLURM_NUMA_NODE"] == "1"
    assert got["GPUSLURM_GPU_CPUS"] == "56-111,168-223"


def test_unset_cuda_visible_devices_becomes_uuids_and_user_order_is_kept(tmp_path: Path) -> None:
    site = make_site(tmp_path)
    env = site.environ(gpus="2,0", CUDA_DEVICE_ORDER="FASTEST_FIRST")
    got = exports(task_prolog_lines(env))
    assert got["CUDA_VISIBLE_DEVICES"] == f"{site.uuids[2]},{site.uuids[0]}"
    assert "CUDA_DEVICE_ORDER" not in got
    assert got["GPUSLURM_GPU_UUID"] == site.uuids[2]
    assert got["GPUSLURM_GPU_CPUS"] == "0-55,112-167"


def test_step_gpus_win_over_job_gpus(tmp_path: Path) -> None:
    site = make_site(tmp_path)
    got = exports(task_prolog_lines(site.environ(gpus="0-7", SLURM_STEP_GPUS="6")))
    assert got["GPUSLURM_GPU_UUIDS"] == site.uuids[6]


def test_mig_devices_are_named_by_mig_uuid() -> None:
    env = {"GPUSLURM_CAPTURE": "a100-mig", "SLURM_JOB_ID": "5", "SLURM_JOB_GPUS": "0"}
    got = exports(task_prolog_lines(env))
    assert got["CUDA_VISIBLE_DEVICES"].startswith("MIG-")
    assert got["GPUSLURM_GPU_UUID"] == got["CUDA_VISIBLE_DEVICES"]


def test_no_gpus_no_lines(tmp_path: Path) -> None:
    site = make_site(tmp_path)
    out = io.StringIO()
    assert run_task_prolog(site.environ(gpus=None), out) == 0
    assert out.getvalue() == ""


def test_errors_never_fail_the_task(tmp_path: Path) -> None:
    site = make_site(tmp_path)
    out, err = io.StringIO(), io.StringIO()
    env = site.environ(gpus="12")  # out of range on an 8-GPU node
    assert run_task_prolog(env, out, HookLog("task-prolog", stream=err, use_syslog=False)) == 0
    assert out.getvalue() == ""
    assert "GPU index 12 is out of range" in err.getvalue()
    env = site.environ(GPUSLURM_CAPTURE=str(tmp_path / "nowhere"))
    assert run_task_prolog(env, out, HookLog("task-prolog", stream=err, use_syslog=False)) == 0
    assert out.getvalue() == ""


def test_output_is_the_lines(tmp_path: Path) -> None:
    site = make_site(tmp_path)
    out = io.StringIO()
    assert run_task_prolog(site.environ(gpus="3"), out) == 0
    assert out.getvalue().splitlines() == task_prolog_lines(site.environ(gpus="3"))
    assert out.getvalue().endswith("\n")
