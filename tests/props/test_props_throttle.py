"""Property tests for the throttle file's readers (issue 9 §2, §3): the Python reader never raises,
believes no time out of range and no user a junk line names; the plugin (lua5.1) agrees with it on
who is throttled; ``throttle list`` through the real CLI exits 0 or 2 with one stderr line."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from props_hostile import PIECES, mutated, one_line

from gpuslurm.policy.throttle import Throttle
from gpuslurm.slurm.throttle import format_throttle_file, parse_throttle_file
from gpuslurm.times import in_range

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "throttle"))
from lua_harness import lua_missing, lua_str, run_lua

NOW = 1_900_000_000
BASE = format_throttle_file([
    Throttle("alice", NOW + 7200, "reject", 0, NOW, "ops", "rogue"),
    Throttle("bob", NOW + 3600, "cap", 2, NOW, "", "idle"),
    Throttle("carol", NOW + 60, "priority", 100, NOW, "", "share"),
], "1795240815839726714-28089")
FIELD_PIECES = ("1000000000000007168", "253370764801", "253370764800", "99999999999", "0", "ban",
                "cap", "\t", "\t\t", "alice", "#", " ", "\r", "x" * 5000)
file_text = st.one_of(
    mutated(BASE, edits=3),
    st.lists(st.sampled_from(BASE.splitlines() + list(FIELD_PIECES) + list(PIECES)), max_size=8)
    .map("\n".join),
    st.builds(lambda line, piece: BASE + line.replace("1900003600", piece) + "\n",
              st.sampled_from(BASE.splitlines()[2:]), st.sampled_from(FIELD_PIECES)))


@given(file_text)
def test_the_python_reader_never_raises_and_believes_no_doubt(text: str) -> None:
    t0 = time.monotonic()
    parsed = parse_throttle_file(text)
    assert time.monotonic() - t0 < 1.0
    for t in parsed.throttles:
        assert in_range(t.until) and in_range(t.created)
        assert t.user not in parsed.doubtful
        assert t.mode in ("reject", "cap", "priority")
    for _number, _text, why in parsed.junk:
        assert why and one_line(why)


ascii_text = file_text.filter(lambda t: t.isascii() and "\x00" not in t)


@settings(max_examples=25, suppress_health_check=[HealthCheck.too_slow])
@given(ascii_text)
def test_the_plugin_and_the_python_reader_agree_on_who_is_throttled(text: str) -> None:
    if lua_missing():
        return
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "gpuslurm-throttle"
        path.write_text(text)
        lines = run_lua(f"""
G.path = {lua_str(str(path))}
local users = G.throttles(NOW)
local names = {{}}
for u in pairs(users) do names[#names + 1] = u end
table.sort(names)
out("users", table.concat(names, " "))
""", now=NOW)
    want = sorted({t.user for t in parse_throttle_file(text).throttles if t.until > NOW})
    got = [line for line in lines if line.startswith("users|")]
    assert got == ["users|" + " ".join(want)], (got, want)


@settings(max_examples=10, suppress_health_check=[HealthCheck.too_slow])
@given(file_text)
def test_throttle_list_through_the_cli(text: str) -> None:
    assume("\x00" not in text)
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "t"
        path.write_text(text, errors="surrogateescape")
        proc = subprocess.run([sys.executable, "-m", "gpuslurm", "throttle", "list", "--all", "--file",
                               str(path)], capture_output=True, text=True, errors="replace", timeout=30,
                              check=False, env={**os.environ, "GPUSLURM_CONFIG": "/dev/null"})
    assert proc.returncode in {0, 2}, (proc.returncode, proc.stderr)
    assert "Traceback" not in proc.stderr and "internal error" not in proc.stderr, proc.stderr
    if proc.returncode:
        assert one_line(proc.stderr), proc.stderr
