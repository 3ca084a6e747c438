"""The command line, in-process (click's runner) and as a real process for exit codes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from gpuslurm.cli.main import LAZY_COMMANDS, LAZY_SHORT_HELP, cli, main

README = Path(__file__).resolve().parents[2] / "README.md"


def run(*args: str) -> tuple[int, str, str]:
    proc = subprocess.run([sys.executable, "-m", "gpuslurm", *args], capture_output=True, text=True,
                          timeout=60)
    return proc.returncode, proc.stdout, proc.stderr


def test_every_command_has_help_and_is_in_the_readme() -> None:
    readme = README.read_text()
    runner = CliRunner()
    ctx = click.Context(cli)
    names = cli.list_commands(ctx)
    assert {"discover", "topo", "gres-conf", "node-conf", "capture", "install", "prolog", "epilog",
            "task-prolog"} <= set(names)
    for name in names:
        command = cli.get_command(ctx, name)
        assert command is not None and command.help, name
        assert f"gpuslurm {name}" in readme, f"{name} is not documented in README.md"
        result = runner.invoke(cli, [name, "--help"])
        assert result.exit_code == 0, result.output


def test_root_help_lists_each_command_as_it_says_itself_without_loading_it() -> None:
    """``gpuslurm --help`` takes the lazy commands' lines from LAZY_SHORT_HELP, which must agree
    with each command's own help; their modules import at module level, so loading them all for
    the list would cost ``--help`` about a hundred modules."""
    env = {"PATH": "/usr/bin:/bin", "COLUMNS": "100", "PYTHONPATH": str(README.parent / "src")}

    def root_help(load_all: bool) -> tuple[str, set[str]]:
        code = ("import sys, click; from gpuslurm.cli.main import LAZY_COMMANDS, cli\n"
                f"if {load_all}: [cli.get_command(click.Context(cli), name) for name in LAZY_COMMANDS]\n"
                "cli.main(['--help'], prog_name='gpuslurm', standalone_mode=False)\n"
                "print(' '.join(sys.modules), file=sys.stderr)")
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                              env=env, check=True)
        return proc.stdout, set(proc.stderr.split())

    listed, loaded = root_help(load_all=False)
    modules = {target.partition(":")[0] for target in LAZY_COMMANDS.values()}
    assert not modules & loaded, sorted(modules & loaded)
    assert set(LAZY_SHORT_HELP) == set(LAZY_COMMANDS)
    assert listed == root_help(load_all=True)[0]  # the commands' own lines, once they are loaded


def test_discover_json_lists_gpus_and_mig_devices() -> None:
    result = CliRunner().invoke(cli, ["discover", "--from", "a100-mig", "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    kinds = [d["kind"] for d in data["devices"]]
    assert kinds.count("gpu") == 2 and kinds.count("mig") == 4
    mig = next(d for d in data["devices"] if d["kind"] == "mig")
    assert mig["mig_profile"] and mig["slurm_cores"] and mig["uuid"].startswith("MIG-")


def test_topo_shows_os_cpus_and_slurm_cores() -> None:
    result = CliRunner().invoke(cli, ["topo", "--from", "l40s-4x"])
    assert result.exit_code == 0, result.output
    first = result.output.splitlines()[1]
    assert first.startswith("GPU0") and "0-31" in first and "0,2,4" in first
    data = json.loads(CliRunner().invoke(cli, ["topo", "--from", "dgx-h100", "--json"]).output)
    assert data["matrix"][0][1] == "NV18" and data["gpus"][4]["slurm_cores"] == "56-111"


def test_gres_conf_output_file_and_check_round_trip(tmp_path: Path) -> None:
    out = tmp_path / "gres.conf"
    assert main(["gres-conf", "--from", "dgx-h100", "--output", str(out)]) == 0
    assert "Name=gpu Type=nvidia_h100_80gb_hbm3 File=/dev/nvidia0 Cores=0-55" in out.read_text()
    assert main(["gres-conf", "--from", "dgx-h100", "--check", str(out)]) == 0
    out.write_text(out.read_text().replace("Cores=0-55", "Cores=0-55,112-167", 1))
    code, stdout, _ = run("gres-conf", "--from", "dgx-h100", "--check", str(out))
    assert code == 1
    assert "cores" in stdout and "OS CPU ids" in stdout


@pytest.mark.parametrize(("args", "words"), [
    (["gres-conf", "--from", "no-such-bundle"], "no-such-bundle"),
    (["gres-conf", "--from", "dgx-h100", "--mps", "0"], "--mps"),
    (["gres-conf", "--from", "dgx-h100", "--check", "/nonexistent/gres.conf"], "/nonexistent/gres.conf"),
    (["gres-conf", "--from", "dgx-h100", "--template", "/nonexistent.j2"], "/nonexistent.j2"),
    (["capture", "import", "only-one-arg"], "usage"),
])
def test_bad_input_is_one_line_and_exit_2(args: list[str], words: str) -> None:
    code, stdout, stderr = run(*args)
    assert code == 2, (stdout, stderr)
    assert words in stderr
    assert "Traceback" not in stderr
    assert len(stderr.strip().splitlines()) == 1


def test_broken_bundle_file_is_one_line_naming_it(tmp_path: Path) -> None:
    bundle = tmp_path / "b"
    bundle.mkdir()
    (bundle / "nvidia-smi-q.xml").write_text("<?xml version='1.0'?><nvidia_smi_log><gpu id='0000")
    code, _, stderr = run("discover", "--from", str(bundle))
    assert code == 2
    assert stderr.count("\n") == 1 and "nvidia-smi-q.xml" in stderr and "Traceback" not in stderr


def test_template_override(tmp_path: Path) -> None:
    tpl = tmp_path / "mine.j2"
    tpl.write_text("{% for r in records %}{{ r.type }} {{ r.file }} {{ r.cores_text }}\n{% endfor %}")
    result = CliRunner().invoke(cli, ["gres-conf", "--from", "l40s-4x", "--template", str(tpl)])
    assert result.exit_code == 0
    assert result.output.splitlines()[0] == "nvidia_l40s /dev/nvidia2 0-31"


def test_a_hook_run_does_not_import_the_installer_or_jinja2() -> None:
    """Hooks run on every job: only what the hook needs is imported."""
    code = ("import sys; from gpuslurm.cli.main import main; main(['prolog', '--help']); "
            "print('LOADED:', *[m for m in ('gpuslurm.install', 'jinja2', 'gpuslurm.gres.render') "
            "if m in sys.modules])")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    loaded = [ln for ln in proc.stdout.splitlines() if ln.startswith("LOADED:")]
    assert loaded == ["LOADED:"], proc.stdout
