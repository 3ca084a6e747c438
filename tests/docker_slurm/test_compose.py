"""docker-slurm/compose.yaml is the container tests/docker_slurm runs.

``docker compose`` is not on this machine: Debian 12 ships docker-compose 1.29 (Compose v1), which
predates the ``cgroup:`` key the service needs, and Compose v2 is not a Debian 12 package. So
tests/helpers/docker_fixture.py creates the container from compose.yaml through the Docker SDK
(``compose_run_settings``); these tests check, without Docker, that the file says what the tested
container needs and that nothing in it escapes the translation, and test_docker_cluster.py checks
the running container against the file.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from tests.helpers.docker_fixture import COMPOSE, NODE, compose_run_settings, compose_service

CAPS = ["CHOWN", "SYS_ADMIN", "MKNOD"]


def test_the_service_translates_to_the_tested_run() -> None:
    settings = compose_run_settings(compose_service(), CAPS)
    assert settings["hostname"] == NODE and settings["extra_hosts"] == {NODE: "127.0.0.1"}
    assert settings["init"] is True  # the daemons' double forks are reaped
    assert (settings["network_mode"], settings["cgroupns"]) == ("host", "host")
    assert settings["volumes"] == {"/sys/fs/cgroup": {"bind": "/sys/fs/cgroup", "mode": "rw"}}
    assert settings["cap_add"] == CAPS  # ALL: what this machine's root has
    assert settings["security_opt"] == ["seccomp=unconfined", "apparmor=unconfined"]
    assert settings["environment"] == {"GPUSLURM_BUNDLE": "dgx-h100"}


def test_the_build_is_the_tested_build() -> None:
    build = compose_service()["build"]
    root = (COMPOSE.parent / build["context"]).resolve()
    assert root == Path(__file__).resolve().parents[2]  # cluster_image builds from the repository root
    assert (root / build["dockerfile"]) == root / "docker-slurm" / "Dockerfile"


def test_the_devices_are_those_fake_devices_makes_for_the_bundle() -> None:
    settings = compose_run_settings(compose_service(), CAPS)
    bundle = settings["environment"]["GPUSLURM_BUNDLE"]
    gres = subprocess.run([sys.executable, "-m", "gpuslurm", "gres-conf", "--from", bundle],
                          capture_output=True, text=True, timeout=60, check=True).stdout
    files = {f for line in gres.splitlines() for f in re.findall(r"File=(\S+)", line)}
    # fake_devices_from_gres makes every File= and the driver's control files
    made = files | {"/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"}
    assert len(set(settings["devices"])) == len(settings["devices"])
    assert set(settings["devices"]) == {f"{d}:{d}:rwm" for d in made}


@pytest.mark.parametrize("extra", [{"privileged": True}, {"ports": ["6817:6817"]}, {"tmpfs": ["/run"]}])
def test_a_setting_without_translation_fails(extra: dict[str, object]) -> None:
    """A key the fixture does not translate would be a container the tests never ran."""
    with pytest.raises(ValueError, match="no Docker SDK translation"):
        compose_run_settings({**compose_service(), **extra}, CAPS)
