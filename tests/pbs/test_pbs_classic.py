"""The classic prologue/epilogue without PBS: pbs_mom's arguments checked, the scripts' files.

What pbs_mom does with them runs in tests/pbs_cluster/test_pbs_classic_e2e.py.
"""

from __future__ import annotations

import io
import os
import stat
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpuslurm.errors import EXIT_USAGE, InputError
from gpuslurm.pbs.classic import _vnode_name, check_args, main
from gpuslurm.pbs.classic_install import (
    MARKER,
    apply_scripts,
    describe,
    plan_scripts,
    script_text,
)

PYTHON = "/usr/bin/python3"


def _run(kind: str, argv: list[str]) -> tuple[int, list[str]]:
    err = io.StringIO()
    rc = main(kind, argv, environ={"GPUSLURM_CONFIG": "/nonexistent/gpuslurm.toml"}, stderr=err)
    return rc, err.getvalue().splitlines()


@given(st.lists(st.text(max_size=40), max_size=12))
def test_any_wrong_count_of_arguments_is_one_line_and_exit_2(argv: list[str]) -> None:
    for kind, want in (("prologue", 3), ("epilogue", 10)):
        if len(argv) == want:
            continue
        rc, lines = _run(kind, argv)
        assert rc == EXIT_USAGE and len(lines) == 1 and f"takes {want} arguments" in lines[0]


@given(st.text(max_size=80).filter(lambda s: "." not in s or "/" in s or not s.isprintable()))
def test_a_hostile_job_id_is_refused_before_anything_runs(job_id: str) -> None:
    rc, lines = _run("prologue", [job_id, "root", "root"])
    assert rc == EXIT_USAGE and len(lines) == 1, lines


def test_an_unknown_script_and_a_user_name_that_is_an_option_are_refused() -> None:
    assert _run("postlude", ["1.pbshost", "root", "root"])[0] == EXIT_USAGE
    rc, lines = _run("epilogue", ["1.pbshost", "--help", "g", "n", "1", "", "", "workq", "null", "0"])
    assert rc == EXIT_USAGE and "not a user name" in lines[0]


@given(st.text(max_size=30))
def test_vnode_names_qmgr_gets_unquoted_hold_no_quote_space_or_comma(name: str) -> None:
    if _vnode_name(name):
        assert not any(c in name for c in ' "\',;\n=#')


def test_vnode_names() -> None:
    assert _vnode_name("pbshost") and _vnode_name("pbshost[12]") and _vnode_name("n-1.example.org")
    for bad in ("", "pbshost[x]", 'a" state = free', "a,b", "pbshost[1]x", "[1]"):
        assert not _vnode_name(bad), bad


@pytest.mark.skipif(os.geteuid() != 0, reason="the scripts are written root's")
def test_scripts_are_written_root_s_0755_then_left_alone_and_a_sites_own_is_refused(tmp_path: Path) -> None:
    steps = plan_scripts(str(tmp_path), PYTHON, "/etc/gpuslurm/gpuslurm.toml")
    assert [s.verb for s in steps] == ["create", "create"]
    assert describe(steps, str(tmp_path), dry_run=True) == \
        [f"would create {tmp_path / k} (root's, mode 0755)" for k in ("prologue", "epilogue")]
    apply_scripts(steps)
    for kind in ("prologue", "epilogue"):
        path = tmp_path / kind
        assert stat.S_IMODE(path.stat().st_mode) == 0o755 and path.stat().st_uid == 0
        text = path.read_text()
        assert text.startswith(f"#!{PYTHON} -I\n") and MARKER in text
        assert f"run({kind!r}, config='/etc/gpuslurm/gpuslurm.toml', capture=None)" in text
    again = plan_scripts(str(tmp_path), PYTHON, "/etc/gpuslurm/gpuslurm.toml")
    assert [s.verb for s in again] == ["same"] * 2
    assert describe(again, str(tmp_path), dry_run=False) == \
        [f"nothing to change: {tmp_path} has gpuslurm's prologue and epilogue"]
    assert [s.verb for s in plan_scripts(str(tmp_path), PYTHON)] == ["update"] * 2  # another config
    (tmp_path / "prologue").write_text("#!/bin/sh\n/usr/local/sbin/site-check\n")
    with pytest.raises(InputError, match="site's own script"):
        plan_scripts(str(tmp_path), PYTHON)
    assert plan_scripts(str(tmp_path), PYTHON, force=True)[0].verb == "update"
    (tmp_path / "epilogue").unlink()
    (tmp_path / "epilogue").symlink_to("/bin/true")
    with pytest.raises(InputError, match="not a regular file"):
        plan_scripts(str(tmp_path), PYTHON, force=True)


