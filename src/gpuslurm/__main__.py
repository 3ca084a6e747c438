"""``python -m gpuslurm``."""

import sys

from gpuslurm.cli.main import main

sys.exit(main())
