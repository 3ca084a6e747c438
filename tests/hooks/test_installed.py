"""The executables ``gpuslurm install --config`` writes, run as slurmd runs them.

Each test installs the hooks into a fresh root-owned prefix with the site's config path (and the
replay bundle, ``--replay``) baked in, then starts them by absolute path with only the job's
SLURM_* variables: no ``GPUSLURM_CONFIG``, no ``PATH``, no ``PYTHONPATH``. A change to a template or to
``render_hook`` that breaks the written text fails here.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from tests.helpers.hook_helpers import HookSite, make_site


def job(n: int) -> str:
    """A job id no other test on this host uses: the task prolog joins its parent to a real
    devices cgroup of that id if one exists, and the epilog kills what is in it."""
    jid = f"{n}{os.getpid()}"
    assert not Path(f"/sys/fs/cgroup/devices/gpuslurm/job_{jid}").exists()
    return jid


@pytest.fixture
def site(tmp_path: Path) -> HookSite:
    return make_site(tmp_path)


def test_installed_prolog_task_prolog_and_epilog_run_a_job(site: HookSite) -> None:
    prefix = site.install_hooks()
    jid = job(501)
    env = site.slurm_environ(jid, gpus="4,5")
    prolog = site.run_installed(prefix, "prolog", env)
    assert prolog.returncode == 0, prolog.stderr
    jmap = json.loads((site.jobs_dir / f"{jid}.json").read_text())
    assert [g["uuid"] for g in jmap["gpus"]] == site.uuids[4:6]

    task = site.run_installed(prefix, "task-prolog", {**env, "SLURM_LOCALID": "1"})
    assert task.returncode == 0, task.stderr
    assert f"export GPUSLURM_GPU_UUID={site.uuids[5]}" in task.stdout.splitlines()

    epilog = site.run_installed(prefix, "epilog", env)
    assert epilog.returncode == 0, epilog.stderr
    assert not (site.jobs_dir / f"{jid}.json").exists()
    assert (site.summaries / f"{jid}-summary.json").is_file()


def test_installed_hooks_read_the_baked_config_not_the_environment(site: HookSite) -> None:
    prefix = site.install_hooks()
    decoy = site.root / "decoy.toml"
    decoy.write_text('[paths]\nrun_dir = "/nonexistent/decoy"\n')
    # A GPUSLURM_CONFIG in the environment (which slurmd never passes) is overridden.
    env = {**site.slurm_environ(jid := job(502)), "GPUSLURM_CONFIG": str(decoy)}
    prolog = site.run_installed(prefix, "prolog", env)
    assert prolog.returncode == 0, prolog.stderr
    assert (site.jobs_dir / f"{jid}.json").is_file()


def test_installed_prolog_fails_on_the_baked_configs_mistake(site: HookSite) -> None:
    prefix = site.install_hooks()
    site.write_config("[bogus]\n")
    broken = site.run_installed(prefix, "prolog", site.slurm_environ(jid := job(503)))
    assert broken.returncode == 2 and "unknown section [bogus]" in broken.stderr
    assert not (site.jobs_dir / f"{jid}.json").exists()


def test_installed_hooks_usage_and_exit_codes(site: HookSite) -> None:
    prefix = site.install_hooks()
    bad = site.run_installed(prefix, "prolog", site.slurm_environ(job(504)), "--verbose")
    assert bad.returncode == 2 and bad.stderr.startswith("usage: ")
    ok = site.run_installed(prefix, "epilog", site.slurm_environ(job(505)), "--help")
    assert ok.returncode == 0 and ok.stdout.strip()


def test_installed_hook_is_roots_and_names_the_config(site: HookSite) -> None:
    prefix = site.install_hooks()
    text = (prefix / "gpuslurm-prolog").read_text()
    assert (f"\nGPUSLURM_CONFIG={site.config}\nexport GPUSLURM_CONFIG\n"
            f"GPUSLURM_CAPTURE={site.bundle}\nexport GPUSLURM_CAPTURE\n"
            f"GPUSLURM_HOOK_SOCKET={site.root / 'run' / 'hooks.sock'}\n"
            "export GPUSLURM_HOOK_SOCKET\nexec ") in text
    st = os.stat(prefix / "gpuslurm-prolog")
    assert st.st_uid == os.geteuid() and not st.st_mode & 0o022
