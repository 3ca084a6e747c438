"""End-of-job messages' text (report/notify_render.py): the shipped Slack, Teams and mail templates,
and the job's user's text reaching a webhook body only through the JSON encoder.

The attacker is the job's user: they write its name and comment (and, on PBS, its account), and
want them to become more of the JSON than one string (a Slack ``<!channel>`` block, a forged
field), or template source (``{{ }}``), or escape sequences on whoever reads the message.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuslurm.report.jobstats import GpuFigures, JobStats, Note
from gpuslurm.report.notify_render import (
    MAIL_TEMPLATE,
    JobText,
    Rule,
    UnsafeTemplateError,
    context,
    render_mail,
    render_webhook,
    sample_stats,
    tojson,
    wants_message,
)
from gpuslurm.state.store_job import JobRecord

PACKAGING = Path(__file__).resolve().parents[2] / "packaging" / "notify"
SLACK = (PACKAGING / "slack.json.j2").read_text()
TEAMS = (PACKAGING / "teams.json.j2").read_text()

HOSTILE = [
    'say "hi" \\ back',
    'x", "blocks": [{"type": "section", "text": {"type": "mrkdwn", "text": "<!channel>"}}], "y": "',
    "line one\nline two\r\n\ttabbed",
    "{{ 7 * 7 }} {% for x in range(3) %}{{ x }}{% endfor %} {# c #}",
    "\x1b]0;owned\x07\x1b[2J\x1b[31mred\x9b",
    "bytes \udcff\udcfe not UTF-8",  # a name read with surrogateescape
    "</script><b>&amp;</b> '\u2028\u2029",
    "💥 émoji",
]


def stats(name_user: str = "alice", account: str | None = "physics") -> JobStats:
    base = sample_stats()
    return base._replace(job=base.job._replace(user=name_user, account=account))


def slack_name(doc: dict[str, Any]) -> str:
    fields = doc["blocks"][1]["fields"]
    return fields[[f["text"] for f in fields].index("*Job name*") + 1]["text"]


def teams_fact(doc: dict[str, Any], title: str) -> str:
    facts = next(b for b in doc["attachments"][0]["content"]["body"] if b["type"] == "FactSet")["facts"]
    return next(f["value"] for f in facts if f["title"] == title)


def check_slack(doc: dict[str, Any]) -> None:
    """Slack's incoming-webhook shape: a fallback text and blocks, every block and text typed."""
    assert isinstance(doc["text"], str) and doc["text"]
    assert isinstance(doc["blocks"], list) and doc["blocks"]
    for block in doc["blocks"]:
        assert block["type"] in ("header", "section", "context")
        texts = [block["text"]] if "text" in block else []
        texts += block.get("fields", []) + block.get("elements", [])
        assert texts
        for t in texts:
            assert t["type"] in ("plain_text", "mrkdwn") and isinstance(t["text"], str) and t["text"]
            assert len(t["text"]) <= 3000


def check_teams(doc: dict[str, Any]) -> None:
    """A Teams Workflows message: one Adaptive Card attachment."""
    assert doc["type"] == "message"
    att = doc["attachments"][0]
    assert att["contentType"] == "application/vnd.microsoft.card.adaptive"
    card = att["content"]
    assert card["type"] == "AdaptiveCard" and isinstance(card["version"], str)
    assert isinstance(card["body"], list) and card["body"]
    assert all(isinstance(b["type"], str) for b in card["body"])
    assert all(a["type"] == "Action.OpenUrl" for a in card["actions"])


@pytest.mark.parametrize("name", HOSTILE)
def test_the_shipped_webhook_templates_carry_a_hostile_job_name_unchanged_in_one_json_string(
        name: str) -> None:
    """Before: a template writing ``"{{ job.name }}"`` let the second name add a block that pings
    the whole channel. Now the body parses, has the documented shape, and the name is one value."""
    v = context(stats(), JobText(name, name), webhook=True)
    slack = json.loads(render_webhook(SLACK, v))
    check_slack(slack)
    assert slack_name(slack) == name
    assert [b["type"] for b in slack["blocks"]].count("section") == 1 + len(sample_stats().notes)
    assert slack["blocks"][-2]["elements"][0]["text"] == name  # the comment
    teams = json.loads(render_webhook(TEAMS, v))
    check_teams(teams)
    assert teams_fact(teams, "Job name") == name
    # ASCII on the wire: no raw escape, line break or undecodable byte of the user's
    for body in (render_webhook(SLACK, v), render_webhook(TEAMS, v)):
        assert all(32 <= b < 127 or b in b"\n" for b in body.replace(b"\xc2\xa0", b""))


