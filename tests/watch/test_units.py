"""The systemd units in packaging/, read as an admin installs them: every path they run or name is
made by docs/monitor.md's install steps (or is a URL), and the monitor's unit leaves /dev/kmsg
readable and descriptors to spare, as docs/health.md and docs/monitor.md say."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
UNITS = sorted((ROOT / "packaging").glob("*.service"))
MONITOR = ROOT / "packaging" / "gpuslurm-monitor.service"


def _settings(unit: Path) -> dict[str, list[str]]:
    """Each ``Key=value`` of the unit (comments left out), every value of a repeated key."""
    out: dict[str, list[str]] = {}
    for line in unit.read_text().splitlines():
        if "=" in line and not line.lstrip().startswith(("#", ";", "[")):
            key, value = line.split("=", 1)
            out.setdefault(key.strip(), []).append(value.strip())
    return out


def _install_steps() -> list[list[str]]:
    """The commands of docs/monitor.md's install block (``# cmd && cmd | cmd``), each as argv."""
    text = (ROOT / "docs" / "monitor.md").read_text().split("## The service", 1)[1]
    block = re.search(r"```console\n(.*?)```", text, flags=re.S)
    assert block is not None, "docs/monitor.md's service section has no install block"
    steps = []
    for line in block.group(1).splitlines():
        for cmd in re.split(r"&&|\|", line.lstrip("# ")):
            steps.append(shlex.split(cmd))
    return steps


def _made_by_install() -> tuple[set[str], set[str]]:
    """(directories, files) the install steps make."""
    dirs: set[str] = set()
    files: set[str] = set()
    for argv in _install_steps():
        if argv[:1] == ["install"] and "-d" in argv:
            dirs.add(argv[-1])
        elif argv[:1] == ["ln"]:
            files.add(argv[-1])
        elif argv[:1] == ["tar"] and "-C" in argv:
            dirs.add(argv[argv.index("-C") + 1])
        elif argv[:3] == ["python3", "-m", "venv"]:
            files.add(f"{argv[3]}/bin/gpuslurm")  # pip then installs the console script there
    return dirs, files


def _in_checkout(path: str, dirs: set[str]) -> bool:
    """Whether ``path`` lies in a directory the checkout is unpacked into, and the checkout has it."""
    return any(path.startswith(d.rstrip("/") + "/") and (ROOT / path[len(d.rstrip("/")) + 1:]).exists()
               for d in dirs)


def test_there_are_units_to_check() -> None:
    assert {u.name for u in UNITS} >= {"gpuslurm-monitor.service", "gpuslurm-throttle-auto.service"}


@pytest.mark.parametrize("unit", UNITS, ids=lambda u: u.name)
def test_every_path_a_unit_runs_or_names_is_made_by_the_documented_install(unit: Path) -> None:
    dirs, files = _made_by_install()
    settings = _settings(unit)
    program = shlex.split(settings["ExecStart"][0])[0]
    assert program in files, f"{unit.name}: ExecStart runs {program}, which no install step makes"
    for link in (argv for argv in _install_steps() if argv[:1] == ["ln"]):
        assert _in_checkout(link[-2], dirs) or link[-2] in files, f"{link[-2]} is made by no step"
    docs = [d for value in settings["Documentation"] for d in value.split()]
    assert docs
    for doc in docs:
        if doc.startswith("https://"):
            continue
        assert doc.startswith("file://"), f"{unit.name}: Documentation={doc} is neither a file nor https"
        assert _in_checkout(doc.removeprefix("file://"), dirs), \
            f"{unit.name}: Documentation={doc} is not a page the install puts there"
    copies = [argv for argv in _install_steps() if argv[:1] == ["cp"]]
    assert all(_in_checkout(argv[1], dirs) for argv in copies)


def test_the_monitor_unit_leaves_dev_kmsg_readable_as_the_docs_say() -> None:
    settings = _settings(MONITOR)
    assert settings.get("ProtectKernelLogs", ["no"]) == ["no"]  # "yes" denies /dev/kmsg
    assert settings["PrivateDevices"] == ["no"]
    for page in ("health.md", "monitor.md"):
        assert "no `ProtectKernelLogs`" in " ".join((ROOT / "docs" / page).read_text().split()), page


def test_the_monitor_unit_raises_the_descriptor_limit() -> None:
    (limit,) = _settings(MONITOR)["LimitNOFILE"]
    assert int(limit.split(":")[-1]) >= 65536


def test_the_checker_sees_a_path_nothing_makes(tmp_path: Path) -> None:
    dirs, files = _made_by_install()
    assert "/usr/local/bin/gpuslurm" in files and "/opt/gpuslurm" in dirs
    assert not _in_checkout("/usr/share/doc/gpuslurm/monitor.md", dirs)
    assert not _in_checkout("/opt/gpuslurm/docs/no-such-page.md", dirs)
    assert _in_checkout("/opt/gpuslurm/docs/monitor.md", dirs)
