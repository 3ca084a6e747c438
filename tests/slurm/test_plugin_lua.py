"""plugins/job_submit.lua under the real lua5.1, with a fake ``slurm`` table (tests/helpers/harness.lua).

The throttle files are written by gpuslurm's own writer, so these tests also hold the file format
to its two readers.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from tests.helpers.lua_harness import lua_str, run_lua

from gpuslurm.policy.throttle import Throttle
from gpuslurm.slurm.throttle import format_throttle_file, parse_throttle_file, write_throttle_file

NOW = 1_900_000_000
HOUR = 3600


def _file(tmp_path: Path, *throttles: Throttle, now: int = NOW) -> Path:
    path = tmp_path / "gpuslurm-throttle"
    write_throttle_file(str(path), throttles, now=now)
    return path


def _use(path: Path) -> str:
    return f"G.path = {lua_str(str(path))}\n"


ALICE = Throttle("alice", NOW + 2 * HOUR, "reject", 0, NOW, "hpc-help@example.org", "rogue process on GPU-1")


@pytest.mark.parametrize(("item", "expected"), [
    ("gres:gpu:4", "gpu||4"),
    ("gres/gpu:4", "gpu||4"),
    ("gpu:2", "gpu||2"),
    ("gpu:a100:3", "gpu|a100|3"),
    ("gres:gpu:h100:2", "gpu|h100|2"),
    ("gres/gpu:h100:2", "gpu|h100|2"),
    ("gres/gpu=4", "gpu||4"),
    ("gres:gpu", "gpu||1"),
    ("gpu:h100", "gpu|h100|1"),
    ("gres:gpu:2k", "gpu||2048"),
    ("gres:mps:50", "mps||50"),
    ("gres:shard:2", "shard||2"),
    ("gres:gpu:2x", "gpu|?|unparsed"),  # a GPU request all the same: never let through as "no GPU"
    ("gres:gpu:a:b:2", "gpu|?|unparsed"),
    ("gres:gpu:h100:4:foo", "gpu|?|unparsed"),
    ("gres:GPU:8", "GPU||8"),
    ("gres/gpu:h100=2", "gpu|h100|2"),
    ("gres:nic:a:b", "nil"),
])
def test_every_gres_form_is_parsed(item: str, expected: str) -> None:
    lines = run_lua(f"""
local r = G.parse_item({lua_str(item)})
if r and r.unparsed then out(r.name, "?", "unparsed")
elseif r then out(r.name, r.type or "", r.count) else out("nil") end
""")
    assert lines == [expected]


def test_each_tres_field_and_option_counts_as_a_gpu_request() -> None:
    lines = run_lua("""
local cases = {
  {"--gres=gpu:1", {tres_per_node = "gres:gpu:1"}},
  {"newer gres/ form", {tres_per_node = "gres/gpu:2"}},
  {"--gpus=3", {tres_per_job = "gres:gpu:3"}},
  {"--gpus=h100:2", {tres_per_job = "gres:gpu:h100:2"}},
  {"--gpus-per-node=2", {tres_per_node = "gres:gpu:2"}},
  {"--gpus-per-task=1", {tres_per_task = "gres:gpu:1", num_tasks = 2}},
  {"--gpus-per-socket=1", {tres_per_socket = "gres:gpu:1"}},
  {"mps share", {tres_per_node = "gres:mps:10"}},
  {"gpu after a license-like item", {tres_per_node = "gres:foo:1,gres:gpu:1"}},
  {"no gres", {}},
  {"zero gpus", {tres_per_job = "gres:gpu:0"}},
  {"other gres only", {tres_per_node = "gres:nic:1"}},
  {"empty string", {tres_per_node = ""}},
}
for _, c in ipairs(cases) do
  local yes, field = G.gpu_request(job(c[2]))
  out(c[1], tostring(yes), field or "")
