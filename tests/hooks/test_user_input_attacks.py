"""What a job's user writes reaches the installed hooks (run as slurmd runs them): ``--comment``,
``--constraint``, the job name and account as the prolog and epilog see them, and ``SLURM_LOCALID``
and the task's own variables in the task prolog. None of it may fail the node (a non-zero Prolog
exit drains it in Slurm 22.05), drain it, or smuggle a line into the task prolog's output."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest
from tests.helpers.hook_helpers import HookSite, make_site

HOSTILE = ["gpuslurm:mps=nan", "gpuslurm:mps=inf", "gpuslurm:mps=1e999", "gpuslurm:mps=0x10",
           "gpuslurm:mps=" + "9" * 5000, "gpuslurm:mps=-0", "gpuslurm:mps=%s%n", "x" * 100_000,
           "a\nb;export LD_PRELOAD=/tmp/x.so", "\udcff\udcfe", "mps*99999999999|!mps&[(", "'\"`$(id)`"]
EXPORT = re.compile(r"^export (CUDA_VISIBLE_DEVICES|CUDA_DEVICE_ORDER|GPUSLURM_[A-Z_]+|CUDA_MPS_[A-Z_]+)"
                    r"=\S+$")


@pytest.fixture
def site(tmp_path: Path) -> HookSite:
    site = make_site(tmp_path)
    site.write_config('[mps]\ntriggers = ["comment", "feature"]\nfeature = "mps-not-this"\n')
    return site


def test_hostile_comments_and_names_never_fail_or_drain_the_node(site: HookSite) -> None:
    prefix = site.install_hooks()
    for n, text in enumerate(HOSTILE):
        env = {**site.slurm_environ(jid := f"77{n}{os.getpid()}", gpus="0,1"), "SLURM_JOB_COMMENT": text,
               "SLURM_JOB_CONSTRAINTS": text, "SLURM_JOB_NAME": text, "SLURM_JOB_ACCOUNT": text[:100]}
        prolog = site.run_installed(prefix, "prolog", env)
        epilog = site.run_installed(prefix, "epilog", env)
        assert (prolog.returncode, epilog.returncode) == (0, 0), (text[:40], prolog.stderr, epilog.stderr)
        for out in (prolog.stderr, epilog.stderr):
            assert "internal error" not in out and "Traceback" not in out
        calls = site.scontrol_calls()
        assert not [c for c in calls if "State=DRAIN" in c], (text[:40], calls)
        if text.startswith("gpuslurm:mps="):  # a malformed request holds the job, never the node
            assert ["update", f"JobId={jid}"] == calls[0][:2] and calls[1] == ["requeuehold", jid], calls
        site.scontrol_log.unlink(missing_ok=True)


@pytest.mark.parametrize("local_id", ["-1", "99999999", "\uff11", "0\nexport LD_PRELOAD=/tmp/x.so",
                                      "1;export X=1", " 3 ", "\u0663", "1e3", "9" * 10000])
def test_the_task_prolog_prints_only_its_own_export_lines(site: HookSite, local_id: str) -> None:
    prefix = site.install_hooks()
    env = {**site.slurm_environ(f"78{os.getpid()}", gpus="0,1,2,3"), "SLURM_LOCALID": local_id,
           "CUDA_DEVICE_ORDER": "x\nexport LD_PRELOAD=/tmp/x.so"}
    task = site.run_installed(prefix, "task-prolog", env)
    assert task.returncode == 0, task.stderr
    lines = task.stdout.splitlines()
    assert lines and all(EXPORT.match(line) for line in lines), lines
    local = [line for line in lines if line.startswith("export GPUSLURM_LOCAL_GPU=")]
    assert local in (["export GPUSLURM_LOCAL_GPU=0"], ["export GPUSLURM_LOCAL_GPU=3"])


def test_python_variables_and_planted_modules_change_nothing_the_hooks_import(site: HookSite,
                                                                              tmp_path: Path) -> None:
    """The job's user sets PYTHONPATH, PYTHONHOME, PYTHONSTARTUP, PYTHONINSPECT, PYTHONUSERBASE and
    HOME to a tree of their own, holding a ``gpuslurm`` package, ``json`` (which the hooks import),
    ``sitecustomize`` and ``usercustomize``, and starts the hooks there: each runs the installed
    gpuslurm (-I ignores the variables, the working directory and the user's site; -S runs no
    site-packages code) and none of the planted code."""
    prefix = site.install_hooks()
    planted = tmp_path / "planted"
    marker = tmp_path / "ran"
    plant = f"open({str(marker)!r}, 'a').write(__name__ + '\\n')\n"
    user_site = planted / ".local" / "lib" / "python3.11" / "site-packages"
    for folder in (planted, user_site):
        (folder / "gpuslurm").mkdir(parents=True)
        (folder / "gpuslurm" / "__init__.py").write_text(plant)
        for name in ("json", "sitecustomize", "usercustomize", "startup"):
            (folder / f"{name}.py").write_text(plant)
    hostile = {"PYTHONPATH": str(planted), "PYTHONHOME": str(planted),
               "PYTHONSTARTUP": str(planted / "startup.py"), "PYTHONINSPECT": "1",
               "PYTHONUSERBASE": str(planted / ".local"), "HOME": str(planted)}
    env = {**site.slurm_environ(jid := f"79{os.getpid()}", gpus="0,1"), **hostile}
    for hook in ("prolog", "task-prolog", "epilog"):
        done = subprocess.run([str(prefix / f"gpuslurm-{hook}")], env=env, capture_output=True,
                              text=True, timeout=60, check=False, cwd=planted, stdin=subprocess.DEVNULL)
        assert done.returncode == 0, (hook, done.stderr)
        assert not marker.exists(), (hook, marker.read_text())
        if hook == "task-prolog":
            assert f"export GPUSLURM_GPU_UUID={site.uuids[0]}" in done.stdout.splitlines()
    assert (site.summaries / f"{jid}-summary.json").is_file()
