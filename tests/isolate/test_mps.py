"""MPS decisions and command sequences (pure), on prolog environments recorded from Slurm 22.05.8.

The environments below are what the test cluster's prolog saw (``env`` into a file) for jobs
submitted with ``--gres=mps:50`` (gres.conf from ``gres-conf --mps 100``), ``--comment`` and
``--constraint``; only Slurm's variables are kept.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from gpuslurm.config import MpsConfig
from gpuslurm.errors import InputError
from gpuslurm.isolate.mps import (
    MpsDaemon,
    MpsStop,
    control_commands,
    daemon_env,
    state_from_dict,
    stuck_report,
)
from gpuslurm.isolate.mps_request import (
    MpsRequest,
    comment_words,
    constraint_features,
    job_dirs,
    job_gid,
    mps_exports,
    parse_percentage,
)
from gpuslurm.isolate.mps_request import mps_request as job_mps_request
from gpuslurm.slurm.hookenv import hook_job

COMMON = {"SLURMD_NODENAME": "vm", "SLURM_CLUSTER_NAME": "gpuslurm-test", "SLURM_JOB_CPUS_PER_NODE": "2",
          "SLURM_JOB_GID": "0", "SLURM_JOB_UID": "0", "SLURM_JOB_USER": "root",
          "SLURM_JOB_PARTITION": "gpu", "SLURM_SCRIPT_CONTEXT": "prolog_slurmd", "SLURM_UID": "0"}
# sbatch --gres=mps:50 (the GPU's mps Count=100): no SLURM_JOB_GRES, no GPU_DEVICE_ORDINAL.
GRES_MPS_50 = {**COMMON, "SLURM_JOB_ID": "1", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "50",
               "CUDA_VISIBLE_DEVICES": "0", "SLURM_JOB_GPUS": "0"}
# sbatch --gres=gpu:2 --comment "hello gpuslurm:mps x"
COMMENT = {**COMMON, "SLURM_JOB_ID": "2", "CUDA_VISIBLE_DEVICES": "4,5", "GPU_DEVICE_ORDINAL": "4,5",
           "SLURM_JOB_COMMENT": "hello gpuslurm:mps x", "SLURM_JOB_GPUS": "4,5"}
# sbatch --gres=gpu:1 --constraint=mps / --constraint="mps&foo"
FEATURE = {**COMMON, "SLURM_JOB_ID": "3", "CUDA_VISIBLE_DEVICES": "1", "SLURM_JOB_CONSTRAINTS": "mps",
           "SLURM_JOB_GPUS": "1"}
FEATURE_AND = {**FEATURE, "SLURM_JOB_ID": "4", "SLURM_JOB_CONSTRAINTS": "mps&foo"}
PLAIN_GPU = {**COMMON, "SLURM_JOB_ID": "5", "CUDA_VISIBLE_DEVICES": "6", "SLURM_JOB_GPUS": "6"}


def mps_request(env: dict[str, str], cfg: MpsConfig) -> MpsRequest | None:
    """What the prolog asks for a job whose Slurm hook environment is ``env`` (the Slurm adapter's
    HookJob, then the neutral request)."""
    job = hook_job(env)
    return job_mps_request(job.mps_share, job.comment, job.features, cfg)


ALL = MpsConfig(triggers=("gres", "comment", "feature"), active_thread_percentage=30)


def test_gres_mps_job_is_recognised_with_slurms_share_as_percentage() -> None:
    assert mps_request(GRES_MPS_50, MpsConfig()) == MpsRequest("gres", 50)
    assert mps_request(GRES_MPS_50, ALL) == MpsRequest("gres", 50)  # Slurm's share beats the config


def test_default_triggers_ignore_comment_and_feature() -> None:
    for env in (COMMENT, FEATURE, FEATURE_AND, PLAIN_GPU):
        assert mps_request(env, MpsConfig()) is None


def test_comment_and_feature_triggers_use_the_configured_percentage() -> None:
    assert mps_request(COMMENT, ALL) == MpsRequest("comment", 30)
    assert mps_request(FEATURE, ALL) == MpsRequest("feature", 30)
    assert mps_request(FEATURE_AND, ALL) == MpsRequest("feature", 30)
    assert mps_request(PLAIN_GPU, ALL) is None


def test_a_trigger_left_out_of_the_config_is_ignored() -> None:
    assert mps_request(GRES_MPS_50, MpsConfig(triggers=("comment",))) is None
    assert mps_request(COMMENT, MpsConfig(triggers=("gres", "feature"))) is None
    assert mps_request(FEATURE, MpsConfig(triggers=())) is None


@pytest.mark.parametrize(("comment", "wanted"), [
    ("gpuslurm:mps", True), ("run 7,gpuslurm:mps;x", True), ("  gpuslurm:mps  ", True),
    ("gpuslurm:mpsx", False), ("nogpuslurm:mps", False), ("GPUSLURM:MPS", False), ("", False),
])
def test_comment_token_is_a_whole_word(comment: str, wanted: bool) -> None:
    env = {**PLAIN_GPU, "SLURM_JOB_COMMENT": comment}
    assert (mps_request(env, ALL) is not None) is wanted
    assert ("gpuslurm:mps" in comment_words(comment)) is wanted


@pytest.mark.parametrize(("constraints", "names"), [
    ("mps", {"mps"}), ("mps&foo", {"mps", "foo"}), ("foo|mps", {"foo", "mps"}),
    ("[mps*2&ib]", {"mps", "ib"}), ("(mps|a100)&ib", {"mps", "a100", "ib"}), ("!mps&ib", {"ib"}),
    ("mpsx", {"mpsx"}), ("", set()),
])
def test_constraint_features(constraints: str, names: set[str]) -> None:
    assert constraint_features(constraints) == names


def test_an_empty_token_or_feature_never_matches() -> None:
    cfg = MpsConfig(triggers=("comment", "feature"), comment_token="", feature="")
    assert mps_request({**COMMENT, "SLURM_JOB_CONSTRAINTS": "a&b"}, cfg) is None


@pytest.mark.parametrize(("text", "value"), [("50", 50), ("100", 100), ("1", 1), ("12.5", 13)])
def test_percentage(text: str, value: int) -> None:
    assert parse_percentage(text) == value


@pytest.mark.parametrize("text", ["0", "101", "-5", "half", "nan", "inf"])
def test_bad_percentage_names_the_variable(text: str) -> None:
    with pytest.raises(InputError, match="CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"):
        mps_request({**GRES_MPS_50, "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": text}, MpsConfig())


def test_control_commands() -> None:
    assert control_commands(100, 0, 4) == []  # a fresh daemon's defaults: nothing to send
    assert control_commands(50, 0, 2) == ["set_default_active_thread_percentage 50"]
    assert control_commands(100, 4096, 2) == ["set_default_device_pinned_mem_limit 0 4096M",
                                              "set_default_device_pinned_mem_limit 1 4096M"]
    assert control_commands(25, 512, 1) == ["set_default_active_thread_percentage 25",
                                            "set_default_device_pinned_mem_limit 0 512M"]


def test_daemon_env_is_complete_and_nothing_else() -> None:
    env = daemon_env("/run/g/mps/7/pipe", "/run/g/mps/7/log", ["GPU-a", "MIG-b"], "/opt/nv/bin/ctl")
    assert env == {"CUDA_MPS_PIPE_DIRECTORY": "/run/g/mps/7/pipe",
                   "CUDA_MPS_LOG_DIRECTORY": "/run/g/mps/7/log",
                   "CUDA_VISIBLE_DEVICES": "GPU-a,MIG-b",
                   "PATH": "/opt/nv/bin:/usr/sbin:/usr/bin:/sbin:/bin"}
    assert daemon_env("/p", "/l", [], "/usr/bin/x")["PATH"] == "/usr/bin:/usr/sbin:/sbin:/bin"


def test_job_dirs_and_bad_job_ids() -> None:
    assert job_dirs("/run/gpuslurm", "12_3") == ("/run/gpuslurm/mps/12_3", "/run/gpuslurm/mps/12_3/pipe",
                                                 "/run/gpuslurm/mps/12_3/log")
    # PBS ids (gpuslurm.jobid): a job and an array subjob
    assert job_dirs("/run/gpuslurm", "12.pbshost").pipe == "/run/gpuslurm/mps/12.pbshost/pipe"
    assert job_dirs("/run/gpuslurm", "12[3].pbshost").job == "/run/gpuslurm/mps/12[3].pbshost"
    for bad in ("../1", "1/2", "", "12_", "x1", "12345678901", "12./x", "1.2/..", ".pbshost"):
        with pytest.raises(InputError, match="not a Slurm job id"):
            job_dirs("/run/gpuslurm", bad)


def test_job_gid_from_slurm_else_passwd() -> None:
    assert job_gid(hook_job({**PLAIN_GPU, "SLURM_JOB_UID": "0", "SLURM_JOB_USER": "root",
                             "SLURM_JOB_GID": "4242"}).gid, 0) == 4242
    assert job_gid(None, 0) == 0  # root's passwd entry
    with pytest.raises(InputError, match="SLURM_JOB_GID"):
        hook_job({**PLAIN_GPU, "SLURM_JOB_UID": "0", "SLURM_JOB_USER": "root", "SLURM_JOB_GID": "wheel"})
    with pytest.raises(InputError, match="no passwd entry"):
        job_gid(None, 4_000_000_000)


DAEMON = MpsDaemon("7", 1000, 1000, "/r/mps/7/pipe", "/r/mps/7/log", ("GPU-a",), "comment", 30, 99, 5)


def test_state_round_trip_and_validation() -> None:
    doc = dict(DAEMON._asdict(), uuids=list(DAEMON.uuids), version=1)
    assert state_from_dict(doc, "x") == DAEMON
    assert state_from_dict({**doc, "pid": None, "pid_start": None}, "x").pid is None
    for key, bad in (("uid", "1000"), ("uuids", [1]), ("pid", True), ("job_id", None)):
        with pytest.raises(InputError, match="x:"):
            state_from_dict({**doc, key: bad}, "x")
    with pytest.raises(InputError):
        state_from_dict([], "x")


def test_exports_only_for_a_pipe_directory_of_the_user(tmp_path: Path) -> None:
    run = tmp_path / "run"
    assert mps_exports(str(run), "7") == []
    assert mps_exports(str(run), None) == []
    assert mps_exports(str(run), "../7") == []
    pipe = run / "mps" / "7" / "pipe"
    pipe.mkdir(parents=True)
    assert mps_exports(str(run), "7") == [("CUDA_MPS_PIPE_DIRECTORY", str(pipe)),
                                          ("CUDA_MPS_LOG_DIRECTORY", str(run / "mps" / "7" / "log"))]
    assert mps_exports(str(run), "7", uid=os.getuid() + 1) == []  # someone else's
    pipe.rmdir()
    pipe.symlink_to(tmp_path)
    assert mps_exports(str(run), "7") == []


def test_a_daemon_that_survives_sigkill_is_reported_on_the_jobs_first_gpu() -> None:
    gpus = [{"uuid": "MIG-x", "parent_uuid": "GPU-p"}, {"uuid": "GPU-q", "parent_uuid": None}]
    stuck = MpsStop("7", DAEMON, "timed out", (99, 100), (100,), ())
    assert stuck_report(stuck, gpus) == ("GPU-p", "MPS daemon of job 7 (pid 100) survived SIGKILL")
    assert stuck_report(stuck, [])[0] == "GPU-a"  # type: ignore[index]  # no map: the daemon's record
    assert stuck_report(stuck._replace(daemon=None), [])[0] == "?"  # type: ignore[index]
    assert stuck_report(stuck._replace(stuck=()), gpus) is None  # killed is not a fault
