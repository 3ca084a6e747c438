"""docker-slurm/fake-devices.sh: clusters share fake /dev/nvidia* files; the last one out removes them."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "docker-slurm" / "fake-devices.sh"
DEVICE = "/dev/nvidia247"  # a minor no real or test GPU uses


def _bash(ledger: Path, body: str) -> None:
    env = {**os.environ, "FAKE_DEVICES_LEDGER": str(ledger)}
    subprocess.run(["/bin/bash", "-euc", f". {SCRIPT}\n{body}"], env=env, check=True, timeout=30)


@pytest.mark.skipif(os.geteuid() != 0, reason="mknod in /dev needs root")
def test_a_device_stays_until_its_last_holder_releases_it(tmp_path: Path) -> None:
    if os.path.exists(DEVICE):
        pytest.skip(f"{DEVICE} exists already")
    gres = tmp_path / "gres.conf"
    gres.write_text(f"Name=gpu File={DEVICE}\n")
    ledger = tmp_path / "ledger"
    try:
        _bash(ledger, f"fake_devices_from_gres slurm {gres}; fake_devices_from_gres pbs {gres}")
        assert Path(DEVICE).is_char_device()
        _bash(ledger, "fake_devices_release slurm")
        assert Path(DEVICE).is_char_device()  # PBS still holds it
        _bash(ledger, "fake_devices_release pbs")
        assert not os.path.exists(DEVICE)
    finally:
        if os.path.exists(DEVICE):
            os.unlink(DEVICE)


@pytest.mark.skipif(os.geteuid() != 0, reason="mknod in /dev needs root")
def test_a_device_that_existed_before_is_never_removed(tmp_path: Path) -> None:
    if os.path.exists(DEVICE):
        pytest.skip(f"{DEVICE} exists already")
    os.mknod(DEVICE, 0o600 | 0o020000, os.makedev(195, 247))
    gres = tmp_path / "gres.conf"
    gres.write_text(f"Name=gpu File={DEVICE}\n")
    try:
        _bash(tmp_path / "ledger", f"fake_devices_from_gres pbs {gres}; fake_devices_release pbs")
        assert Path(DEVICE).is_char_device()
    finally:
        os.unlink(DEVICE)
