import pathlib
import pytest
SHARED = pathlib.Path(__file__).resolve().parents[1].parent / "shared" / "fixtures" / "real"
@pytest.fixture(scope="session")
def real_fixtures() -> pathlib.Path:
    if not SHARED.is_dir():
        pytest.skip("../shared/fixtures/real is absent (only developer checkouts and CI have it)")
    return SHARED
