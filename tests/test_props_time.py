"""Property tests for the time and duration parsers, the report window and the source parser
(issue 9 §2): any text gives an in-range value or a one-line InputError (exit 2), never another
exception, and quickly; a sample goes through the real CLI (exit code never 70, one stderr line)."""

from __future__ import annotations

import os
import subprocess
import sys
import time

from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from tests.helpers.props_hostile import PIECES, mutated, one_line

from gpuslurm.errors import InputError
from gpuslurm.policy.throttle import parse_duration as throttle_duration
from gpuslurm.policy.throttle import parse_until
from gpuslurm.report.prometheus import parse_source
from gpuslurm.report.window import resolve_window
from gpuslurm.times import TIME_MAX, TIME_MIN, in_range, parse_duration, parse_time

NOW = 1_900_000_000.0
BOUND_S = 1.0  # one parse; the CLI's bound is TIME_BOUND_S
TIME_BOUND_S = 30
EDGES = ("99999999999999999999d", "-99999999999h", "-1h", "now", "@1e18", "@-1", "@nan", "@inf",
         "0001-01-01T00:00", "9999-12-31T23:59", "10000-01-01", "1e3d", "1.5h", "0s", "90m", "2w",
         "1d12h", "@99999999999", "@253370764800", "@253370764801", "9" * 400 + "s", "1" * 70)
time_text = st.one_of(st.sampled_from(EDGES), st.sampled_from(PIECES), st.text(max_size=30),
                      st.sampled_from(EDGES).flatmap(lambda e: mutated(e, edits=2)))
UNITS = st.sampled_from(["s", "sec", "m", "min", "h", "d", "w"])
well_formed = st.builds(lambda n, u: f"{n}{u}", st.integers(0, 10**25), UNITS)


def _bounded(fn, *args):  # type: ignore[no-untyped-def]
    t0 = time.monotonic()
    try:
        return fn(*args), None
    except InputError as exc:
        assert one_line(str(exc)) and exc.exit_code == 2, str(exc)
        return None, exc
    finally:
        assert time.monotonic() - t0 < BOUND_S


@given(st.one_of(time_text, well_formed))
def test_durations_are_bounded_or_refused(text: str) -> None:
    value, _ = _bounded(parse_duration, text, "--last")
    if value is not None:
        assert 0 < value <= TIME_MAX - TIME_MIN
    secs, _ = _bounded(throttle_duration, text)
    if secs is not None:
        assert isinstance(secs, int) and 1 <= secs <= 366 * 86400


@given(time_text)
def test_times_are_in_range_or_refused(text: str) -> None:
    value, _ = _bounded(parse_time, text, NOW, "--since")
    if value is not None:
        assert in_range(value)
    until, _ = _bounded(parse_until, text, NOW)
    if until is not None:
        assert NOW < until <= NOW + 366 * 86400


@given(st.one_of(st.none(), time_text), st.one_of(st.none(), time_text), st.one_of(st.none(), time_text))
def test_the_report_window_is_in_range_or_refused(last: str | None, since: str | None,
                                                  until: str | None) -> None:
    window, _ = _bounded(resolve_window, last, since, until, NOW)
    if window is not None:
        lo, hi = window
        assert in_range(lo) and in_range(hi) and lo < hi <= NOW


source_text = st.one_of(
    st.sampled_from(["prometheus:http://[::1", "prometheus:http://h:99999", "prometheus:http://h:9x",
                     "prometheus:", "prometheus:http://", "prometheus:ftp://h", "prometheus:http://a b"]),
    st.text(max_size=40).map(lambda t: "prometheus:http://" + t),
    mutated("prometheus:http://[::1]:9090/prom", edits=2))


@given(source_text)
def test_the_source_parser_gives_a_url_or_one_line(text: str) -> None:
    url, _ = _bounded(parse_source, text)
    if url is not None:
        assert url.startswith(("http://", "https://")) and "\n" not in url


CLI = settings(max_examples=12, suppress_health_check=[HealthCheck.too_slow])


@CLI
@given(st.sampled_from(["--last", "--since", "--source"]), time_text | source_text)
def test_fairshare_report_through_the_cli(option: str, value: str) -> None:
    assume("\x00" not in value and value.encode("utf-8", "surrogatepass") == value.encode("utf-8", "replace"))
    args = [option, value]
    if option == "--source":
        args = ["--last", "1h", *args]
    else:
        args += ["--source", "sqlite:/nonexistent-gpuslurm/monitor.db"]
    proc = subprocess.run([sys.executable, "-m", "gpuslurm", "fairshare-report", *args],
                          capture_output=True, text=True, errors="replace", timeout=TIME_BOUND_S, check=False,
                          env={**os.environ, "GPUSLURM_CONFIG": "/dev/null"})
    assert proc.returncode in {0, 2, 4}, (proc.returncode, proc.stderr)  # never 70
    assert "Traceback" not in proc.stderr and "internal error" not in proc.stderr, proc.stderr
    if proc.returncode:
        assert one_line(proc.stderr), proc.stderr


def _pick_wait_error(option: str, text: str) -> str:
    """The one stderr line of `gpuslurm pick 1 --wait OPTION TEXT` against a missing bundle: about
    OPTION when the duration is refused, about the bundle when it is accepted (read first)."""
    import contextlib
    import io

    from gpuslurm.cli.pick_cmd import main as pick_main

    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        code = pick_main(["1", "--from", "/nonexistent/fix9-bundle", "--wait", option, text])
    assert code == 2 and err.getvalue().count("\n") == 1, err.getvalue()
    return err.getvalue()


@settings(suppress_health_check=[HealthCheck.too_slow])
@given(st.one_of(time_text, well_formed), st.sampled_from(["--timeout", "--poll"]))
def test_pick_reads_durations_with_the_one_parser(text: str, option: str) -> None:
    """pick's --timeout/--poll accept exactly what times.parse_duration (bounded to pick's 366
    days) accepts: `1d`, `1h30m`, `90min` as everywhere else; no bare numbers, no `ms`."""
    assume(not text.startswith("-"))  # an option-looking value is the option parser's matter
    try:
        parse_duration(text, option, max_s=366 * 86400)
        accepted = True
    except InputError:
        accepted = False
    line = _pick_wait_error(option, text)
    assert (option not in line) == accepted, line


def test_pick_durations_spelled_as_everywhere_else() -> None:
    for text in ("1d", "1h30m", "90min", "0.5s"):
        assert "fix9-bundle" in _pick_wait_error("--timeout", text)
    for text in ("30", "200ms", "367d", "0s"):
        assert "--poll" in _pick_wait_error("--poll", text)
