"""``gpuslurm jobstats JOBID``: how one job used its GPUs, for its user (docs/jobstats.md)."""

from __future__ import annotations

import json
import sys
import time

import click

from gpuslurm.cli.main import json_option
from gpuslurm.config import load_config
from gpuslurm.jsondoc import document
from gpuslurm.report.jobstats import table, to_json
from gpuslurm.report.jobstats_load import job_stats


@click.command("jobstats")
@click.argument("job_id", metavar="JOBID")
@json_option
@click.option("--db", metavar="PATH",
              help="The monitor's store (default: [monitor] db, else <state_dir>/monitor.db).")
def jobstats(job_id: str, as_json: bool, db: str | None) -> None:
    """How one job used its GPUs: utilisation, memory, power, energy, idle time, a verdict and notes."""
    st = job_stats(load_config(), job_id, now=time.time(), db=db)
    if as_json:
        sys.stdout.write(json.dumps(document("jobstats", to_json(st), node=st.job.node), indent=2) + "\n")
    else:
        click.echo("\n".join(table(st)))
