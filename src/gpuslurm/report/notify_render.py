"""End-of-job messages (``[notify]``, docs/notify.md): whether a finished job's figures call for
one, and its text, rendered from the site's jinja2 templates (pure: the templates come as text).

The job's user writes its name and comment, and may write its account (PBS) and, through the
passwd database, its user name: that text is data, never template source, and in a webhook body
it reaches the template only as :class:`UserText`, which only the ``tojson`` filter turns into
output (a JSON string, ASCII-only, so quotes, backslashes, newlines, ``{{ }}``, terminal escapes
and undecodable bytes stay inside one JSON string). Printing it any other way (``{{ job.name }}``,
``~``, ``|upper``, ``|string``) is a :class:`UnsafeTemplateError`, so a template cannot forget. The
environment is jinja2's sandbox with autoescape off (JSON is not HTML), and a rendered webhook
body must parse as JSON or nothing is sent. A mail body is plain text: the user's text appears
with its control characters (but newline and tab) shown as ``?``; the headers never carry it.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

from gpuslurm.errors import InputError
from gpuslurm.report.jobstats import J_PER_KWH, JobStats

if TYPE_CHECKING:
    from jinja2.sandbox import SandboxedEnvironment

VERDICTS = ("idle GPUs", "room to improve")
MAX_TEXT = 4096  # a job's name or comment kept for a message (Slurm's own limits are larger)
MAX_BODY = 256 * 1024  # a rendered message (Slack takes 40 000 characters of text, Teams 28 KB)

# The built-in mail body (packaging/notify/mail.txt.j2 is the same text, for sites to start from).
MAIL_TEMPLATE = """\
Your job {{ job.id }} ("{{ job.name }}") on {{ job.node }} ran {{ job.duration }} and its GPUs
were used poorly: {{ verdict }}
{%- if util_mean_pct is not none %}, {{ util_mean_pct }} % mean utilisation{% endif %}.

{% for g in gpus -%}
  {{ g.uuid }}: {{ g.util_mean_pct }} % mean utilisation, idle {{ g.idle }},
    peak memory {{ g.mem_peak_gib }} GiB
{% endfor %}
{%- if energy_kwh is not none %}
Energy used by its GPUs: {{ energy_kwh }} kWh.
{% endif %}
{% for n in notes -%}
* {{ n }}
{% endfor %}
{%- for l in links %}
See {{ l }}
{% endfor %}
`gpuslurm jobstats {{ job.id }}` on {{ job.node }} shows the job's figures.
This message is automatic, from your cluster's GPU monitor.
"""


class UnsafeTemplateError(InputError):
    """A template printed the user's text other than through ``tojson``, or rendered no JSON."""


class JobText(NamedTuple):
    """What the scheduler knows of the job and the store does not: the user's own words."""

    name: str = ""
    comment: str = ""


class Rule(NamedTuple):
    """When a finished job gets a message (``[notify]``)."""

    verdicts: tuple[str, ...] = ("idle GPUs",)
    below_util_pct: float = 0.0  # also when the GPUs' mean utilisation is below this; 0: off
    min_job_s: float = 1800.0


def wants_message(st: JobStats, rule: Rule) -> bool:
    """Whether the finished job's figures are below the site's efficiency for a message."""
    j = st.job
    if j.last_seen - j.start < rule.min_job_s or st.verdict == "no samples":
        return False
    if st.verdict in rule.verdicts:
        return True
    utils = [g.util_mean_pct for g in st.gpus if g.util_mean_pct is not None]
    return bool(utils) and rule.below_util_pct > 0 and sum(utils) / len(utils) < rule.below_util_pct


class UserText:
    """A job user's text in a webhook template: only ``|tojson`` prints it."""

    __slots__ = ("_text",)

    def __init__(self, text: str) -> None:
        self._text = text

    def _refuse(self, *args: object) -> str:
        raise UnsafeTemplateError("the template prints a job's user text without tojson "
                              "(write {{ job.name | tojson }})", source="[notify] webhook_template")

    __str__ = __html__ = __format__ = _refuse

    def __repr__(self) -> str:
        return "UserText(...)"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, UserText) and other._text == self._text

    def __hash__(self) -> int:
        return hash(self._text)

    def __bool__(self) -> bool:
        return bool(self._text)


def _plain(value: Any) -> Any:
    if isinstance(value, UserText):
        return value._text
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


def tojson(value: Any, max_chars: int | None = None) -> str:
    """The value as JSON, ASCII-only (every control character, quote and backslash escaped); a
    string cut to ``max_chars`` first (Slack refuses a field over 2000)."""
    plain = _plain(value)
    if max_chars is not None and isinstance(plain, str) and len(plain) > max_chars:
        plain = plain[:max(max_chars - 1, 0)] + "…"
    return json.dumps(plain, ensure_ascii=True, allow_nan=False)


def _finalize(value: Any) -> Any:
    if isinstance(value, UserText):
        value._refuse()
    return value


