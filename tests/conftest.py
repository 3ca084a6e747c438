import os
import pathlib
import signal

import pytest
from hypothesis import HealthCheck, settings
from tests.helpers.cluster_fixture import host_cluster_lock, slurm_cluster  # noqa: F401  (session Slurm cluster, marker slurm)
from tests.helpers.pbs_fixture import pbs_cluster, pbs_installed  # noqa: F401  (session PBS cluster, marker pbs)

# Property tests: no per-example deadline (a 2-core CI machine is noisy); derandomised under CI so a
# run is reproducible, each test's example count bounded so all of them stay within their CI budget.
settings.register_profile(
    "ci", derandomize=True, deadline=None, max_examples=100,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile("dev", deadline=None, max_examples=100,
                          suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("ci" if os.environ.get("CI") else os.environ.get("GPUSLURM_HYPOTHESIS_PROFILE", "dev"))

# A shell starts a background command (`cmd &` without job control) with SIGINT ignored, and an
# ignored signal stays ignored across exec: every process a test starts and then sends SIGINT
# (watch, pick --wait, the monitor) would ignore it and the test would time out. Python's own
# handler here makes the children start with the default disposition again.
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

SHARED = pathlib.Path(__file__).resolve().parents[1].parent / "shared" / "fixtures" / "real"


@pytest.fixture(scope="session")
def real_fixtures() -> pathlib.Path:
    if not SHARED.is_dir():
        pytest.skip("../shared/fixtures/real is absent (only developer checkouts and CI have it)")
    return SHARED


def pytest_runtest_setup(item: pytest.Item) -> None:
    # Tests marked `slurm` run the real slurmd -G; skip them only when this machine can't.
    if item.get_closest_marker("slurm") is not None:
        from tests.helpers.slurm_harness import slurm_available

        reason = slurm_available()
        if reason:
            if os.environ.get("GPUSLURM_REQUIRE_SLURM"):  # CI: a skip here would hide every e2e test
                pytest.fail(f"GPUSLURM_REQUIRE_SLURM is set, but {reason}", pytrace=False)
            pytest.skip(reason)
