"""squeue --json answers a job's user or a broken squeue can give (issue 18), each once exit 70."""

from __future__ import annotations


def _job_text(**fields: str) -> str:
    """One running job on gpu02 with ``fields`` as raw JSON text (``1e999`` is not json.dumps's)."""
    job = {"job_id": "12", "user_id": "1000", "user_name": '"alice"', "job_state": '"RUNNING"',
           "nodes": '"gpu02"', "start_time": "1700000000", "gres_detail": '["gpu:h100:1(IDX:0)"]', **fields}
    return '{"errors": [], "jobs": [{' + ", ".join(f'"{k}": {v}' for k, v in job.items()) + "}]}"


# What a job's user or a broken squeue can put in the answer (issue 18): each was exit 70.
HOSTILE_SQUEUE = {
    "IDX past the range parser's bound": _job_text(gres_detail='["gpu:h100:1(IDX:0-99999)"]'),
    "user_id 1e999": _job_text(user_id="1e999"),
    "5,000-deep nesting": _job_text(name="[" * 5000 + "]" * 5000),
    "5,000-deep document": '{"jobs": ' + "[" * 5000 + "]" * 5000 + "}",
    "start_time NaN": _job_text(start_time="NaN"),
    "a name nested 900 deep": _job_text(name="[" * 900 + "]" * 900),
    "errors as an object": '{"errors": {"error": "x"}, "jobs": []}',
    "a 4,000-digit job id": _job_text(job_id="9" * 4000),
}
