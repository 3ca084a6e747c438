"""The install tests' shared fixture (tests/helpers/install_helpers.py)."""

from tests.helpers.install_helpers import dirs  # noqa: F401  (a Slurm etc and a prefix under tmp_path)
