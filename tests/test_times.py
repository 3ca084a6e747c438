"""Times at the edge (issue 9 §2): one bounded parser, no out-of-range time written or believed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gpuslurm.errors import InputError
from gpuslurm.policy.throttle import Throttle, parse_duration, parse_until, violation_from_line
from gpuslurm.report.window import resolve_window
from gpuslurm.slurm.throttle import format_throttle_file, parse_throttle_file
from gpuslurm.times import TIME_MAX, parse_time, show

NOW = 1_900_000_000.0


def gs(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gpuslurm", *args], capture_output=True, text=True,
                          timeout=60, check=False, env={**os.environ, "GPUSLURM_CONFIG": "/dev/null"})


def one_line_exit_2(proc: subprocess.CompletedProcess[str]) -> None:
    assert proc.returncode == 2, (proc.returncode, proc.stderr)
    assert len(proc.stderr.strip().splitlines()) == 1 and "internal error" not in proc.stderr, proc.stderr


@pytest.mark.parametrize("args", [
    ["--last", "99999999999999999999d"], ["--last", "9" * 5000 + "d"],
    ["--since", "-1h", "--until", "-99999999999h"], ["--since", "-99999999999999w"],
    ["--since", "@99999999999"], ["--since", "0001-01-01T00:00"], ["--since", "9999-12-31T23:59"],
    ["--source", "prometheus:http://[::1"], ["--source", "prometheus:http://h:99999"],
    ["--source", "prometheus:http://h:9x"], ["--source", "prometheus:http://a b"],
])
def test_report_window_and_source_edges_are_one_line_exit_2(tmp_path: Path, args: list[str]) -> None:
    extra = [] if "--source" in args else ["--source", f"sqlite:{tmp_path / 'none.db'}"]
    full = args if "--last" in args or "--since" in args else ["--last", "1h", *args]
    one_line_exit_2(gs("fairshare-report", *full, *extra))


def test_window_is_within_the_documented_range() -> None:
    for last in ("99999999999999999999d", "1e3d", "8030000w"):
        with pytest.raises(InputError):
            resolve_window(last, None, None, NOW)
    with pytest.raises(InputError):
        parse_time("-99999999999h", NOW, "--until")
    with pytest.raises(InputError):
        parse_time("@1e18", NOW, "--since")
    assert show(1e18) == "@1e+18"


def test_throttle_durations_and_until_are_bounded() -> None:
    for text in ("99999999999999999999d", "367d", "0s"):
        with pytest.raises(InputError):
            parse_duration(text)
    assert parse_duration("1h30m") == 5400
    for text in ("@1e18", "@99999999999999", "99999-01-01", "@inf"):
        with pytest.raises(InputError):
            parse_until(text, NOW)


def test_a_violation_from_1e18_is_skipped_and_never_written(tmp_path: Path) -> None:
    vdir = tmp_path / "v"
    vdir.mkdir()
    rec = {"v": 1, "kind": "rogue", "node": "n1", "user": "alice", "start": 1e18, "duration_s": 60.0}
    (vdir / "n1.jsonl").write_text(json.dumps(rec) + "\n")
    with pytest.raises(ValueError, match="outside"):
        violation_from_line(json.dumps(rec))
    f = tmp_path / "t"
    proc = gs("throttle", "sync", "--file", str(f), "--violations-dir", str(vdir))
    assert proc.returncode == 0 and "outside 1970-01-01 to 9999-01-01" in proc.stderr, proc.stderr
    assert not f.exists() or "alice" not in f.read_text()
    proc = gs("throttle", "list", "--file", str(f))
    assert proc.returncode == 0 and "internal error" not in proc.stderr


def test_a_stored_until_past_time_t_is_junk_and_list_does_not_crash(tmp_path: Path) -> None:
    f = tmp_path / "t"
    f.write_text("# gpuslurm-throttle v1 id=1\nalice\t1000000000000007168\treject\t0\t1795445943\t\tx\n"
                 f"bob\t{TIME_MAX + 1}\treject\t0\t1795445943\t\tx\n")
    parsed = parse_throttle_file(f.read_text())
    assert parsed.throttles == () and len(parsed.junk) == 2
    proc = gs("throttle", "list", "--file", str(f))
    assert proc.returncode == 0 and "internal error" not in proc.stderr and "alice" in proc.stderr
    with pytest.raises(InputError):
        format_throttle_file([Throttle("alice", 10**18)], "1")


@pytest.mark.parametrize("option", ["--poll", "--timeout"])
def test_pick_wait_durations_are_bounded(option: str) -> None:
    proc = gs("pick", "1", "--wait", option, "99999999999999999999h")
    one_line_exit_2(proc)
