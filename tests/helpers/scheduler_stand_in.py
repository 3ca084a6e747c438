"""A node's scheduler for tests that run the monitor, ``status`` or the hooks without a real
cluster: a stand-in ``squeue`` that answers no jobs and no ``qstat``, so what a test sees never
depends on whatever Slurm or PBS the host runs (a busy or stopped test cluster, a SLURM_CONF)."""

from __future__ import annotations

import json
from pathlib import Path

NO_JOBS = json.dumps({"meta": {}, "errors": [], "jobs": []})


def no_jobs_config(root: Path) -> Path:
    """A config under ``root`` whose scheduler is Slurm with a stand-in ``squeue`` answering no
    jobs, the other scheduler commands absent, and run, state and violations directories of its
    own; its path."""
    bindir = root / "scheduler-bin"
    bindir.mkdir(parents=True, exist_ok=True)
    squeue = bindir / "squeue"
    squeue.write_text(f"#!/bin/sh\necho '{NO_JOBS}'\n")
    squeue.chmod(0o755)
    absent = {name: bindir / f"no-{name}" for name in ("scontrol", "scancel", "sacctmgr", "sshare", "qstat",
                                                         "pbsnodes", "qmgr")}
    config = root / "gpuslurm.toml"
    config.write_text(
        f'[paths]\nsqueue = "{squeue}"\n' + "".join(f'{k} = "{v}"\n' for k, v in absent.items())
        + f'run_dir = "{root / "run"}"\nstate_dir = "{root / "state"}"\n'
        f'violations_dir = "{root / "violations"}"\n[scheduler]\nkind = "slurm"\n')
    return config
