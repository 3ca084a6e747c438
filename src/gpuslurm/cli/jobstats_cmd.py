"""``gpuslurm jobstats JOBID``: how one job used its GPUs, for its user (docs/jobstats.md)."""

from __future__ import annotations

import json
import sys
import time

import click

from gpuslurm.cli.main import json_option
from gpuslurm.config import load_config
from gpuslurm.report.jobstats import table
from gpuslurm.report.jobstats_load import jobstats_document


@click.command("jobstats")
@click.argument("job_id", metavar="JOBID")
@json_option
@click.option("--db", metavar="PATH",
              help="The monitor's store (default: [monitor] db, else <state_dir>/monitor.db; a user "
                   "who cannot read it gets the file the monitor left for the job's owner).")
@click.option("--source", metavar="prometheus:URL",
              help="Read the job's series from Prometheus (every node it ran on) instead of this node's "
                   "monitor: for a job that spanned nodes, or from a host without the node's files.")
def jobstats(job_id: str, as_json: bool, db: str | None, source: str | None) -> None:
    """How one job used its GPUs: utilisation, memory, power, energy, idle time, a verdict and notes."""
    doc = jobstats_document(load_config(), job_id, now=time.time(), db=db, source=source)
    if as_json:
        sys.stdout.write(json.dumps(doc, indent=2) + "\n")
    else:
        click.echo("\n".join(table(doc)))
