"""The isolate tests' shared fixture (tests/helpers/mps_helpers.py)."""

from tests.helpers.mps_helpers import mps  # noqa: F401  (the MPS stand-in's run directory and call log)
