from __future__ import annotations

import os
import pathlib
import re
import subprocess
import sys

import pytest

import gpuslurm
from gpuslurm import config as cfgmod
from gpuslurm import configfile
from gpuslurm.config import Config, load_config, parse_config
from gpuslurm.errors import InputError

DOCS = pathlib.Path(__file__).resolve().parents[2] / "docs" / "config.md"


def _keys(value: object, prefix: str = "") -> list[str]:
    """Every leaf key of a Config as "section.key" / "section.sub.key"."""
    out: list[str] = []
    for name in value._fields:  # type: ignore[attr-defined]
        if name == "source":
            continue
        child = getattr(value, name)
        full = f"{prefix}{name}"
        if hasattr(child, "_fields"):
            out.extend(_keys(child, full + "."))
        else:
            out.append(full)
    return out


def test_defaults_when_default_file_absent(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(configfile, "DEFAULT_PATH", str(tmp_path / "absent.toml"))
    cfg = load_config(environ={})
    assert cfg == Config()
    assert cfg.source is None
    assert cfg.paths.run_dir == "/run/gpuslurm"
    assert cfg.paths.jobs_dir == "/run/gpuslurm/jobs"
    assert cfg.health.temperature.action == "drain"
    assert cfg.health.xid.ignore == (8, 11, 13, 25, 31, 32, 43, 45, 66, 67, 68, 69, 80, 137)
    assert cfg.epilog.admin_comment is False


def test_env_var_names_the_file(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "g.toml"
    path.write_text(
        '[paths]\nnvidia_smi = "/opt/fake/nvidia-smi"\n'
        '[health.temperature]\naction = "log"\nlimit_c = 92\n'
        '[health.xid]\nignore = []\n'
        '[mps]\ntriggers = ["gres", "comment"]\nactive_thread_percentage = 50\n'
        '[epilog]\nadmin_comment = true\nkill_grace_s = 2\n'
    )
    cfg = load_config(environ={"GPUSLURM_CONFIG": str(path)})
    assert cfg.source == str(path)
    assert cfg.paths.nvidia_smi == "/opt/fake/nvidia-smi"
    assert cfg.paths.scontrol == "/usr/bin/scontrol"  # untouched keys keep their defaults
    assert cfg.health.temperature == cfgmod.TemperatureCheck("log", 92)
    assert cfg.health.ecc.action == "drain"
    assert cfg.health.xid.ignore == ()
    assert cfg.mps.triggers == ("gres", "comment")
    assert cfg.mps.active_thread_percentage == 50
    assert cfg.epilog.admin_comment is True
    assert cfg.epilog.kill_grace_s == 2.0 and isinstance(cfg.epilog.kill_grace_s, float)


def test_explicit_path_beats_env(tmp_path: pathlib.Path) -> None:
    a, b = tmp_path / "a.toml", tmp_path / "b.toml"
    a.write_text("[cgroup]\ndevices = 'always'\n")
    b.write_text("[cgroup]\ndevices = 'never'\n")
    assert load_config(str(a), environ={"GPUSLURM_CONFIG": str(b)}).cgroup.devices == "always"


def test_named_file_must_exist(tmp_path: pathlib.Path) -> None:
    missing = tmp_path / "nope.toml"
    with pytest.raises(InputError) as info:
        load_config(environ={"GPUSLURM_CONFIG": str(missing)})
    assert str(info.value) == f"{missing}: no such file"


def test_directory_is_refused(tmp_path: pathlib.Path) -> None:
    with pytest.raises(InputError, match="is a directory"):
        load_config(str(tmp_path))


@pytest.mark.parametrize(("text", "message"), [
    ("[health]\nx = 1\n", "unknown key 'x' in [health]"),
    ("[health.xid]\nignores = [1]\n", "unknown key 'ignores' in [health.xid]"),
    ("[heath]\n", "unknown section [heath]"),
    ("source = 'x'\n", "unknown section [source]"),
    ("[health.temperature]\nlimit_c = 'hot'\n",
     "limit_c in [health.temperature] must be an integer, not 'hot'"),
    ("[health.temperature]\nlimit_c = 90.5\n",
     "limit_c in [health.temperature] must be an integer, not 90.5"),
    ("[health.temperature]\nlimit_c = 0\n",
     "limit_c in [health.temperature] must be between 1 and 200, not 0"),
    ("[health.ecc]\naction = 'panic'\n",
     "action in [health.ecc] must be one of drain, gpu_out, log, off, not 'panic'"),
    ("[health.xid]\nignore = 13\n", "ignore in [health.xid] must be a list, not 13"),
    ("[health.xid]\nignore = [13, true]\n", "ignore in [health.xid] (item 2) must be an integer, not True"),
    ("[health]\nlost_gpu = 'drain'\n", "[health.lost_gpu] must be a table, not 'drain'"),
    ("health = 1\n", "[health] must be a table, not 1"),
    ("[paths]\nrun_dir = 'run/gpuslurm'\n",
     "run_dir in [paths] must be an absolute path, not 'run/gpuslurm'"),
    ("[paths]\nscontrol = 5\n", "scontrol in [paths] must be a string, not 5"),
    ("[mps]\ntriggers = ['gres', 'always']\n",
     "triggers in [mps] (item 2) must be one of gres, comment, feature, not 'always'"),
    ("[mps]\nactive_thread_percentage = 101\n",
     "active_thread_percentage in [mps] must be between 1 and 100, not 101"),
    ("[epilog]\nsummary = 'yes'\n", "summary in [epilog] must be true or false, not 'yes'"),
    ("[epilog]\nkill_grace_s = true\n", "kill_grace_s in [epilog] must be a number, not True"),
    ("[cgroup]\ndevices = 'sometimes'\n",
     "devices in [cgroup] must be one of auto, always, never, not 'sometimes'"),
])
def test_mistakes_are_one_line_naming_the_file(tmp_path: pathlib.Path, text: str, message: str) -> None:
    path = tmp_path / "gpuslurm.toml"
    path.write_text(text)
    with pytest.raises(InputError) as info:
        load_config(str(path))
    assert info.value.source == str(path)
    assert info.value.message == message
    assert str(info.value) == f"{path}: {message}"


@pytest.mark.parametrize("text", ["[health\n", "a = \n", "x = 1\nx = 2\n", "[paths]\nrun_dir = '/a\n"])
def test_bad_toml(tmp_path: pathlib.Path, text: str) -> None:
    path = tmp_path / "gpuslurm.toml"
    path.write_text(text)
    with pytest.raises(InputError) as info:
        load_config(str(path))
    assert info.value.source == str(path)
    assert info.value.message.startswith("not valid TOML: ")
    assert "\n" not in str(info.value)


def test_not_utf8(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "gpuslurm.toml"
    path.write_bytes(b"[paths]\nrun_dir = '/run/\xff'\n")
    with pytest.raises(InputError, match="not UTF-8"):
        load_config(str(path))


def test_parse_config_empty_is_defaults() -> None:
    cfg = parse_config("", "x.toml")
    assert cfg._replace(source=None) == Config()
    assert cfg.source == "x.toml"


def test_docs_document_every_key() -> None:
    if not DOCS.is_file():
        pytest.skip("docs/config.md is not in this checkout (sdist)")
    text = DOCS.read_text()
    documented = set(re.findall(r"^\| `([a-z0-9_.]+)` \|", text, flags=re.M))
    assert documented == set(_keys(Config()))


def test_docs_example_is_the_defaults() -> None:
    if not DOCS.is_file():
        pytest.skip("docs/config.md is not in this checkout (sdist)")
    blocks = re.findall(r"```toml\n(.*?)```", DOCS.read_text(), flags=re.S)
    assert len(blocks) == 1
    cfg = parse_config(blocks[0], "docs/config.md")
    assert cfg._replace(source=None) == Config()
    # and it really spells out every key, not just some of them
    spelled = {line.split("=")[0].strip() for line in blocks[0].splitlines() if "=" in line}
    assert spelled == {k.rsplit(".", 1)[1] for k in _keys(Config())}


def _modules_after(statement: str) -> set[str]:
    src = str(pathlib.Path(gpuslurm.__file__).resolve().parents[1])
    code = f"import sys; {statement}; print(' '.join(sorted(sys.modules)))"
    env = {**os.environ, "PYTHONPATH": src}
    return set(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                              check=True).stdout.split())


def test_import_is_light() -> None:
    # Hooks import the config on every job: nothing beyond typing should come along (tomllib only
    # when a file is parsed: the hooks usually find the parse in their cache).
    added = _modules_after("import gpuslurm.config") - _modules_after("pass")
    for heavy in ("gpuslurm.errors", "pathlib", "json", "dataclasses", "inspect", "click", "jinja2",
                  "pynvml", "tomllib"):
        assert heavy not in added, heavy
    parsed = _modules_after("import gpuslurm.config as c; c.parse_config('[hooks]')") - _modules_after("pass")
    assert "tomllib" in parsed


def _float_keys() -> list[str]:
    def value(key: str) -> object:
        out: object = Config()
        for part in key.split("."):
            out = getattr(out, part)
        return out

    return [k for k in _keys(Config()) if type(value(k)) is float]


def test_every_float_key_is_checked() -> None:
    assert len(_float_keys()) >= 29


@pytest.mark.parametrize("key", _float_keys())
@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "+nan"])
def test_non_finite_numbers_are_refused(key: str, value: str) -> None:
    *tables, leaf = key.split(".")
    text = f"[{'.'.join(tables)}]\n{leaf} = {value}\n"
    with pytest.raises(InputError) as info:
        parse_config(text, "/etc/gpuslurm/gpuslurm.toml")
    assert "finite" in str(info.value) and f"{leaf} in [{'.'.join(tables)}]" in str(info.value)


def test_huge_integer_is_refused() -> None:
    with pytest.raises(InputError, match="between"):
        parse_config("[health.ecc]\nmax_uncorrectable = 9223372036854775808\n"
                     "[health.memory_released]\nmax_used_mib = 0\n", "c.toml")
