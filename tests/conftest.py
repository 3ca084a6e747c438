import os
import pathlib

import pytest

# The session-scoped Slurm test cluster (docker-slurm/cluster.sh), for tests marked slurm.
from cluster_fixture import slurm_cluster  # noqa: F401

SHARED = pathlib.Path(__file__).resolve().parents[1].parent / "shared" / "fixtures" / "real"


@pytest.fixture(scope="session")
def real_fixtures() -> pathlib.Path:
    if not SHARED.is_dir():
        pytest.skip("../shared/fixtures/real is absent (only developer checkouts and CI have it)")
    return SHARED


def pytest_runtest_setup(item: pytest.Item) -> None:
    # Tests marked `slurm` run the real slurmd -G; skip them only when this machine can't.
    if item.get_closest_marker("slurm") is not None:
        from slurm_harness import slurm_available

        reason = slurm_available()
        if reason:
            if os.environ.get("GPUSLURM_REQUIRE_SLURM"):  # CI: a skip here would hide every e2e test
                pytest.fail(f"GPUSLURM_REQUIRE_SLURM is set, but {reason}", pytrace=False)
            pytest.skip(reason)