@settings(max_examples=150, deadline=None)
@given(name=st.text(max_size=300), comment=st.text(max_size=300), user=st.text(max_size=100),
       account=st.none() | st.text(max_size=100))
def test_any_user_text_renders_valid_json_carrying_it_unchanged(name: str, comment: str, user: str,
                                                               account: str | None) -> None:
    v = context(stats(user, account), JobText(name, comment), webhook=True)
    slack = json.loads(render_webhook(SLACK, v))
    check_slack(slack)
    assert slack_name(slack) == (name or "-")
    teams = json.loads(render_webhook(TEAMS, v))
    check_teams(teams)
    assert (teams_fact(teams, "Job name"), teams_fact(teams, "User")) == (name, user)
    assert teams_fact(teams, "Account") == (account or "")


@pytest.mark.parametrize("template", [
    '{"text": "{{ job.name }}"}',
    '{"text": {{ (job.name | upper) | tojson }}}',
    '{"text": {{ ("Job " ~ job.name) | tojson }}}',
    '{"text": {{ "%s" | format(job.comment) | tojson }}}',
    '{"text": {{ job.account | string | tojson }}}',
    '{"text": "{{ job.user | e }}"}',
])
def test_a_template_printing_user_text_other_than_through_tojson_is_refused(template: str) -> None:
    """Before: the first template's output was ``{"text": "x", "y": "z"}`` for the name
    ``x", "y": "z``. Now any way of printing the user's text but ``tojson`` stops the render."""
    v = context(stats(), JobText('x", "y": "z', 'x", "y": "z'), webhook=True)
    with pytest.raises(UnsafeTemplateError, match="without tojson"):
        render_webhook(template, v)


def test_a_template_that_renders_no_json_is_refused_and_the_sandbox_holds() -> None:
    v = context(stats(), JobText("n", "c"), webhook=True)
    with pytest.raises(UnsafeTemplateError, match="does not render JSON"):
        render_webhook('{"text": {{ verdict | tojson }}', v)
    with pytest.raises(UnsafeTemplateError, match="cannot render"):  # no reaching Python's internals
        render_webhook("{{ job.__class__.__mro__[1].__subclasses__() | tojson }}", v)
    with pytest.raises(UnsafeTemplateError, match="cannot render"):
        render_webhook("{{ job.name._text | tojson }}", v)


def test_the_mail_body_shows_user_text_as_data_without_control_characters() -> None:
    v = context(stats(), JobText("{{ 7 * 7 }}\x1b[2J\nBcc: x@y\udcff", "c"), webhook=False)
    body = render_mail(MAIL_TEMPLATE, v)
    assert "{{ 7 * 7 }}?[2J\nBcc: x@y?" in body and "49" not in body
    assert "\x1b" not in body


def test_the_shipped_mail_template_is_the_built_in_one() -> None:
    assert (PACKAGING / "mail.txt.j2").read_text() == MAIL_TEMPLATE


def test_tojson_cuts_long_text_and_never_writes_nan() -> None:
    assert json.loads(tojson("x" * 10, max_chars=4)) == "xxx…"
    with pytest.raises(ValueError):
        tojson(float("nan"))


def job(duration: float, verdict: str, util: float | None) -> JobStats:
    rec = JobRecord("5", "n", "u", 1000, None, 0.0, duration, "map", (), ())
    g = GpuFigures("GPU-0", None, 10, util, util, util, 1.0, 1.0, 80.0, 1.0, 1.0, 1.0, 1.0, 0.0, 0.0, ())
    return JobStats(rec, False, (g,), None, verdict, (Note("idle", "t"),), ())


@pytest.mark.parametrize(("st_", "rule", "want"), [
    (job(3600, "idle GPUs", 0.0), Rule(), True),
    (job(600, "idle GPUs", 0.0), Rule(), False),  # shorter than min_job_s
    (job(3600, "good", 30.0), Rule(), False),
    (job(3600, "good", 30.0), Rule(below_util_pct=40), True),
    (job(3600, "good", 50.0), Rule(below_util_pct=40), False),
    (job(3600, "room to improve", 60.0), Rule(verdicts=("idle GPUs", "room to improve")), True),
    (job(3600, "no samples", None), Rule(verdicts=("idle GPUs",), below_util_pct=100), False),
])
def test_which_finished_jobs_get_a_message(st_: JobStats, rule: Rule, want: bool) -> None:
    assert wants_message(st_, rule) is want
