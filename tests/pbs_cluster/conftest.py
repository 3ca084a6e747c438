"""Fixtures of the PBS tests: PBS command wrappers that reach the test cluster's namespace."""

from __future__ import annotations

from pathlib import Path

import pytest
from tests.helpers.pbs_fixture import PBS_DIR, PREFIX, PbsCluster
from tests.helpers.pbs_helpers import hooked  # noqa: F401  (gpuslurm installed: each module its own)

COMMANDS = ("qstat", "pbsnodes", "qalter", "qhold", "qrerun", "qdel", "qmgr")


@pytest.fixture(scope="module")
def pbs_bin(pbs_cluster: PbsCluster) -> Path:
    """Wrappers that run each PBS command inside the cluster's namespace, as gpuslurm's [paths]."""
    out = pbs_cluster.state_dir / "gpuslurm-bin"
    out.mkdir(exist_ok=True)
    for name in COMMANDS:
        wrapper = out / name
        wrapper.write_text(f"#!/bin/sh\nexport GPUSLURM_PBS_DIR={pbs_cluster.state_dir} "
                           f"PBS_CONF_FILE={pbs_cluster.env['PBS_CONF_FILE']}\n"
                           f'exec /bin/bash {PBS_DIR / "cluster.sh"} exec {PREFIX / "bin" / name} "$@"\n')
        wrapper.chmod(0o755)
    return out