end
""")
    got = {line.split("|")[0]: line.split("|")[1:] for line in lines}
    for name in ("--gres=gpu:1", "newer gres/ form", "--gpus-per-node=2", "mps share",
                 "gpu after a license-like item"):
        assert got[name] == ["true", "tres_per_node"], name
    for name in ("--gpus=3", "--gpus=h100:2"):
        assert got[name] == ["true", "tres_per_job"], name
    assert got["--gpus-per-task=1"] == ["true", "tres_per_task"]
    assert got["--gpus-per-socket=1"] == ["true", "tres_per_socket"]
    for name in ("no gres", "zero gpus", "other gres only", "empty string"):
        assert got[name] == ["false", ""], name


def test_throttled_users_gpu_job_is_refused_with_why_until_and_whom(tmp_path: Path) -> None:
    path = _file(tmp_path, ALICE)
    lines = run_lua(_use(path) + """
out("gpu", slurm_job_submit(job({tres_per_node = "gres:gpu:1"}), {}, 1000))
out("gpus", slurm_job_submit(job({tres_per_job = "gres:gpu:2"}), {}, 1000))
out("cpu-only", slurm_job_submit(job({}), {}, 1000))
out("bob", slurm_job_submit(job({user_id = 1001, user_name = "bob", tres_per_node = "gres:gpu:1"}), {}, 1001))
dump_logs()
""")
    assert lines[:4] == ["gpu|-1", "gpus|-1", "cpu-only|0", "bob|0"]
    user = [line for line in lines if line.startswith("USER ")]
    assert len(user) == 2
    expected_until = time.strftime("%Y-%m-%d %H:%M", time.localtime(ALICE.until))
    msg = user[0]
    assert "alice" in msg and expected_until in msg and "hpc-help@example.org" in msg
    assert "rogue process on GPU-1" in msg and "without GPUs are not affected" in msg


def test_capped_user_gets_at_most_n_gpus_other_gres_kept(tmp_path: Path) -> None:
    shown, user = _capped(tmp_path, """
show("node", {tres_per_node = "gres:gpu:h100:8,gres:mps:100"})
show("job", {tres_per_job = "gres/gpu:5"})
show("under", {tres_per_node = "gres:gpu:1"})
show("task", {tres_per_task = "gres:gpu:4", num_tasks = 2})
show("task-too-many", {tres_per_task = "gres:gpu:1", num_tasks = 3})
""")
    assert list(shown) == ["node", "job", "under", "task", "task-too-many"]
    assert shown["node"] == ["0", "gres:gpu:h100:2,gres:mps:100", "", ""]
    assert shown["job"] == ["0", "", "gres/gpu:2", ""]
    assert shown["under"] == ["0", "gres:gpu:1", "", ""]
    assert shown["task"] == ["0", "", "", "gres:gpu:1"]
    assert shown["task-too-many"] == ["-1", "", "", "gres:gpu:1"]
    assert "reduced to 2 GPU(s)" in user[0]
    assert "3 task(s)" in user[-1] and "--gpus=2" in user[-1]


def test_priority_mode_adds_nice_and_keeps_a_larger_one(tmp_path: Path) -> None:
    path = _file(tmp_path, Throttle("alice", NOW + HOUR, "priority", 5000, NOW, "", ""))
    lines = run_lua(_use(path) + """
local a = job({tres_per_node = "gres:gpu:1"})
out(slurm_job_submit(a, {}, 1000), a.nice - slurm.NICE_OFFSET)
local b = job({tres_per_node = "gres:gpu:1", nice = slurm.NICE_OFFSET + 9000})
out(slurm_job_submit(b, {}, 1000), b.nice - slurm.NICE_OFFSET)
local c = job({})
out(slurm_job_submit(c, {}, 1000), c.nice)
""")
    assert lines == ["0|5000", "0|9000", "0|4294967294"]


def test_expiry_is_checked_at_submission_not_only_at_read(tmp_path: Path) -> None:
    path = _file(tmp_path, ALICE._replace(until=NOW + 2))
    lines = run_lua(_use(path) + """
out(slurm_job_submit(job({tres_per_node = "gres:gpu:1"}), {}, 1000))
NOW = NOW + 2   -- within the reload interval: the cached line must still expire
out(slurm_job_submit(job({tres_per_node = "gres:gpu:1"}), {}, 1000))
""")
    assert lines == ["-1", "0"]


def test_missing_file_lets_everyone_through_and_is_logged_once(tmp_path: Path) -> None:
    lines = run_lua(_use(tmp_path / "absent") + """