def test_the_interpreter_must_fit_a_shebang_line() -> None:
    for bad in ("python3", "/opt/my python/bin/python3", "/" + "p" * 300):
        with pytest.raises(InputError):
            script_text("prologue", bad)
    with pytest.raises(InputError):
        script_text("prologue", PYTHON, config="relative.toml")


def test_with_gpuslurms_hook_enabled_the_scripts_leave_the_job_to_it(tmp_path: Path) -> None:
    """Both would map and clean up the same job; the hook does more, so the scripts do nothing
    (before reading any config: the one given here does not exist)."""
    (tmp_path / "hooks").mkdir()
    hk = tmp_path / "hooks" / "gpuslurm.HK"
    hk.write_text("type=site\nenabled=true\nevent=execjob_begin,execjob_end\n")
    err = io.StringIO()
    environ = {"GPUSLURM_CONFIG": "/nonexistent/gpuslurm.toml"}
    assert main("prologue", ["1.pbshost", "root", "root"], environ, err, mom_priv=str(tmp_path)) == 0
    assert "leaves the job to it" in err.getvalue()
    hk.write_text("type=site\nenabled=false\n")
    rc = main("prologue", ["1.pbshost", "root", "root"], environ, io.StringIO(), mom_priv=str(tmp_path))
    assert rc == EXIT_USAGE  # now it runs, and the missing config stops it


@given(st.lists(st.text(), min_size=7, max_size=7), st.integers(0, 200_000))
def test_the_users_own_epilogue_arguments_never_stop_the_clean_up(rest: list[str], long: int) -> None:
    """The job name, account (``qsub -A``: PBS bounds neither its length nor its text), resources
    and the rest are the user's: whatever they hold, the epilogue's arguments pass (they are not
    read), so a job cannot keep its leftovers alive by its account string."""
    rest[5] = "a" * long + rest[5]  # the account
    argv = ["1.pbshost", "root", "root", *rest]
    assert check_args("epilogue", argv) == argv


def test_an_error_file_that_cannot_be_written_does_not_stop_the_script(tmp_path: Path) -> None:
    """pbs_mom points the scripts' stderr at the job's error file, the user's (a full quota, a
    FIFO whose reader left): every write failing (/dev/full: ENOSPC), the script still runs to its
    own exit code (here 2: the config is missing), not a traceback."""
    import subprocess
    import sys

    env = {"GPUSLURM_CONFIG": str(tmp_path / "missing.toml"), "PATH": "/usr/bin:/bin"}
    argv = [sys.executable, "-m", "gpuslurm.pbs.classic", "epilogue", "1.pbshost", "root", "root",
            "name", "1", "", "", "workq", "null", "0"]
    with open("/dev/full", "w") as full:
        done = subprocess.run(argv, stderr=full, env=env, timeout=60, check=False)
    assert done.returncode == EXIT_USAGE


def test_a_gpu_out_of_service_is_not_one_of_the_jobs_gpus(tmp_path: Path) -> None:
    """`gpu offline` lowered the vnode's ngpus by one; the prologue must not name that GPU among the
    job's (the core refuses a job given a GPU out of service: every job on the vnode would be
    requeued, again and again)."""
    from gpuslurm.config import load_config
    from gpuslurm.hooks.log import HookLog
    from gpuslurm.hw.source import hardware_source, load_node
    from gpuslurm.pbs.classic import _job_gpus
    from gpuslurm.state.out_of_service import OutOfServiceStore, take_out

    conf = tmp_path / "gpuslurm.toml"
    conf.write_text(f'[paths]\nstate_dir = "{tmp_path}/state"\nrun_dir = "{tmp_path}/run"\n')
    cfg = load_config(str(conf))
    log = HookLog("test", stream=io.StringIO(), use_syslog=False)
    node = load_node("dgx-h100")
    everything = _job_gpus([("dgx-h100[0]", 4)], "dgx-h100", hardware_source("dgx-h100"), cfg, log)
    assert everything is not None and len(everything) == 4
    third = next(g for g in node.gpus if g.uuid == everything[2])
    take_out(OutOfServiceStore(cfg.paths.state_dir), node.gpus, third, "Xid 79", "admin", now=1.0)
    left = _job_gpus([("dgx-h100[0]", 3)], "dgx-h100", hardware_source("dgx-h100"), cfg, log)
    assert left == everything[:2] + everything[3:]
