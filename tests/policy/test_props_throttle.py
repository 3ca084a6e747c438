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
from tests.helpers.lua_harness import lua_missing, lua_str, run_lua
from tests.helpers.props_hostile import PIECES, mutated, one_line

from gpuslurm.policy.throttle import Throttle
from gpuslurm.slurm.throttle import format_throttle_file, parse_throttle_file
from gpuslurm.times import in_range

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


# --- slurm_job_modify: an update by the throttled owner never lifts the throttle (issue 18) ----

GPU_ITEMS = ("gres:gpu:1", "gres:gpu:2", "gres/gpu:8", "gres:gpu:h100:3", "gres:gpu:h100:4:foo",
             "gres:mps:50", "gres:nic:1", "gres:gpu:1,gres:gpu:a100:1", "")
TRES = ("tres_per_node", "tres_per_job", "tres_per_socket", "tres_per_task")
NO_VAL, NO_VAL16, INFINITE = 4294967294, 65534, 4294967295
COUNTS = st.sampled_from((NO_VAL, 0, 1, 2, 4, 64, INFINITE))
COUNTS16 = st.sampled_from((NO_VAL16, 0, 1, 2, 8))
job_record = st.fixed_dictionaries({}, optional={
    **{f: st.sampled_from(GPU_ITEMS) for f in TRES},
    "min_nodes": st.sampled_from((1, 2)), "max_nodes": st.sampled_from((0, 1, 4)),
    "nice": st.sampled_from((2147483648, 2147483648 + 100, 2147483648 + 9000)),
})
job_update = st.fixed_dictionaries({}, optional={
    **{f: st.sampled_from(GPU_ITEMS) for f in TRES},
    "min_nodes": COUNTS, "max_nodes": COUNTS, "num_tasks": COUNTS, "min_cpus": COUNTS,
    "ntasks_per_node": COUNTS16, "sockets_per_node": COUNTS16, "cpus_per_task": COUNTS16,
    "ntasks_per_board": st.just(0), "req_nodes": st.sampled_from(("node1", "node[1-8]")),
    "nice": st.sampled_from((NO_VAL, 2147483648, 2147483648 + 50, 2147483648 + 6000)),
    "time_limit": st.just(10), "comment": st.just("x"),
})


Fields = dict[str, object]


def _lua_table(fields: Fields) -> str:
    items = (f"{k} = {lua_str(v) if isinstance(v, str) else v}" for k, v in fields.items())
    return "{" + ", ".join(items) + "}"


def _gpus(value: str) -> int:
    """GPUs (gpu gres) per unit in a tres string, -1 when an item is unreadable."""
    total = 0
    for item in filter(None, value.split(",")):
        parts = item.replace("gres/", "").replace("gres:", "").split(":")
        if parts[0] != "gpu":
            continue
        if len(parts) > 3 or not parts[-1].isdigit():
            return -1
        total += int(parts[-1])
    return total


def _known_over_cap(rec: Fields, upd: Fields, cap: int) -> bool:
    """Whether the job after the update surely has more than ``cap`` GPUs, counting only what the
    update itself states (``tres_per_job``; ``tres_per_node`` with a node count; ``tres_per_task``
    with a task count)."""
    def after(field: str) -> str:
        return str(upd.get(field, rec.get(field, "")))
    nodes = upd.get("min_nodes")
    nodes = nodes if isinstance(nodes, int) and 0 < nodes < NO_VAL16 else None
    tasks = upd.get("num_tasks")
    tasks = tasks if isinstance(tasks, int) and 0 < tasks < NO_VAL16 else None
    total = max(_gpus(after("tres_per_job")), 0)
    if nodes:
        total += max(_gpus(after("tres_per_node")), 0) * nodes
    if tasks:
        total += max(_gpus(after("tres_per_task")), 0) * tasks
    return total > cap


@settings(max_examples=20, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(job_record, job_update), min_size=1, max_size=40))
def test_an_owners_update_never_lifts_the_throttle(cases: list[tuple[Fields, Fields]]) -> None:
    if lua_missing():
        return
    throttles = [Throttle("alice", NOW + 3600, mode, value, NOW, "", "x")
                 for mode, value in (("reject", 0), ("cap", 2), ("priority", 5000))]
    calls = "\n".join(
        f"case({i}, {_lua_table(rec)}, {_lua_table(upd)})" for i, (rec, upd) in enumerate(cases))
    verdicts: dict[str, list[str]] = {}
    for throttle in throttles:
        with tempfile.TemporaryDirectory() as d:
            path = Path(d) / "gpuslurm-throttle"
            path.write_text(format_throttle_file([throttle], "1-1"))
            lines = run_lua(f"G.path = {lua_str(str(path))}\n" + """
function case(i, rec, upd)
  local u = update(upd)
  out(i, slurm_job_modify(u, record(rec), {}, 1000), slurm_job_modify(update(upd), record(rec), {}, 0),
      rawget(u, "nice") or "-")
end
""" + calls + "\ndump_logs()\n", now=NOW)
        assert not any("internal error" in line for line in lines), lines
        verdicts[throttle.mode] = [line for line in lines
                                   if "|" in line and not line.startswith(("LOG", "USER"))]
    shape = {"min_nodes", "max_nodes", "num_tasks", "min_cpus", "ntasks_per_node", "sockets_per_node",
             "cpus_per_task", "req_nodes", *TRES}
    for i, (rec, upd) in enumerate(cases):
        sets_shape = any(k in shape and v not in (NO_VAL, NO_VAL16) for k, v in upd.items())
        sets_nice = upd.get("nice", NO_VAL) != NO_VAL
        gpus_after = any(_gpus(after) != 0 or "mps" in after
                         for after in (str(upd.get(f, rec.get(f, ""))) for f in TRES))
        for mode, lines in verdicts.items():
            _, owner, root, nice = lines[i].split("|")
            assert root == "0", (mode, rec, upd)   # root's update always passes
            if not sets_shape and not sets_nice:
                assert owner == "0", (mode, rec, upd)  # the GPU count judged at submission
            if mode == "reject" and sets_shape and gpus_after:
                assert owner == "-1", (rec, upd)
            if mode == "cap" and sets_shape and _known_over_cap(rec, upd, 2):
                assert owner == "-1", (rec, upd)
            if mode == "priority" and owner == "0" and gpus_after and (sets_shape or sets_nice):
                # the job after the update has at least the throttle's nice
                set_nice = nice != "-" and int(nice) != NO_VAL
                final = int(nice) if set_nice else int(str(rec.get("nice", 2 ** 31)))
                assert final >= 2 ** 31 + 5000, (rec, upd, nice)