def _environment() -> SandboxedEnvironment:
    from jinja2 import StrictUndefined  # only where a message is rendered: not on the CLI's path
    from jinja2.sandbox import SandboxedEnvironment

    env = SandboxedEnvironment(autoescape=False, undefined=StrictUndefined, finalize=_finalize,
                               keep_trailing_newline=True)
    env.filters["tojson"] = tojson
    return env


def shown(text: str) -> str:
    """The user's text for a mail body: control characters (but newline and tab) as ``?``."""
    return "".join(c if c.isprintable() or c in "\n\t" else "?" for c in text[:MAX_TEXT])


def context(st: JobStats, text: JobText, *, webhook: bool) -> dict[str, Any]:
    """The variables a template sees (docs/notify.md lists them)."""
    j = st.job

    def user(s: str | None) -> Any:
        s = (s or "")[:MAX_TEXT]
        return UserText(s) if webhook else shown(s)

    utils = [g.util_mean_pct for g in st.gpus if g.util_mean_pct is not None]
    return {
        "job": {"id": j.job_id, "node": j.node, "uid": j.uid, "start": j.start, "end": j.last_seen,
                "duration_s": j.last_seen - j.start, "duration": _duration(j.last_seen - j.start),
                "user": user(j.user), "account": user(j.account), "name": user(text.name),
                "comment": user(text.comment)},
        "verdict": st.verdict,
        "util_mean_pct": round(sum(utils) / len(utils), 1) if utils else None,
        "energy_kwh": None if st.energy_j is None else round(st.energy_j / J_PER_KWH, 3),
        "gpus": [{"uuid": g.uuid, "util_mean_pct": _round(g.util_mean_pct),
                  "mem_peak_gib": _round(None if g.mem_peak_mib is None else g.mem_peak_mib / 1024),
                  "idle_s": round(g.idle_s), "idle": _duration(g.idle_s)} for g in st.gpus],
        "notes": [t for n in st.notes for t in (n.text, n.site_text) if t],
        "links": list(st.links),
    }


def _round(value: float | None) -> float | None:
    return None if value is None or not math.isfinite(value) else round(value, 1)


def _duration(seconds: float) -> str:
    minutes = int(max(seconds, 0) // 60)
    return f"{minutes // 60} h {minutes % 60:02d} min" if minutes >= 60 else f"{minutes} min"


def render_webhook(template: str, variables: Mapping[str, Any], source: str = "webhook_template") -> bytes:
    """The webhook's JSON body; UnsafeTemplateError when the template prints user text other than
    through ``tojson``, fails, or renders something that is not one JSON value."""
    from jinja2 import TemplateError

    try:
        body = _environment().from_string(template).render(variables)
    except UnsafeTemplateError:
        raise
    except (TemplateError, ArithmeticError, LookupError, TypeError, ValueError) as exc:
        raise UnsafeTemplateError(f"cannot render: {type(exc).__name__}: {exc}", source=source) from None
    if len(body) > MAX_BODY:
        raise UnsafeTemplateError(f"renders {len(body)} characters, over {MAX_BODY}", source=source)
    try:
        json.loads(body)
    except ValueError as exc:
        raise UnsafeTemplateError(f"does not render JSON: {exc}", source=source) from None
    return body.encode("utf-8")


def render_mail(template: str, variables: Mapping[str, Any], source: str = "mail_template") -> str:
    """The mail's plain-text body (the headers are the sender's, never the template's)."""
    from jinja2 import TemplateError

    try:
        body = _environment().from_string(template).render(variables)
    except (TemplateError, ArithmeticError, LookupError, TypeError, ValueError) as exc:
        raise UnsafeTemplateError(f"cannot render: {type(exc).__name__}: {exc}", source=source) from None
    return body[:MAX_BODY]


def sample_stats() -> JobStats:
    """A job's figures to check a template with when the monitor starts."""
    from gpuslurm.report.jobstats import GpuFigures, Note
    from gpuslurm.state.store_job import JobRecord

    job = JobRecord("1", "node", "user", 1000, "account", 0.0, 3600.0, "map", (), ())
    gpu = GpuFigures("GPU-0", None, 60, 0.0, 1.0, 3.0, 1024.0, 512.0, 81920.0, 70.0, 252000.0, 3600.0,
                     3600.0, 3500.0, 3500.0, ())
    return JobStats(job, False, (gpu,), 252000.0, "idle GPUs", (Note("idle", "1 of 1 GPU(s) idle"),),
                    ("https://example.org",))


def check_templates(templates: Sequence[tuple[str, str, bool]]) -> None:
    """Render each (text, source, is_webhook) on sample figures: InputError (exit 2) when one fails."""
    st = sample_stats()
    for text, source, webhook in templates:
        v = context(st, JobText("name", "comment"), webhook=webhook)
        if webhook:
            render_webhook(text, v, source)
        else:
            render_mail(text, v, source)