for i = 1, 3 do
  out(slurm_job_submit(job({tres_per_node = "gres:gpu:1"}), {}, 1000))
  NOW = NOW + 10
end
dump_logs()
""")
    assert lines[:3] == ["0", "0", "0"]
    logs = [line for line in lines if line.startswith("LOG")]
    assert len(logs) == 1 and "not readable" in logs[0] and "absent" in logs[0]


def test_a_directory_or_binary_file_fails_open(tmp_path: Path) -> None:
    (tmp_path / "dir").mkdir()
    (tmp_path / "bin").write_bytes(os.urandom(4096) + b"\x00\n\tgarbage\n")
    lines = run_lua(f"""
for _, p in ipairs({{{lua_str(str(tmp_path / "dir"))}, {lua_str(str(tmp_path / "bin"))}}}) do
  G.path = p; G.cache.checked = nil; G.cache.header = nil
  out(slurm_job_submit(job({{tres_per_node = "gres:gpu:1"}}), {{}}, 1000))
end
""")
    assert lines == ["0", "0"]


def test_junk_lines_are_skipped_logged_once_per_read_and_agree_with_python(tmp_path: Path) -> None:
    good = format_throttle_file([ALICE, Throttle("carol", NOW + HOUR, "cap", 1, NOW, "", "x")], "1-1")
    junk = ("this is not a throttle line\n"
            "bob\t1900003600\treject\t0\t1900000000\tonly six fields\n"
            "dave\tsoon\treject\t0\t1900000000\t\t\n"
            "erin\t1900003600\tban\t0\t1900000000\t\t\n"
            "frank\t1900003600\tcap\t0\t1900000000\t\t\n"
            "gina 2\t1900003600\treject\t0\t1900000000\t\t\n"
            "\n# a comment\n"
            "i#j\t1900003600\treject\t0\t1900000000\t\t\n"
            "hank\t1900003600\treject\t0\t1900000000\tc\treason with a 100% sign\r\n")
    path = tmp_path / "gpuslurm-throttle"
    path.write_text(good + junk)
    lines = run_lua(_use(path) + """
