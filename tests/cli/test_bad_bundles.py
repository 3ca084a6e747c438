"""Issue #2's bad inputs, each as a whole process: one line naming the file, exit code 2."""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from gpuslurm.hw.source import BUILTIN_DIR


def _truncate_xml(b: Path) -> None:
    text = (b / "nvidia-smi-q.xml").read_text()
    (b / "nvidia-smi-q.xml").write_text(text[: len(text) // 2])


def _topo_drops_gpus(b: Path) -> None:
    lines = (b / "nvidia-smi-topo.txt").read_text().splitlines()
    head, rows = lines[0], [ln for ln in lines[1:] if ln.startswith("GPU")]
    cols = head.split("\t")
    keep = [i for i, c in enumerate(cols) if not c.strip().startswith(("GPU4", "GPU5", "GPU6", "GPU7"))]
    cut = ["\t".join(r.split("\t")[i] for i in keep) for r in [head, *rows[:4]]]
    (b / "nvidia-smi-topo.txt").write_text("\n".join(cut) + "\n")


def _lscpu_without_core(b: Path) -> None:
    rows = [ln for ln in (b / "lscpu.csv").read_text().splitlines() if not ln.startswith("#")]
    (b / "lscpu.csv").write_text("# CPU,Socket,Node\n" + "\n".join(
        f"{r.split(',')[0]},{r.split(',')[2]},{r.split(',')[3]}" for r in rows) + "\n")


def _affinity_beyond_cpus(b: Path) -> None:
    rows = (b / "lscpu.csv").read_text().splitlines()
    (b / "lscpu.csv").write_text("\n".join(r for r in rows if r.startswith("#") or int(r.split(",")[0]) < 200)
                                 + "\n")


def _unknown_mig_profile(b: Path) -> None:
    text = (b / "nvidia-smi-L.txt").read_text()
    (b / "nvidia-smi-L.txt").write_text(text.replace("MIG 2g.20gb", "MIG 9x.huge", 1))


CASES: list[tuple[str, str, Callable[[Path], None], str]] = [
    ("dgx-h100", "truncated-xml", _truncate_xml, "nvidia-smi-q.xml"),
    ("dgx-h100", "topo-count", _topo_drops_gpus, "nvidia-smi-topo.txt"),
    ("dgx-h100", "lscpu-columns", _lscpu_without_core, "lscpu.csv"),
    ("dgx-h100", "affinity-cpus", _affinity_beyond_cpus, "200-223"),
    ("a100-mig", "mig-profile", _unknown_mig_profile, "9x.huge"),
]


@pytest.mark.parametrize(("bundle", "label", "corrupt", "named"), CASES, ids=[c[1] for c in CASES])
def test_bad_bundle_gives_one_line_and_exit_2(tmp_path: Path, bundle: str, label: str,
                                               corrupt: Callable[[Path], None], named: str) -> None:
    copy = tmp_path / bundle
    shutil.copytree(BUILTIN_DIR / bundle, copy)
    corrupt(copy)
    proc = subprocess.run([sys.executable, "-m", "gpuslurm", "gres-conf", "--from", str(copy)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2, proc.stderr
    assert proc.stdout == ""
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr
    assert proc.stderr.startswith("gpuslurm: ") and named in proc.stderr, proc.stderr


def test_bundle_with_zero_gpus_writes_nothing_and_exits_2(tmp_path: Path) -> None:
    copy = tmp_path / "no-gpus"
    shutil.copytree(BUILTIN_DIR / "dgx-h100", copy)
    (copy / "nvidia-smi-topo.txt").unlink()
    (copy / "nvml.json").write_text('{"format": "gpuslurm-nvml", "version": 1, "gpus": []}')
    out = tmp_path / "gres.conf"
    argv = [sys.executable, "-m", "gpuslurm", "gres-conf", "--from", str(copy), "-o", str(out)]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2, proc.stderr
    assert not out.exists()
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr
    assert proc.stderr.startswith(f"gpuslurm: {copy}: ") and "no GPUs" in proc.stderr, proc.stderr
