"""``gpuslurm gpu offline|online|list`` and ``gpuslurm health`` as processes (replayed bundles, --no-slurm).

Bad input is one line on stderr and exit 2, with nothing changed; an unhealthy GPU is exit 1
(``health``) or 3 (``online`` refusing it).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from gpuslurm.cli.main import cli
from gpuslurm.hw.source import bundle_path, load_node
from gpuslurm.state.out_of_service import RECORD_FILE

ROOT = Path(__file__).resolve().parents[2]
NODE = load_node("dgx-h100")


@pytest.fixture
def site(tmp_path: Path) -> Path:
    (tmp_path / "cfg.toml").write_text(f'[paths]\nstate_dir = "{tmp_path}/state"\n'
                                       '[health.xid]\naction = "gpu_out"\n')
    bundle = bundle_path("dgx-h100")
    assert bundle is not None
    shutil.copytree(bundle, tmp_path / "bundle")
    return tmp_path


def run(site: Path, *args: str) -> tuple[int, str, str]:
    env = {"PATH": "/usr/bin:/bin", "GPUSLURM_CONFIG": str(site / "cfg.toml")}
    proc = subprocess.run([sys.executable, "-m", "gpuslurm", *args], capture_output=True, text=True,
                          timeout=60, env=env)
    return proc.returncode, proc.stdout, proc.stderr


def test_offline_list_online(site: Path) -> None:
    b = str(site / "bundle")
    code, out, err = run(site, "gpu", "offline", "minor:3", "--reason", "Xid 79 seen by hand", "--from", b,
                         "--no-slurm")
    assert (code, err) == (0, "") and "index 3" in out
    code, out, _ = run(site, "gpu", "list", "--json", "--from", b)
    rows = json.loads(out)["gpus"]
    assert [r["index"] for r in rows if not r["in_service"]] == [3]
    assert rows[3]["reason"] == "Xid 79 seen by hand" and rows[3]["by"] == "admin"
    code, out, _ = run(site, "health", "--from", b)
    assert code == 0 and f"{NODE.gpus[3].uuid}): out" in out
    code, out, err = run(site, "gpu", "online", NODE.gpus[3].uuid, "--from", b, "--no-slurm")
    assert (code, err) == (0, "") and "back in service" in out
    listed = json.loads(run(site, "gpu", "list", "--json", "--from", b)[1])["gpus"]
    assert all(r["in_service"] for r in listed)


def test_online_rechecks_health(site: Path) -> None:
    b = str(site / "bundle")
    run(site, "gpu", "offline", "index:2", "--reason", "hot", "--from", b, "--no-slurm")
    (site / "bundle" / "health.json").write_text(json.dumps({NODE.gpus[2].uuid: {"temperature_c": 97}}))
    code, _, err = run(site, "gpu", "online", "index:2", "--from", b, "--no-slurm")
    assert code == 3 and len(err.splitlines()) == 1 and "temperature 97 C" in err
    code, _, _ = run(site, "gpu", "online", "index:2", "--force", "--from", b, "--no-slurm")
    assert code == 0


def test_health_verdicts_and_json(site: Path) -> None:
    b = str(site / "bundle")
    (site / "bundle" / "health.json").write_text(json.dumps({
        NODE.gpus[1].uuid: {"xid": [79], "ecc_uncorrectable": 0},
        NODE.gpus[4].uuid: {"xid": [13]},  # the application's: healthy
        NODE.gpus[5].uuid: {"processes": [{"pid": 1, "user": "alice"}]},  # a running job's: healthy
    }))
    code, out, err = run(site, "health", "--json", "--from", b)
    assert code == 1, err
    report = {r["index"]: r for r in json.loads(out)["gpus"]}
    assert report[1]["verdict"] == "unhealthy" and report[1]["faults"][0]["action"] == "gpu_out"
    assert report[4]["verdict"] == "healthy" and report[5]["verdict"] == "healthy"
    code, out, _ = run(site, "health", "--gpu", "index:4", "--from", b)
    assert code == 0 and out.count("GPU index") == 1


@pytest.mark.parametrize(("args", "says"), [
    (("gpu", "offline", "3", "--reason", "x"), "ambiguous"),
    (("gpu", "offline", "index:42", "--reason", "x"), "no GPU with index 42"),
    (("gpu", "offline", "GPU-nope", "--reason", "x"), "no GPU with uuid"),
    (("gpu", "online", "minor:\u2028", ), "not a GPU"),
    (("health", "--gpu", "7"), "ambiguous"),
])
def test_bad_gpu_is_one_line_exit_2(site: Path, args: tuple[str, ...], says: str) -> None:
    extra = ["--no-slurm"] if args[0] == "gpu" else []
    code, _, err = run(site, *args, "--from", str(site / "bundle"), *extra)
    assert code == 2 and len(err.splitlines()) == 1 and says in err, err
    assert not (site / "state" / RECORD_FILE).exists()


def test_last_gpu_needs_force(site: Path) -> None:
    b = str(site / "bundle")
    for g in NODE.gpus[:7]:
        assert run(site, "gpu", "offline", g.uuid, "--reason", "r", "--from", b, "--no-slurm")[0] == 0
    before = (site / "state" / RECORD_FILE).read_bytes()
    code, _, err = run(site, "gpu", "offline", "index:7", "--reason", "r", "--from", b, "--no-slurm")
    assert code == 2 and "last GPU in service" in err and len(err.splitlines()) == 1
    assert (site / "state" / RECORD_FILE).read_bytes() == before
    forced = run(site, "gpu", "offline", "index:7", "--reason", "r", "--force", "--from", b, "--no-slurm")
    assert forced[0] == 0


def test_corrupt_record_is_one_line_exit_2_and_untouched(site: Path) -> None:
    (site / "state").mkdir()
    path = site / "state" / RECORD_FILE
    path.write_bytes(b'{"version": 1, "gpus": [{"uuid": "GPU-1", "reason": "\\u2028", "since": 1, '
                     b'"by": "x"}]}')
    os.chmod(path, 0o644)
    before = path.read_bytes()
    for args in (("gpu", "offline", "index:1", "--reason", "x", "--no-slurm"), ("gpu", "list"),
                 ("health",), ("gpu", "online", "index:1", "--no-slurm")):
        code, _, err = run(site, *args, "--from", str(site / "bundle"))
        assert code == 2 and len(err.splitlines()) == 1 and RECORD_FILE in err, (args, err)
    assert path.read_bytes() == before


def test_commands_have_help_and_are_documented() -> None:
    readme = (ROOT / "README.md").read_text()
    doc = (ROOT / "docs" / "health.md").read_text()
    for args in (("gpu", "offline"), ("gpu", "online"), ("gpu", "list"), ("health",)):
        result = CliRunner().invoke(cli, [*args, "--help"])
        assert result.exit_code == 0 and "Usage: " in result.output
        assert f"gpuslurm {' '.join(args)}" in readme and f"gpuslurm {' '.join(args)}" in doc


def test_pick_never_chooses_a_gpu_out_of_service(site: Path) -> None:
    b = str(site / "bundle")
    run(site, "gpu", "offline", "index:3", "--reason", "Xid 79", "--from", b, "--no-slurm")
    code, out, err = run(site, "pick", "7", "--from", b, "--format", "json")
    assert code == 0, err
    assert NODE.gpus[3].uuid not in out and out.count("GPU-") >= 7
    code, _, err = run(site, "pick", "8", "--from", b)
    assert code == 5 and "out of service: Xid 79" in err


def test_a_user_who_cannot_enter_the_state_directory_still_gets_a_pick() -> None:
    """nobody runs pick where the state directory is root's 0700 (the monitor's default): one line
    says the record of GPUs out of service is not consulted, and pick answers (it was exit 2)."""
    import tempfile

    root = Path(tempfile.mkdtemp(prefix="gpuslurm-pick-user-"))  # not under pytest's 0700 tmp
    root.chmod(0o755)
    try:
        _pick_as_nobody(root)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _pick_as_nobody(root: Path) -> None:
    from tests.helpers.cluster_fixture import users_python

    state = root / "state"
    state.mkdir(mode=0o700)
    (root / "cfg.toml").write_text(f'[paths]\nstate_dir = "{state}"\n')
    (root / "cfg.toml").chmod(0o644)
    python = users_python(root)
    proc = subprocess.run(["/usr/sbin/runuser", "-u", "nobody", "--", python, "-I", "-c",
                           "import sys; from gpuslurm.cli.fast import main; sys.argv[0] = 'gpuslurm'; "
                           "sys.exit(main())", "pick", "1", "--from", "dgx-h100", "--format", "json"],
                          capture_output=True, text=True, timeout=60,
                          env={"PATH": "/usr/bin:/bin", "GPUSLURM_CONFIG": str(root / "cfg.toml")})
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.count("\n") == 1 and "is not readable by this user" in proc.stderr
    assert '"gpus"' in proc.stdout
