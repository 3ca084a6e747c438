"""``python -m gpuslurm``."""

import sys

from gpuslurm.cli.fast import main  # pick without click, the rest through click

sys.exit(main())
