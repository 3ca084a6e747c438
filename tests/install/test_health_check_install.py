"""``gpuslurm install --health-check``: the HealthCheckProgram wrapper, installed like the hooks, and
its slurm.conf lines; idempotent. slurmd running it is tests/cluster/test_health_check_e2e.py."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

from click.testing import CliRunner
from tests.helpers.install_helpers import ok, run

from gpuslurm import install as lib
from gpuslurm.cli.install_cmd import install
from gpuslurm.hw.source import bundle_path, load_node

WRAPPER = "gpuslurm-health-check"


def test_the_wrapper_is_installed_with_the_hooks_and_its_lines_printed_once(dirs: tuple[Path, Path]) -> None:
    etc, prefix = dirs
    out = ok(run(etc, prefix, "--health-check"))
    wrapper = prefix / WRAPPER
    assert wrapper.stat().st_mode & 0o777 == 0o755
    assert "-I -m gpuslurm health --act" in wrapper.read_text()
    for line in (f"HealthCheckProgram={wrapper}", "HealthCheckInterval=300", "HealthCheckNodeState=ANY"):
        assert line in out.splitlines(), out
    manifest = json.loads((prefix / lib.MANIFEST_NAME).read_text())
    assert str(wrapper) in manifest["files"]
    again = ok(run(etc, prefix, "--health-check"))
    assert again.startswith("nothing to change: 5 files already installed"), again
    (etc / "slurm.conf").write_text("\n".join(lib.health_check_lines(prefix)) + "\n")
    noted = ok(run(etc, prefix, "--health-check"))
    assert "HealthCheckProgram" not in noted.split("slurm.conf: ", 1)[-1], noted


def test_without_the_flag_there_is_no_wrapper_and_no_line(dirs: tuple[Path, Path]) -> None:
    etc, prefix = dirs
    out = ok(run(etc, prefix))
    assert not (prefix / WRAPPER).exists() and "HealthCheck" not in out


def test_an_admins_edit_of_the_wrapper_is_refused_until_force(dirs: tuple[Path, Path]) -> None:
    etc, prefix = dirs
    ok(run(etc, prefix, "--health-check"))
    (prefix / WRAPPER).write_text("#!/bin/sh\nexit 0\n")
    result = run(etc, prefix, "--health-check")
    assert result.exception is not None and WRAPPER in str(result.exception)
    ok(run(etc, prefix, "--health-check", "--force"))
    assert "health --act" in (prefix / WRAPPER).read_text()


def test_not_with_pbs() -> None:
    result = CliRunner().invoke(install, ["--pbs", "--health-check"])
    assert result.exit_code == 2 and "HealthCheckProgram" in result.output


def test_the_installed_wrapper_runs_health_act_with_an_empty_environment_and_slurmds_node_name(
        dirs: tuple[Path, Path], tmp_path: Path) -> None:
    etc, prefix = dirs
    bundle = tmp_path / "bundle"
    source = bundle_path("dgx-h100")
    assert source is not None
    shutil.copytree(source, bundle)
    gpu = load_node(str(bundle)).gpus[2]
    (bundle / "health.json").write_text(json.dumps({gpu.uuid: {"ecc_uncorrectable": 2}}))
    state = tmp_path / "state"
    scontrol = tmp_path / "scontrol"  # records what a drain would run; slurmd's run is the cluster test
    scontrol.write_text(f'#!/bin/sh\necho "$@" >> {tmp_path}/scontrol.log\n')
    scontrol.chmod(0o755)
    config = tmp_path / "gpuslurm.toml"
    config.write_text(f'[paths]\nstate_dir = "{state}"\nscontrol = "{scontrol}"\n'
                      '[scheduler]\nkind = "slurm"\n[health.ecc]\naction = "drain"\n')
    for p in (tmp_path, bundle):
        os.chmod(p, 0o755)
    ok(run(etc, prefix, "--health-check", "--config", str(config), "--replay", str(bundle)))
    proc = subprocess.run(["/usr/bin/env", "-i", "SLURMD_NODENAME=gpu-node-7", str(prefix / WRAPPER)],
                          capture_output=True, text=True, timeout=60, cwd="/")
    assert proc.returncode == 1, proc.stderr  # unhealthy (slurmd ignores it; the drain is what counts)
    log = (tmp_path / "scontrol.log").read_text()
    assert "NodeName=gpu-node-7" in log and gpu.uuid in log, log
