"""Feed a gres.conf to the real ``slurmd -G`` in a temporary config directory.

Device files are real character devices made under a temporary device root (never /dev), so the
tests need root (CAP_MKNOD) and Slurm's slurmd; ``slurm_available()`` says why when they can't run.
Tests marked ``@pytest.mark.slurm`` are skipped by tests/conftest.py for that reason only.
"""

from __future__ import annotations

import functools
import os
import re
import stat
import tempfile
from collections.abc import Iterable
from pathlib import Path

from gpuslurm.slurm.slurmd_g import SlurmdReport, SlurmGres, expand_files, run_slurmd_g, run_slurmd_report

SLURMD = "/usr/sbin/slurmd"
NVIDIA_MAJOR = 195
# The real nvidia-caps major is assigned at module load (235, 508, 511...); slurmd accepts any.
NVIDIA_CAPS_MAJOR = 235

_NODE_NAME = re.compile(r"^\s*NodeName=(\S+)", re.MULTILINE)
_FILE_KEYS = re.compile(r"(?i)(?:^|\s)(?:File|Files|MultipleFiles)=(\S+)")


@functools.cache
def slurm_available() -> str | None:
    """Why slurmd -G tests cannot run here, or None when they can."""
    if not os.access(SLURMD, os.X_OK):
        return f"{SLURMD} is not installed (CI installs Debian's slurm-wlm)"
    if os.geteuid() != 0:
        return "slurmd -G tests need root to make device nodes with mknod"
    with tempfile.TemporaryDirectory() as tmp:
        try:
            os.mknod(Path(tmp) / "probe", 0o600 | stat.S_IFCHR, os.makedev(NVIDIA_MAJOR, 0))
        except PermissionError:
            return "mknod is not permitted here (no CAP_MKNOD)"
    return None


def make_devices(dev_root: Path, minors: Iterable[int], caps: Iterable[int] = ()) -> None:
    """Create ``dev_root/nvidiaN`` and ``dev_root/nvidia-caps/nvidia-capN`` character devices."""
    for minor in minors:
        _mknod(dev_root / f"nvidia{minor}", NVIDIA_MAJOR, minor)
    for minor in caps:
        _mknod(dev_root / "nvidia-caps" / f"nvidia-cap{minor}", NVIDIA_CAPS_MAJOR, minor)


def _mknod(path: Path, major: int, minor: int) -> None:
    want = os.makedev(major, minor)
    if path.exists() or path.is_symlink():
        st = path.lstat()
        if stat.S_ISCHR(st.st_mode) and st.st_rdev == want:
            return
        path.unlink()
    path.parent.mkdir(parents=True, exist_ok=True)
    os.mknod(path, 0o666 | stat.S_IFCHR, want)


def write_slurm_conf(conf_dir: Path, node_line: str, gres_types: str = "gpu,mps,shard") -> str:
    """Write a minimal slurm.conf around ``node_line`` and return the node's name.

    The node keeps its own name (dgx-h100, say): slurmd is run with ``-N`` that name, so gres.conf
    lines with ``NodeName=`` work unchanged and the local host name never matters.
    """
    match = _NODE_NAME.match(node_line)
    if not match:
        raise ValueError(f"not a NodeName= line: {node_line!r}")
    conf_dir.mkdir(parents=True, exist_ok=True)
    lines = [
        "ClusterName=gpuslurm-test",
        "SlurmctldHost=localhost",
        # Take Sockets/Cores from the node line, not from this (small) machine.
        "SlurmdParameters=config_overrides",
        f"GresTypes={gres_types}",
        "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_Core",
        "ProctrackType=proctrack/linuxproc",
        "TaskPlugin=task/none",
        f"SlurmdSpoolDir={conf_dir / 'spool'}",
        f"SlurmdPidFile={conf_dir / 'slurmd.pid'}",
        node_line.strip(),
        "PartitionName=test Nodes=ALL Default=YES",
    ]
    (conf_dir / "slurm.conf").write_text("\n".join(lines) + "\n")
    return match.group(1)


def node_name_of(conf_dir: Path) -> str:
    """The NodeName of the slurm.conf in ``conf_dir``."""
    match = _NODE_NAME.search((conf_dir / "slurm.conf").read_text())
    if not match:
        raise ValueError(f"{conf_dir / 'slurm.conf'}: no NodeName= line")
    return match.group(1)


def write_gres_conf(conf_dir: Path, gres_conf_text: str) -> None:
    """Write gres.conf, first checking that every device it names exists.

    slurmd waits about 19 s for a missing File before failing; a missing device here is a mistake
    in the test's make_devices call, so say so at once.
    """
    missing = [p for expr in _FILE_KEYS.findall(gres_conf_text) for p in expand_files(expr)
               if not os.path.exists(p)]
    if missing:
        raise FileNotFoundError(f"gres.conf names devices that do not exist: {', '.join(missing)}")
    (conf_dir / "gres.conf").write_text(gres_conf_text)


def slurmd_parse(conf_dir: Path, gres_conf_text: str) -> tuple[SlurmGres, ...]:
    """Write gres.conf beside conf_dir/slurm.conf and return what slurmd -G understood.

    Raises CommandError when slurmd fails or prints any error, fatal or WARNING line.
    """
    write_gres_conf(conf_dir, gres_conf_text)
    return run_slurmd_g(conf_dir, SLURMD, node_name=node_name_of(conf_dir))


def slurmd_report(conf_dir: Path, gres_conf_text: str) -> SlurmdReport:
    """Like slurmd_parse, but problems reported with exit 0 are returned, not raised."""
    write_gres_conf(conf_dir, gres_conf_text)
    return run_slurmd_report(conf_dir, SLURMD, node_name=node_name_of(conf_dir))
