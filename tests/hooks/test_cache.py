"""The hooks' caches (parsed config, replayed node) and their light entry point.

Real files in temporary directories; the hooks run as whole processes where what matters is what
a process imports.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from tests.helpers.hook_helpers import HookSite, make_site

import gpuslurm
from gpuslurm.config import load_config
from gpuslurm.errors import InputError
from gpuslurm.hooks import cache
from gpuslurm.hooks.cache import hook_node, load_hook_config, placement_from_json, run_dir_hint
from gpuslurm.hw import source
from gpuslurm.hw.model.node import Node
from gpuslurm.hw.source import LIVE, HardwareSource, builtin_names, hardware_source, load_node

SRC = str(Path(gpuslurm.__file__).resolve().parents[1])


@pytest.fixture
def site(tmp_path: Path) -> HookSite:
    return make_site(tmp_path)


def cache_file(site: HookSite, name: str) -> Path:
    return site.root / "run" / "cache" / name


def forbid_bundle_reads(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*_: object, **__: object) -> None:
        raise AssertionError("the bundle was read although the cache holds it")

    monkeypatch.setattr(source, "_read_bundle", refuse)


def node_identity(bundle: str, run_dir: str, warn: cache.Warn | None = None) -> Node:
    return hook_node(hardware_source(bundle), run_dir, warn)


# --- the hooks' node ----------------------------------------------------------------------------


@pytest.mark.parametrize("name", builtin_names())
def test_the_hooks_node_round_trips_every_builtin(name: str) -> None:
    node = load_node(name, links=False)
    back = placement_from_json(json.loads(json.dumps(node)))
    assert back == node and type(back) is Node
    assert [type(g).__name__ for g in back.gpus] == ["Gpu"] * len(node.gpus)
    assert [[type(m).__name__ for m in g.mig_devices] for g in back.gpus] == [
        ["MigDevice"] * len(g.mig_devices) for g in node.gpus]
    assert back.source == f"builtin:{name}"


def test_replayed_node_is_cached_root_only_and_used(site: HookSite, monkeypatch: pytest.MonkeyPatch) -> None:
    run_dir = str(site.root / "run")
    first = node_identity(str(site.bundle), run_dir)
    assert first == load_node(str(site.bundle), links=False)._replace(cpus=())
    assert first.gpus[0].cpu_affinity  # each GPU's own CPUs stay
    path = cache_file(site, "node-identity.json")
    assert stat.S_IMODE(path.stat().st_mode) == 0o600 and path.stat().st_uid == os.geteuid()
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    forbid_bundle_reads(monkeypatch)
    assert node_identity(str(site.bundle), run_dir) == first
    site.set_health({first.gpus[0].uuid: {"lost": True}})  # health is read afresh, not keyed
    assert node_identity(str(site.bundle), run_dir) == first


def test_an_edited_bundle_is_read_again(site: HookSite) -> None:
    run_dir = str(site.root / "run")
    old = node_identity(str(site.bundle), run_dir)
    xml = site.bundle / "nvidia-smi-q.xml"
    xml.write_text(xml.read_text().replace(old.gpus[0].uuid, "GPU-00000000-1111-2222-3333-444444444444"))
    new = node_identity(str(site.bundle), run_dir)
    assert new.gpus[0].uuid == "GPU-00000000-1111-2222-3333-444444444444"
    assert new.gpus[1:] == old.gpus[1:]
    (site.bundle / "notes.txt").write_text("a file added to the bundle\n")
    assert cache.bundle_key(str(site.bundle)) != json.loads(
        cache_file(site, "node-identity.json").read_text())["key"]
    assert node_identity(str(site.bundle), run_dir) == new


def test_a_corrupt_or_foreign_cache_is_replaced(site: HookSite) -> None:
    run_dir = str(site.root / "run")
    good = node_identity(str(site.bundle), run_dir)
    path = cache_file(site, "node-identity.json")
    doc = json.loads(path.read_text())
    old_identity = {"hostname": "x", "source": "",
                    "gpus": [["GPU-x", 0, 0, "00000000:01:00.0", None, [], None, []]]}
    for broken in ("not json", json.dumps({**doc, "gpuslurm": "0.0.0"}),
                   json.dumps({**doc, "node": {"hostname": "x", "source": "", "gpus": [[1]]}}),
                   json.dumps({**doc, "format": 1, "node": old_identity}),  # the light identities' cache
                   json.dumps({**doc, "node": old_identity})):
        path.write_text(broken)
        assert node_identity(str(site.bundle), run_dir) == good
        assert json.loads(path.read_text()) == doc


def test_a_symlink_at_the_cache_is_refused_not_followed(site: HookSite) -> None:
    run_dir = str(site.root / "run")
    good = node_identity(str(site.bundle), run_dir)
    path = cache_file(site, "node-identity.json")
    target = site.root / "victim"
    target.write_text("untouched\n")
    path.unlink()
    path.symlink_to(target)
    said: list[str] = []
    assert node_identity(str(site.bundle), run_dir, said.append) == good
    assert target.read_text() == "untouched\n" and path.is_symlink()
    assert any("refusing" in line and "symlink" in line for line in said), said


def test_the_live_node_is_never_cached(site: HookSite, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[object] = []
    dgx = load_node("dgx-h100", links=False)

    def live(self: HardwareSource, *, links: bool = True, cache_dir: str | None = None) -> Node:
        calls.append((self.bundle, links))
        return dgx

    monkeypatch.setattr(HardwareSource, "node", live)
    run_dir = str(site.root / "run")
    assert hook_node(LIVE, run_dir) == hook_node(LIVE, run_dir) == dgx._replace(cpus=())
    assert calls == [(None, False), (None, False)]
    assert not cache_file(site, "node-identity.json").exists()


# --- the config ---------------------------------------------------------------------------------


def test_config_parse_is_cached_and_only_for_the_same_text(site: HookSite,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    site.write_config("[epilog]\nkill_grace_s = 2\n")
    env = site.environ()
    assert load_hook_config(env) == load_config(environ=env)
    cached = json.loads(cache_file(site, "config.json").read_text())
    assert cached["text"] == site.config.read_text()

    def no_parse(text: str, source: str) -> None:
        raise AssertionError("parsed although the cache holds this text")

    monkeypatch.setattr("gpuslurm.config.parse_toml", no_parse)
    assert load_hook_config(env).epilog.kill_grace_s == 2.0
    monkeypatch.undo()
    site.write_config("[epilog]\nkill_grace_s = 3\n")  # same size, new text
    assert load_hook_config(env).epilog.kill_grace_s == 3.0


def test_an_invalid_config_is_never_cached(site: HookSite) -> None:
    site.write_config("[epilog]\nkill_grace_s = -1\n")
    for _ in range(2):
        with pytest.raises(InputError, match="kill_grace_s"):
            load_hook_config(site.environ())
    assert not cache_file(site, "config.json").exists()


def test_no_config_file_means_defaults_and_no_cache(tmp_path: Path) -> None:
    cfg = load_hook_config({"GPUSLURM_CONFIG": ""})  # the default path, absent here
    assert cfg == load_config(environ={"GPUSLURM_CONFIG": ""})
    with pytest.raises(InputError, match="no such file"):
        load_hook_config({"GPUSLURM_CONFIG": str(tmp_path / "missing.toml")})


@pytest.mark.parametrize(("text", "hint"), [
    ('[paths]\nrun_dir = "/srv/run"\n', "/srv/run"),
    ("[paths]  # ours\nrun_dir='/srv/run' # tmpfs\n", "/srv/run"),
    ('[hooks]\nrun_dir = "/srv/run"\n', "/run/gpuslurm"),  # another section's key
    ('paths.run_dir = "/srv/run"\n', "/run/gpuslurm"),  # spelled otherwise: no hint
    ('[paths]\nrun_dir = "/srv/\\u0072un"\n', "/run/gpuslurm"),  # escapes: no hint
    ("", "/run/gpuslurm"),
])
def test_run_dir_hint(text: str, hint: str) -> None:
    assert run_dir_hint(text) == hint


# --- the entry point ------------------------------------------------------------------------


def run_hook(site: HookSite, hook: str, job_id: str, *extra: str) -> subprocess.CompletedProcess[str]:
    code = ("import sys; from gpuslurm.slurm.entry import main; rc = main(); "
            "print(' '.join(sorted(sys.modules))); sys.exit(rc)")
    env = {**site.environ(job_id), "PYTHONPATH": SRC}
    return subprocess.run([sys.executable, "-c", code, hook, *extra], env=env, capture_output=True,
                          text=True, timeout=60, check=False)


def test_hooks_with_warm_caches_import_nothing_heavy(site: HookSite) -> None:
    baseline = set(subprocess.run([sys.executable, "-c", "import sys; print(' '.join(sys.modules))"],
                                  capture_output=True, text=True, check=True).stdout.split())
    for job in ("11", "12"):  # the first pair fills the caches
        prolog = run_hook(site, "prolog", job)
        assert prolog.returncode == 0, prolog.stderr
        epilog = run_hook(site, "epilog", job)
        assert epilog.returncode == 0, epilog.stderr
    for proc in (prolog, epilog):
        added = set(proc.stdout.split()) - baseline
        for heavy in ("click", "gpuslurm.cli.main", "dataclasses", "inspect", "pathlib", "tomllib",
                      "subprocess", "xml.etree.ElementTree", "gpuslurm.hw.replay.bundle",
                      "gpuslurm.hw.formats.nvml_json", "typing"):
            assert heavy not in added, heavy
    assert json.loads((site.jobs_dir.parent / "cache" / "config.json").read_text())["doc"]["hooks"] == {
        "command_timeout_s": 5}


def test_entry_point_usage_and_exit_codes(site: HookSite) -> None:
    assert run_hook(site, "prolog", "13").returncode == 0
    bad = run_hook(site, "prolog", "13", "--verbose")
    assert bad.returncode == 2 and bad.stderr.startswith("usage: ")
    assert run_hook(site, "nonsense", "13").returncode == 2
    site.write_config("[bogus]\n")
    broken = run_hook(site, "prolog", "14")
    assert broken.returncode == 2 and "unknown section [bogus]" in broken.stderr


def test_run_exits_with_the_hook_code_and_flushed_output(site: HookSite) -> None:
    env = {**site.environ("15"), "PYTHONPATH": SRC, "SLURM_LOCALID": "1"}
    code = "from gpuslurm.slurm.entry import run; run()"
    task = subprocess.run([sys.executable, "-I", "-c", code, "task-prolog"], env=env, capture_output=True,
                          text=True, timeout=60, check=False, cwd="/")
    # -I ignores PYTHONPATH: only an installed gpuslurm answers; the editable install is one
    assert task.returncode == 0, task.stderr
    assert f"export GPUSLURM_GPU_UUID={site.uuids[1]}" in task.stdout.splitlines()
    env.pop("SLURM_JOB_USER")
    failed = subprocess.run([sys.executable, "-I", "-c", code, "prolog"], env=env, capture_output=True,
                            text=True, timeout=60, check=False, cwd="/")
    assert failed.returncode == 2
    assert failed.stderr == "gpuslurm prolog: SLURM_JOB_USER: is not set: not running as a Slurm job hook?\n"
