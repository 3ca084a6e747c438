"""``gpuslurm jobstats`` as an ordinary user runs it, for the tests that play that user.

The users' interpreter (stdlib + this checkout, :func:`tests.helpers.cluster_fixture.users_site`)
has no click, so the scripts call the CLI's use case and its entry policy directly: the exit code
and the one line the CLI would give.
"""

from __future__ import annotations

# argv: JOBID [NOW [SOURCE]] (NOW: the clock; SOURCE: e.g. prometheus:URL)
JOBSTATS_AS_USER = """
import json, sys, time
from gpuslurm.config import load_config
from gpuslurm.errors import describe
from gpuslurm.report.jobstats_load import jobstats_document
now = float(sys.argv[2]) if len(sys.argv) > 2 else time.time()
extra = {"source": sys.argv[3]} if len(sys.argv) > 3 else {}
try:
    doc = jobstats_document(load_config(), sys.argv[1], now=now, **extra)
except Exception as exc:
    code, message = describe(exc)
    print(message, file=sys.stderr)
    sys.exit(code)
print(json.dumps(doc))
"""