local users, count = G.throttles(NOW)
local names = {}
for u in pairs(users) do names[#names + 1] = u end
table.sort(names)
out(count, table.concat(names, ","))
G.throttles(NOW + 1)           -- cached: no second read, no second log line
dump_logs()
out(slurm_job_submit(job({user_name = "hank", tres_per_node = "gres:gpu:1"}), {}, 1000))
dump_logs()
""")
    assert lines[0] == "4|alice,carol,hank,i#j"
    logs = [line for line in lines if line.startswith("LOG error")]
    assert len(logs) == 1 and "skipped 6 junk line(s)" in logs[0] and "line 5" in logs[0]
    assert "-1" in lines  # hank's CRLF line counts
    assert any(line.startswith("USER") and "reason with a 100% sign" in line for line in lines)
    py = parse_throttle_file(path.read_text())
    assert sorted(t.user for t in py.throttles) == ["alice", "carol", "hank", "i#j"]
    assert len(py.junk) == 6


def test_file_is_reread_only_after_the_interval_and_only_when_changed(tmp_path: Path) -> None:
    path = _file(tmp_path, ALICE)
    lines = run_lua(_use(path) + f"""
local function gpu() return slurm_job_submit(job({{tres_per_node = "gres:gpu:1"}}), {{}}, 1000) end
out("start", gpu())
os.remove({lua_str(str(path))})
NOW = NOW + 1
out("cached", gpu())
NOW = NOW + 3
out("reread", gpu())
""")
    assert lines == ["start|-1", "cached|-1", "reread|0"]


def test_a_corrupted_line_under_a_kept_header_lets_that_user_through(tmp_path: Path) -> None:
    # issue 9 §3: an admin's hand edit keeps the header (so its write id) and breaks alice's line
    bob = Throttle("bob", NOW + HOUR, "reject", 0, NOW, "", "x")
    path = _file(tmp_path, ALICE, bob)
    text = path.read_text()
    broken = text.replace(f"alice\t{ALICE.until}", f"alice\t{ALICE.until}x")
    assert broken != text and broken.splitlines()[0] == text.splitlines()[0]
    lines = run_lua(_use(path) + f"""
local uids = {{alice = 1000, bob = 1001}}
local function gpu(who)
  local j = job({{user_id = uids[who], user_name = who, tres_per_node = "gres:gpu:1"}})
  return slurm_job_submit(j, {{}}, uids[who])
end
out("before", gpu("alice"), gpu("bob"))
local fh = io.open({lua_str(str(path))}, "w")
fh:write({lua_str(broken)})
fh:close()
NOW = NOW + 5
out("after", gpu("alice"), gpu("bob"))
dump_logs()
""")
    assert lines[0] == "before|-1|-1"
    assert lines[1] == "after|0|-1"
    assert any("junk line" in line and "1 user(s) named by a junk line" in line for line in lines)
    py = parse_throttle_file(broken)
    assert [t.user for t in py.throttles] == ["bob"] and py.doubtful == ("alice",)


def test_a_junk_line_after_a_good_one_is_a_doubt_for_that_user(tmp_path: Path) -> None:
    good = format_throttle_file([ALICE], "1-1")
    path = tmp_path / "gpuslurm-throttle"
    path.write_text(good + f"alice\t{ALICE.until}\treject\t0\t{NOW}\tonly six\n")
    lines = run_lua(_use(path) + """
out(slurm_job_submit(job({tres_per_node = "gres:gpu:1"}), {}, 1000))
""")
    assert lines == ["0"]
    assert parse_throttle_file(path.read_text()).throttles == ()


@pytest.mark.parametrize("header", [True, False])
def test_an_unchanged_file_is_parsed_once_with_or_without_header(tmp_path: Path, header: bool) -> None:
    path = _file(tmp_path, ALICE)
    text = path.read_text()
    if not header:
        text = "\n".join(line for line in text.splitlines() if not line.startswith("#")) + "\n"
    text += "x" * 3_000_000 + "\n"  # a long junk line: read and matched once, not per submission
    path.write_text(text)
    lines = run_lua(_use(path) + """
local t0 = os.clock()
for i = 1, 50 do
  NOW = NOW + 4   -- past the reload interval every time: the file is read, not parsed again
  slurm_job_submit(job({tres_per_node = "gres:gpu:1"}), {}, 1000)
end
out(G.cache.parses, os.clock() - t0)
""")
    parses, seconds = lines[0].split("|")
    assert parses == "1", lines
    assert float(seconds) < 2.0


def test_a_file_larger_than_the_bound_fails_open(tmp_path: Path) -> None:
    path = _file(tmp_path, ALICE)
    with path.open("a") as fh:
        fh.write(("#" + "y" * 1023 + "\n") * (17 * 1024))
    lines = run_lua(_use(path) + """
out(slurm_job_submit(job({tres_per_node = "gres:gpu:1"}), {}, 1000))
dump_logs()
""")
    assert lines[0] == "0" and any("larger than" in line for line in lines)


def test_until_past_the_time_range_is_junk_not_an_error(tmp_path: Path) -> None:
    path = tmp_path / "gpuslurm-throttle"
    path.write_text("# gpuslurm-throttle v1 id=1\n"
                    f"alice\t1000000000000007168\treject\t0\t{NOW}\t\tx\n"
                    f"bob\t253370764801\treject\t0\t{NOW}\t\tx\n")
    lines = run_lua(_use(path) + """
out(slurm_job_submit(job({tres_per_node = "gres:gpu:1"}), {}, 1000))
dump_logs()
""")
    assert lines[0] == "0"
    assert not any("internal error" in line for line in lines)
    assert any("skipped 2 junk line(s)" in line for line in lines)


def test_cap_is_per_job_and_no_val_is_never_a_count(tmp_path: Path) -> None:
    path = _file(tmp_path, Throttle("alice", NOW + HOUR, "cap", 4, NOW, "", "idle"))
    lines = run_lua(_use(path) + """
local function show(name, fields)
  local j = job(fields)
  local rc = slurm_job_submit(j, {}, 1000)
  out(name, rc, j.tres_per_node or "", j.tres_per_job or "", j.tres_per_socket or "", j.tres_per_task or "")
end
-- --gpus-per-socket below the cap, sockets and tasks unset (NO_VAL16 / NO_VAL)
show("socket", {tres_per_socket = "gres:gpu:1"})
show("socket-2", {tres_per_socket = "gres:gpu:4", sockets_per_node = 2})
show("socket-na", {tres_per_socket = "gres:gpu:1", sockets_per_node = NO_VAL, num_tasks = NO_VAL})
show("two-nodes", {tres_per_node = "gres:gpu:4", min_nodes = 2})
show("max-nodes", {tres_per_node = "gres:gpu:2", min_nodes = 1, max_nodes = 4})
show("five-nodes", {tres_per_node = "gres:gpu:1", min_nodes = 5})
show("job", {tres_per_job = "gres:gpu:8", min_nodes = 3})
show("unreadable", {tres_per_node = "gres:gpu:h100:4:foo"})
show("upper", {tres_per_node = "gres:GPU:8"})
dump_logs()
""")
    got = {line.split("|")[0]: line.split("|")[1:] for line in lines if "|" in line}
    assert got["socket"] == ["0", "", "", "gres:gpu:1", ""]  # 1 GPU per socket, 1 socket: kept
    assert got["socket-2"] == ["0", "", "", "gres:gpu:2", ""]
    assert got["socket-na"][0] == "0"
    assert got["two-nodes"] == ["0", "gres:gpu:2", "", "", ""]
    assert got["max-nodes"] == ["0", "gres:gpu:1", "", "", ""]
    assert got["five-nodes"][0] == "-1"
    assert got["job"] == ["0", "", "gres:gpu:4", "", ""]
    assert got["unreadable"][0] == "-1"
    assert got["upper"] == ["0", "gres:GPU:4", "", "", ""]
    assert not any("4294967294" in line or "65534" in line for line in lines)
    assert any("5 node(s) with GPUs exceed the cap of 4" in line for line in lines)


def test_an_error_inside_the_plugin_lets_the_job_through_and_is_logged(tmp_path: Path) -> None:
    path = _file(tmp_path, ALICE)
    lines = run_lua(_use(path) + """
local bad = setmetatable({user_id = 1000, user_name = "alice"},
  {__index = function(t, k) error("field " .. k .. " exploded") end})
out(slurm_job_submit(bad, {}, 1000))
dump_logs()
""")
    assert lines[0] == "0"
    assert any("internal error, job let through" in line and "exploded" in line for line in lines)


def test_default_path_is_beside_the_script(tmp_path: Path) -> None:
    copy = tmp_path / "job_submit.lua"
    copy.write_text((Path(__file__).resolve().parents[2] / "plugins" / "job_submit.lua").read_text())
    assert run_lua("out(G.default_path())", plugin=copy) == [f"{tmp_path}/gpuslurm-throttle"]


def test_ten_thousand_lines_parse_quickly(tmp_path: Path) -> None:
    many = [Throttle(f"user{i:05d}", NOW + HOUR, "reject", 0, NOW, "support", f"violation {i}")
            for i in range(10_000)]
    path = _file(tmp_path, *many)
    lines = run_lua(_use(path) + """
local t0 = os.clock()
local users, count = G.throttles(NOW)
local parse = os.clock() - t0
t0 = os.clock()
for i = 1, 10000 do slurm_job_submit(job({user_id = 1, user_name = "root"}), {}, 0) end
local per_call = (os.clock() - t0) / 10000
out(count, parse, per_call)
""")
    count, parse, per_call = lines[0].split("|")
    assert int(count) == 10_000
    assert float(parse) < 0.5, f"parsing 10,000 lines took {parse} s"
    assert float(per_call) < 50e-6, f"a non-throttled submission took {per_call} s"


def test_a_malformed_mps_request_is_refused_at_submission_and_a_good_one_passes(tmp_path: Path) -> None:
    path = tmp_path / "none.txt"  # no throttle file: only the MPS check can refuse
    lines = run_lua(_use(path) + """
for _, c in ipairs({"train gpuslurm:mps=lots", "gpuslurm:mps=0", "a;gpuslurm:mps=101", "gpuslurm:mps=",
                    "gpuslurm:mps=nan", "gpuslurm:mps=0x10"}) do
  out("bad " .. c, slurm_job_submit(job({comment = c}), {}, 1000))
end
for _, c in ipairs({"gpuslurm:mps", "gpuslurm:mps=50", "gpuslurm:mps=100", "gpuslurm:mpsx=1", "x"}) do
  out("good " .. c, slurm_job_submit(job({comment = c}), {}, 1000))
end
out("no comment", slurm_job_submit(job({}), {}, 1000))
out("modify", slurm_job_modify(job({comment = "gpuslurm:mps=200"}), {user_id = 1000}, {}, 1000))
dump_logs()
""")
    results = dict(line.rsplit("|", 1) for line in lines if "|" in line and not line.startswith("USER "))
    assert all(v == "-1" for k, v in results.items() if k.startswith(("bad ", "modify"))), lines
    assert all(v == "0" for k, v in results.items() if k.startswith(("good ", "no comment"))), lines
    user = [line for line in lines if line.startswith("USER ")]
    assert len(user) == 7 and "malformed MPS request" in user[0] and "1-100" in user[0], user



def _capped(tmp_path: Path, shows: str) -> tuple[dict[str, list[str]], list[str]]:
    path = _file(tmp_path, Throttle("alice", NOW + HOUR, "cap", 2, NOW, "", "idle GPUs"))
    lines = run_lua(_use(path) + """
local function show(name, fields)
  local j = job(fields)
  local rc = slurm_job_submit(j, {}, 1000)
  out(name, rc, j.tres_per_node or "", j.tres_per_job or "", j.tres_per_task or "")
end
""" + shows + "dump_logs()\n")
    return ({line.split("|")[0]: line.split("|")[1:] for line in lines if "|" in line},
            [line for line in lines if line.startswith("USER ")])


def test_the_cap_sums_the_gpu_items_of_a_field(tmp_path: Path) -> None:
    # The attacker splits the request over GPU types to get more GPUs than the cap of 2.
    got, _ = _capped(tmp_path, """
show("two-types", {tres_per_job = "gres:gpu:h100:2,gres:gpu:a100:2"})
show("two-types-node", {tres_per_node = "gres:gpu:h100:1,gres:mps:50,gres:gpu:a100:1", min_nodes = 2})
show("three-of-one", {tres_per_job = "gres:gpu:h100:1,gres:gpu:a100:1,gres:gpu:1"})
show("fits", {tres_per_job = "gres:gpu:h100:1,gres:gpu:a100:1"})
""")
    assert got["two-types"] == ["0", "", "gres:gpu:h100:2", ""]
    assert got["two-types-node"] == ["0", "gres:gpu:h100:1,gres:mps:50", "", ""]  # 1 per node, 2 nodes
    assert got["three-of-one"] == ["0", "", "gres:gpu:h100:1,gres:gpu:a100:1", ""]
    assert got["fits"] == ["0", "", "gres:gpu:h100:1,gres:gpu:a100:1", ""]


def test_per_task_gpus_count_ntasks_per_node_when_the_task_count_is_unset(tmp_path: Path) -> None:
    # The attacker asks for 1 GPU per task with --ntasks-per-node=8 and no --ntasks: 8 GPUs.
    got, user = _capped(tmp_path, """
show("tasks-per-node", {tres_per_task = "gres:gpu:1", ntasks_per_node = 8})
show("tasks-per-node-2", {tres_per_task = "gres:gpu:1", ntasks_per_node = 2})
show("tasks-per-node-na", {tres_per_task = "gres:gpu:1", ntasks_per_node = NO_VAL16, min_nodes = 2})
""")
    assert got["tasks-per-node"][0] == "-1"
    assert got["tasks-per-node-2"] == ["0", "", "", "gres:gpu:1"]
    assert got["tasks-per-node-na"] == ["0", "", "", "gres:gpu:1"]
    assert any("8 task(s) with GPUs exceed the cap of 2" in line for line in user)


def test_a_capped_job_cannot_spread_its_per_node_gpus_over_more_nodes(tmp_path: Path) -> None:
    # The attacker (cap 2) asks for 2 GPUs per node and 64 tasks with no --nodes: Slurm spreads
    # the tasks over as many nodes as they need, each with 2 GPUs. The cap is judged on one node,
    # so the job must be held to the node count it was judged on.
    path = _file(tmp_path, Throttle("alice", NOW + HOUR, "cap", 2, NOW, "", "idle GPUs"))
    lines = run_lua(_use(path) + """
local function show(name, fields)
  local j = job(fields)
  local rc = slurm_job_submit(j, {}, 1000)
  out(name, rc, j.tres_per_node or "", j.tres_per_socket or "", j.tres_per_task or "", j.max_nodes)
end
show("tasks", {tres_per_node = "gres:gpu:2", num_tasks = 64})
show("cpus", {tres_per_node = "gres:gpu:2", min_cpus = 512})
show("per-node-tasks", {tres_per_task = "gres:gpu:1", ntasks_per_node = 2})
show("socket", {tres_per_socket = "gres:gpu:1", sockets_per_node = 2, num_tasks = 64})
show("min-only", {tres_per_node = "gres:gpu:1", min_nodes = 2, num_tasks = 64})
show("fixed", {tres_per_node = "gres:gpu:2", min_nodes = 1, max_nodes = 1, num_tasks = 64})
show("tasks-known", {tres_per_task = "gres:gpu:1", num_tasks = 2})
show("per-job", {tres_per_job = "gres:gpu:2", num_tasks = 64})
dump_logs()
""")
    got = {line.split("|")[0]: line.split("|")[1:] for line in lines if "|" in line}
    assert got["tasks"] == ["0", "gres:gpu:2", "", "", "1"], got
    assert got["cpus"] == ["0", "gres:gpu:2", "", "", "1"], got
    assert got["per-node-tasks"] == ["0", "", "", "gres:gpu:1", "1"], got
    assert got["socket"] == ["0", "", "gres:gpu:1", "", "1"], got
    assert got["min-only"] == ["0", "gres:gpu:1", "", "", "2"], got
    # a node count already bounded, a known task count or a per-job count: nothing to pin
    assert got["fixed"] == ["0", "gres:gpu:2", "", "", "1"], got
    assert got["tasks-known"] == ["0", "", "", "gres:gpu:1", "4294967294"], got
    assert got["per-job"] == ["0", "", "", "", "4294967294"], got
    assert any("at most 1 node(s)" in line for line in lines if line.startswith("USER")), lines


def test_a_capped_batch_jobs_gpu_variables_say_what_it_has(tmp_path: Path) -> None:
    # sbatch wrote SLURM_GPUS* from the request before the cap lowered it; a bare srun in the job
    # reads them back and would ask for more GPUs than the job has. --gres writes none.
    path = _file(tmp_path, Throttle("alice", NOW + HOUR, "cap", 2, NOW, "", "idle GPUs"))
    lines = run_lua(_use(path) + """
local function show(name, fields, env)
  local j = job(fields)
  for k, v in pairs(env) do j.environment[k] = v end
  local rc = slurm_job_submit(j, {}, 1000)
  out(name, rc, j.environment.SLURM_GPUS or "-", j.environment.SLURM_GPUS_PER_NODE or "-",
      j.environment.SLURM_GPUS_PER_TASK or "-", j.environment.SLURM_GPUS_PER_SOCKET or "-",
      j.environment.SLURM_TRES_PER_TASK or "-")
end
show("gpus", {tres_per_job = "gres:gpu:6", min_nodes = 2}, {SLURM_GPUS = "6"})
show("typed", {tres_per_job = "gres/gpu:h100:2,gres/gpu:a100:2"}, {SLURM_GPUS = "h100:2,a100:2"})
show("per-node", {tres_per_node = "gres:gpu:h100:4", min_nodes = 2, max_nodes = 2},
     {SLURM_GPUS_PER_NODE = "h100:4"})
show("per-task", {tres_per_task = "gres:gpu:2", num_tasks = 2}, {SLURM_GPUS_PER_TASK = "2"})
show("per-socket", {tres_per_socket = "gres:gpu:2", sockets_per_node = 2, min_nodes = 1, max_nodes = 1},
     {SLURM_GPUS_PER_SOCKET = "2"})
show("gres", {tres_per_node = "gres:gpu:4"}, {})
show("fits", {tres_per_job = "gres:gpu:2"}, {SLURM_GPUS = "2"})
-- 24.11 and later: --gpus-per-task=3 -c4 as sbatch writes it (no SLURM_GPUS_PER_TASK)
show("tres-per-task", {tres_per_task = "cpu=4,gres/gpu=3", num_tasks = 1},
     {SLURM_TRES_PER_TASK = "cpu=4,gres/gpu=3"})
show("tres-typed", {tres_per_task = "gres/gpu:h100=3", num_tasks = 1},
     {SLURM_TRES_PER_TASK = "gres/gpu:h100=3,license/x=1"})
show("tres-fits", {tres_per_task = "gres/gpu=1", num_tasks = 2}, {SLURM_TRES_PER_TASK = "gres/gpu=1"})
""")
    got = {line.split("|")[0]: line.split("|")[1:] for line in lines if "|" in line}
    assert got["gpus"] == ["0", "2", "-", "-", "-", "-"], got
    assert got["typed"] == ["0", "h100:2", "-", "-", "-", "-"], got
    assert got["per-node"] == ["0", "-", "h100:1", "-", "-", "-"], got
    assert got["per-task"] == ["0", "-", "-", "1", "-", "-"], got
    assert got["per-socket"] == ["0", "-", "-", "-", "1", "-"], got
    assert got["gres"] == ["0", "-", "-", "-", "-", "-"], got  # no variable is made up
    assert got["fits"] == ["0", "2", "-", "-", "-", "-"], got
    assert got["tres-per-task"] == ["0", "-", "-", "-", "-", "cpu=4,gres/gpu=2"], got
    assert got["tres-typed"] == ["0", "-", "-", "-", "-", "gres/gpu:h100=2,license/x=1"], got
    assert got["tres-fits"] == ["0", "-", "-", "-", "-", "gres/gpu=1"], got


def test_an_over_cap_srun_or_salloc_request_is_refused_not_lowered(tmp_path: Path) -> None:
    # srun and salloc send no environment: their steps and shell keep the request they sent, so a
    # lowered job would fail at its first step. Over the cap they are refused with what fits.
    path = _file(tmp_path, Throttle("alice", NOW + HOUR, "cap", 2, NOW, "", "idle GPUs"))
    lines = run_lua(_use(path) + """
local function show(name, fields)
  local j = interactive(fields)
  local rc = slurm_job_submit(j, {}, 1000)
  out(name, rc, j.tres_per_job or "", j.tres_per_node or "", j.max_nodes)
end
show("gpus", {tres_per_job = "gres:gpu:6"})
show("gres", {tres_per_node = "gres:gpu:4", min_nodes = 1, max_nodes = 1})
show("fits", {tres_per_job = "gres:gpu:2"})
show("held", {tres_per_node = "gres:gpu:1", num_tasks = 64})
dump_logs()
""")
    got = {line.split("|")[0]: line.split("|")[1:] for line in lines if "|" in line}
    assert got["gpus"] == ["-1", "gres:gpu:6", "", "4294967294"], got
    assert got["gres"] == ["-1", "", "gres:gpu:4", "1"], got
    assert got["fits"] == ["0", "gres:gpu:2", "", "4294967294"], got
    assert got["held"] == ["0", "", "gres:gpu:1", "1"], got  # only its nodes held: nothing lowered
    user = [line for line in lines if line.startswith("USER ")]
    assert "srun and salloc requests are not lowered" in user[0] and "--gpus=2" in user[0], user
