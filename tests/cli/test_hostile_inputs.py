"""Issue 9 §2's hostile inputs, each through the real CLI: one line on stderr, exit 2, no hang."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from gpuslurm.hw.formats.nvml_json import dump_node
from gpuslurm.hw.source import load_node


def gpuslurm(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gpuslurm", *args], capture_output=True, text=True,
                          timeout=60, env={**os.environ, **(env or {})}, check=False)


def assert_one_line(proc: subprocess.CompletedProcess[str], code: int = 2) -> str:
    assert proc.returncode == code, proc.stderr
    assert len(proc.stderr.splitlines()) == 1 and proc.stderr.endswith("\n"), proc.stderr
    assert "Traceback" not in proc.stderr and "internal error" not in proc.stderr
    return proc.stderr


def _nvml_bundle(tmp_path: Path, change: Callable[[dict[str, Any]], None]) -> Path:
    doc = json.loads(dump_node(load_node("l40s-4x")))
    change(doc)
    bundle = tmp_path / "b"
    bundle.mkdir()
    (bundle / "nvml.json").write_text(json.dumps(doc))
    return bundle


def _set(path: str, value: Any) -> Callable[[dict[str, Any]], None]:
    def change(doc: dict[str, Any]) -> None:
        *parents, leaf = path.split(".")
        here: Any = doc
        for p in parents:
            here = here[int(p)] if p.isdigit() else here[p]
        here[int(leaf) if leaf.isdigit() else leaf] = value
    return change


@pytest.mark.parametrize(("path", "value", "field"), [
    ("hostname", {}, "hostname"),
    ("gpus.0.minor", -1, "gpus[0].minor"),
    ("gpus.0.memory_mib", "lots", "gpus[0].memory_mib"),
    ("gpus.1.minor", 2, "gpus[1].minor"),  # gpus[0] has minor 2: duplicate minors
    ("gpus.0.index", True, "gpus[0].index"),
    ("gpus.0.cpu_affinity", [0, "x"], "gpus[0].cpu_affinity"),
    ("gpus.0.mig_mode", "yes", "gpus[0].mig_mode"),
    ("gpus", {"a": 1}, "gpus"),
    ("gpus.0", 7, "gpus[0]"),
    ("cpus.0", [0, 1], "cpus[0]"),
    ("memory_mib", 10**30, "memory_mib"),
    ("links.0", [3], "links[0]"),
])
def test_bad_nvml_json_value_names_the_field(tmp_path: Path, path: str, value: Any, field: str) -> None:
    bundle = _nvml_bundle(tmp_path, _set(path, value))
    err = assert_one_line(gpuslurm("discover", "--from", str(bundle)))
    assert f"{bundle / 'nvml.json'}: {field}" in err


@pytest.mark.parametrize("raw", [b'{"format": Infinity}', b"\xff\xfe{}", b"[" * 100000, b'{"a": NaN}'])
def test_nvml_json_that_is_no_json(tmp_path: Path, raw: bytes) -> None:
    (tmp_path / "nvml.json").write_bytes(raw)
    err = assert_one_line(gpuslurm("discover", "--from", str(tmp_path)))
    assert "nvml.json" in err


def test_infinity_in_a_value(tmp_path: Path) -> None:
    bundle = _nvml_bundle(tmp_path, lambda doc: None)
    text = (bundle / "nvml.json").read_text().replace('"memory_mib": 46068', '"memory_mib": Infinity', 1)
    (bundle / "nvml.json").write_text(text)
    assert "Infinity" in assert_one_line(gpuslurm("discover", "--from", str(bundle)))


@pytest.mark.parametrize("body", [
    "Name=gpu File=/dev/nvidia[0-99999999999]\n", "Name=gpu File=/dev/nvidia[4-]\n",
    "Name=gpu File=/dev/nvidia[0-1e308]\n", "Name=gpu File=/dev/nvidia0 Cores=56-18446744073709551616\n",
])
def test_gres_conf_ranges_are_bounded(tmp_path: Path, body: str) -> None:
    conf = tmp_path / "gres.conf"
    conf.write_text(body)
    err = assert_one_line(gpuslurm("gres-conf", "--from", "l40s-4x", "--check", str(conf)))
    assert "gres.conf: line 1" in err


def test_gres_conf_not_utf8(tmp_path: Path) -> None:
    conf = tmp_path / "gres.conf"
    conf.write_bytes(b"Name=gpu File=/dev/nvidia0 # caf\xe9\n")
    assert "not UTF-8" in assert_one_line(gpuslurm("gres-conf", "--from", "l40s-4x", "--check", str(conf)))


@pytest.mark.parametrize("kind", ["fifo", "dir", "device"])
def test_special_files_are_refused_not_read(tmp_path: Path, kind: str) -> None:
    conf = tmp_path / "gres.conf"
    if kind == "fifo":
        os.mkfifo(conf)
    elif kind == "dir":
        conf.mkdir()
    else:
        conf = Path("/dev/zero")
    err = assert_one_line(gpuslurm("gres-conf", "--from", "l40s-4x", "--check", str(conf)))
    assert "not a regular file" in err


def test_fifo_as_health_json_is_one_line(tmp_path: Path) -> None:
    bundle = tmp_path / "b"
    bundle.mkdir()
    for f in (Path(__file__).parents[2] / "src/gpuslurm/hw/builtin/l40s-4x").iterdir():
        (bundle / f.name).write_bytes(f.read_bytes())
    os.mkfifo(bundle / "health.json")
    proc = gpuslurm("status", "--from", str(bundle))  # hung before: open() waited for a writer
    assert proc.returncode == 0 and "is a FIFO, not a regular file" in proc.stdout, proc.stderr
    from gpuslurm.errors import CaptureError
    from gpuslurm.hw.replay.health import read_scenario

    with pytest.raises(CaptureError, match="FIFO"):  # what the prolog and the epilog call
        read_scenario(bundle / "health.json", ["GPU-x"])


@pytest.mark.parametrize("name", ["config.toml", "fifo"])
def test_fifo_or_nan_config(tmp_path: Path, name: str) -> None:
    cfg = tmp_path / name
    if name == "fifo":
        os.mkfifo(cfg)
    else:
        cfg.write_text("[monitor]\ninterval_s = nan\n")
    err = assert_one_line(gpuslurm("status", "--from", "l40s-4x", env={"GPUSLURM_CONFIG": str(cfg)}))
    assert str(cfg) in err


@pytest.mark.parametrize("sep", ["\n", "\r", "\v", "\f", "\x1c", "\x1d", "\x1e", "\x85", "\u2028", "\u2029"])
def test_line_separators_in_a_message_stay_on_one_line(tmp_path: Path, sep: str) -> None:
    bundle = tmp_path / f"a{sep}b"
    assert_one_line(gpuslurm("discover", "--from", str(bundle)))


@pytest.mark.parametrize("kind", ["fifo", "not-utf8"])
def test_gres_template_is_read_safely(tmp_path: Path, kind: str) -> None:
    template = tmp_path / "t.j2"
    if kind == "fifo":
        os.mkfifo(template)  # jinja2 opened it and waited for a writer
    else:
        template.write_bytes(b"{{ hostname }}\xff\n")
    err = assert_one_line(gpuslurm("gres-conf", "--from", "l40s-4x", "--template", str(template)))
    assert str(template) in err


def test_the_hooks_never_import_clustershell() -> None:
    """Host lists use ClusterShell; the prolog, run on every job, must not pay for it."""
    code = ("import sys; from gpuslurm.slurm import entry, hooks; "
            "from gpuslurm.hooks import prolog, epilog, taskprolog; "
            "from gpuslurm.slurm import hookenv; "
            "print(sorted(m for m in sys.modules if m.startswith('ClusterShell')))")
    out = subprocess.run([sys.executable, "-X", "importtime", "-c", code], capture_output=True,
                         text=True, timeout=60, check=True)
    assert out.stdout.strip() == "[]" and "ClusterShell" not in out.stderr


@pytest.mark.parametrize("body", ["fifo", '[gpus."0-99999999999"]\nmig = false\n',
                                  '[gpus."4-"]\nmig = false\n', '[gpus."0-1e308"]\nmig = false\n',
                                  b'[gpus."0"]\nmig = false # \xff\n'])
def test_mig_layout_files(tmp_path: Path, body: str | bytes) -> None:
    layout = tmp_path / "mig.toml"
    if body == "fifo":
        os.mkfifo(layout)
    elif isinstance(body, bytes):
        layout.write_bytes(body)
    else:
        layout.write_text(body)
    err = assert_one_line(gpuslurm("mig", "assert", "--from", "a100-mig", str(layout)))
    assert str(layout) in err


HUGE = "9" * 5000  # past Python's own int() digit limit as well as every bound


@pytest.mark.parametrize(("bundle", "name", "old", "new"), [
    ("a100-mig", "mig-minors", "gpu0/gi1/access 12", f"gpu0/gi1/access {HUGE}"),
    ("a100-mig", "mig-minors", "gpu0/gi1/access 12", "gpu99999999999/gi1/access 12"),
    ("l40s-4x", "nvidia-smi-q.xml", "<minor_number>2<", f"<minor_number>{HUGE}<"),
    ("l40s-4x", "nvidia-smi-q.xml", "<minor_number>2<", "<minor_number>99999999999999<"),
    ("a100-mig", "nvidia-smi-L.txt", "GPU 0:", f"GPU {HUGE}:"),
    ("l40s-4x", "meminfo", "MemTotal:", f"MemTotal: {HUGE} kB\nX:"),
    ("l40s-4x", "lscpu.csv", "\n0,", f"\n{HUGE},"),
])
def test_numbers_in_bundle_files_are_bounded(tmp_path: Path, bundle: str, name: str, old: str,
                                             new: str) -> None:
    src = Path(__file__).parents[2] / "src/gpuslurm/hw/builtin" / bundle
    dst = tmp_path / "b"
    dst.mkdir()
    for f in src.iterdir():
        (dst / f.name).write_bytes(f.read_bytes())
    text = (dst / name).read_text()
    assert old in text
    (dst / name).write_text(text.replace(old, new, 1))
    assert_one_line(gpuslurm("gres-conf", "--from", str(dst)))
