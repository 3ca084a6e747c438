"""slurm_job_modify in plugins/job_submit.lua: `scontrol update` by a throttled user, fed the
records slurmctld really hands the plugin (tests/helpers/harness.lua's ``record`` and ``update``:
the record's user_name nil, its owner in user_id, the update holding only the fields it changes).

Each update is the attacker's: the throttled owner of a held job asks for more than the throttle
allows after submission. The end-to-end twin is tests/cluster/test_throttle_update_e2e.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from tests.helpers.lua_harness import lua_str, run_lua

from gpuslurm.policy.throttle import Throttle
from gpuslurm.slurm.throttle import write_throttle_file

NOW = 1_900_000_000
HOUR = 3600


def _verdicts(tmp_path: Path, throttle: Throttle, cases: str, *extra: Throttle) -> dict[str, str]:
    """``case(name, record_fields, update_fields[, modify_uid])`` lines in ``cases``; each name's
    return code, and the nice the update carries after the plugin (``-`` when unset)."""
    path = tmp_path / "gpuslurm-throttle"
    write_throttle_file(str(path), (throttle, *extra), now=NOW)
    lines = run_lua(f"G.path = {lua_str(str(path))}\n" + """
function case(name, rec, upd, uid)
  local u = update(upd, rec and rec.user_id)
  local rc = slurm_job_modify(u, record(rec), {}, uid or 1000)
  local nice = rawget(u, "nice")
  out(name, rc, (nice ~= NO_VAL and nice - slurm.NICE_OFFSET) or "-")
end
""" + cases + "dump_logs()\n")
    assert not any("internal error" in line for line in lines), lines
    return {line.split("|")[0]: "|".join(line.split("|")[1:]) for line in lines if "|" in line
            and not line.startswith(("LOG", "USER"))}


REJECT = Throttle("alice", NOW + HOUR, "reject", 0, NOW, "hpc-help@example.org", "rogue process")
CAP = Throttle("alice", NOW + HOUR, "cap", 2, NOW, "", "idle GPUs")
PRIORITY = Throttle("alice", NOW + HOUR, "priority", 5000, NOW, "", "idle GPUs")


def test_the_owner_is_the_records_uid_not_its_user_name(tmp_path: Path) -> None:
    # Slurm leaves job_rec.user_name nil: the owner must be found by job_rec.user_id.
    got = _verdicts(tmp_path, REJECT, """
case("gres", {}, {tres_per_node = "gres:gpu:8"})
case("gpus", {}, {tres_per_job = "gres:gpu:1"})
-- the name from the uid -> name cache that submissions fill, when the update's user_id is not
-- the owner's (root's `scontrol -u`) and so names nobody
G.cache.names[1000] = "alice"
case("cached", {}, setmetatable({tres_per_node = "gres:gpu:1", user_id = NO_VAL}, nil))
""")
    assert got["gres"].startswith("-1|") and got["gpus"].startswith("-1|"), got
    assert got["cached"].startswith("-1|"), got


def test_updates_by_root_slurmuser_and_operators_pass(tmp_path: Path) -> None:
    slurm_user = Throttle("slurm", NOW + HOUR, "reject", 0, NOW, "", "x")
    got = _verdicts(tmp_path, REJECT, """
PASSWD[990] = "slurm"
case("owner", {}, {tres_per_node = "gres:gpu:8"}, 1000)
case("root", {}, {tres_per_node = "gres:gpu:8"}, 0)
case("operator", {}, {tres_per_node = "gres:gpu:8"}, 1001)
G.slurm_uid = 990
case("slurmuser-own-job", {user_id = 990}, {tres_per_node = "gres:gpu:8"}, 990)
G.slurm_uid = false
case("not-slurmuser", {user_id = 990}, {tres_per_node = "gres:gpu:8"}, 990)
""", slurm_user)
    assert got["owner"].startswith("-1|")
    assert got["root"].startswith("0|") and got["operator"].startswith("0|")
    assert got["slurmuser-own-job"].startswith("0|")
    assert got["not-slurmuser"].startswith("-1|")


def test_slurm_user_uid_is_this_process_uid() -> None:
    import os
    assert run_lua("out(G.slurm_user_uid())") == [str(os.getuid())]


def test_reject_judges_the_job_as_it_will_be_after_the_update(tmp_path: Path) -> None:
    got = _verdicts(tmp_path, REJECT, """
case("cpu-to-gpu", {}, {tres_per_node = "gres:gpu:8"})
case("cpu-to-mps", {}, {tres_per_node = "gres:mps:50"})
case("cpu-to-per-task", {}, {tres_per_task = "gres:gpu:1", num_tasks = 8})
case("gpu-numnodes-only", {tres_per_node = "gres:gpu:1"}, {min_nodes = 4, max_nodes = 4})
case("gpu-numtasks-only", {tres_per_task = "gres:gpu:1"}, {num_tasks = 8})
case("gpu-nodelist-only", {tres_per_node = "gres:gpu:1"}, {req_nodes = "node[1-8]"})
case("gpu-cleared", {tres_per_node = "gres:gpu:8"}, {tres_per_node = ""})
case("cpu-numtasks", {}, {num_tasks = 64})
case("gpu-time-limit", {tres_per_node = "gres:gpu:8"}, {time_limit = 10})
case("gpu-comment", {tres_per_node = "gres/gpu:8"}, {comment = "x"})
""")
    for name in ("cpu-to-gpu", "cpu-to-mps", "cpu-to-per-task", "gpu-numnodes-only",
                 "gpu-numtasks-only", "gpu-nodelist-only"):
        assert got[name].startswith("-1|"), (name, got[name])
    # no GPUs after the update, or an update that leaves the GPU count as it was judged at submission
    for name in ("gpu-cleared", "cpu-numtasks", "gpu-time-limit", "gpu-comment"):
        assert got[name].startswith("0|"), (name, got[name])


def test_cap_counts_the_gpus_after_the_update_and_refuses_what_it_cannot_count(tmp_path: Path) -> None:
    got = _verdicts(tmp_path, CAP, """
case("gres-8", {}, {tres_per_node = "gres:gpu:8"})
case("gres-2", {max_nodes = 1}, {tres_per_node = "gres:gpu:2"})
-- no node maximum: Slurm may spread the job (its tasks unseen) over more nodes, 2 GPUs on each
case("gres-2-open", {}, {tres_per_node = "gres:gpu:2"})
case("numnodes-only", {tres_per_node = "gres:gpu:2"}, {min_nodes = 4, max_nodes = 4})
case("numnodes-all", {tres_per_node = "gres:gpu:1", max_nodes = 1}, {min_nodes = 4294967295})
case("numnodes-open", {tres_per_node = "gres:gpu:1", max_nodes = 1}, {min_nodes = 1, max_nodes = 4294967295})
case("numnodes-1", {tres_per_node = "gres:gpu:2", max_nodes = 4}, {min_nodes = 1, max_nodes = 1})
local one = {tres_per_node = "gres:gpu:1"}
case("record-max-nodes", {tres_per_node = "gres:gpu:1", min_nodes = 1, max_nodes = 2}, one)
case("record-max-nodes-4", {tres_per_node = "gres:gpu:1", min_nodes = 1, max_nodes = 4}, one)
case("numtasks-8", {tres_per_task = "gres:gpu:1"}, {num_tasks = 8})
case("numtasks-2", {tres_per_task = "gres:gpu:1"}, {num_tasks = 2})
-- the record shows no task count: a per-task request after an update without NumTasks is unknown
case("per-task-numnodes", {tres_per_task = "gres:gpu:1"}, {min_nodes = 1, max_nodes = 1})
case("per-task-new", {}, {tres_per_task = "gres:gpu:1"})
case("tasks-per-node", {tres_per_task = "gres:gpu:1"}, {num_tasks = 1, ntasks_per_node = 8})
-- more tasks or CPUs spread a job without a node maximum over more nodes
case("spread-tasks", {tres_per_node = "gres:gpu:1"}, {num_tasks = 64})
case("spread-cpus", {tres_per_node = "gres:gpu:1"}, {min_cpus = 512})
case("bounded-tasks", {tres_per_node = "gres:gpu:1", max_nodes = 1}, {num_tasks = 64})
case("socket-unknown", {}, {tres_per_socket = "gres:gpu:1"})
case("socket-2", {max_nodes = 1}, {tres_per_socket = "gres:gpu:1", sockets_per_node = 2})
case("socket-2-open", {}, {tres_per_socket = "gres:gpu:1", sockets_per_node = 2})
case("socket-4", {max_nodes = 1}, {tres_per_socket = "gres:gpu:1", sockets_per_node = 4})
case("two-fields", {tres_per_node = "gres:gpu:1"}, {tres_per_job = "gres:gpu:2"})
case("two-types", {}, {tres_per_job = "gres:gpu:h100:2,gres:gpu:a100:1"})
case("unreadable", {}, {tres_per_node = "gres:gpu:h100:4:foo"})
case("mps", {}, {tres_per_node = "gres:mps:100"})
case("time-limit", {tres_per_node = "gres:gpu:8"}, {time_limit = 10})
""")
    refused = ("gres-8", "numnodes-only", "numnodes-all", "numnodes-open", "numtasks-8",
               "per-task-numnodes", "per-task-new", "tasks-per-node", "record-max-nodes-4",
               "spread-tasks", "spread-cpus", "socket-unknown", "socket-4", "two-fields", "two-types",
               "unreadable", "gres-2-open", "socket-2-open")
    passed = ("gres-2", "numnodes-1", "record-max-nodes", "numtasks-2", "bounded-tasks", "socket-2",
              "mps", "time-limit")
    assert {name for name in refused if not got[name].startswith("-1|")} == set(), got
    assert {name for name in passed if not got[name].startswith("0|")} == set(), got


def test_cap_refusal_says_why(tmp_path: Path) -> None:
    path = tmp_path / "gpuslurm-throttle"
    write_throttle_file(str(path), (CAP,), now=NOW)
    lines = run_lua(f"G.path = {lua_str(str(path))}\n" + """
out(slurm_job_modify(update({tres_per_node = "gres:gpu:8"}), record({max_nodes = 1}), {}, 1000))
out(slurm_job_modify(update({tres_per_task = "gres:gpu:1"}), record({}), {}, 1000))
dump_logs()
""")
    user = [line for line in lines if line.startswith("USER ")]
    assert "limited to 2 GPU(s) per job: the job would have 8 GPU(s)" in user[0], user
    assert "cannot be told" in user[1] and "NumTasks=" in user[1], user
    assert any("refused an update of job 42 of throttled user alice" in line for line in lines)


def test_priority_refuses_a_lower_nice_and_penalises_added_gpus(tmp_path: Path) -> None:
    got = _verdicts(tmp_path, PRIORITY, """
local OFF = slurm.NICE_OFFSET
case("nice-0", {tres_per_node = "gres:gpu:1", nice = OFF + 5000}, {nice = OFF})
case("nice-4999", {tres_per_node = "gres:gpu:1", nice = OFF + 5000}, {nice = OFF + 4999})
case("nice-6000", {tres_per_node = "gres:gpu:1", nice = OFF + 5000}, {nice = OFF + 6000})
case("nice-0-with-gres", {}, {nice = OFF, tres_per_node = "gres:gpu:1"})
case("cpu-nice-0", {nice = OFF + 10}, {nice = OFF})
case("cpu-to-gpu", {}, {tres_per_node = "gres:gpu:1"})
case("gpu-more-nodes", {tres_per_node = "gres:gpu:1"}, {min_nodes = 2, max_nodes = 2})
case("gpu-time-limit", {tres_per_node = "gres:gpu:1"}, {time_limit = 10})
case("operator-nice-0", {tres_per_node = "gres:gpu:1", nice = OFF + 5000}, {nice = OFF}, 0)
""")
    assert got["nice-0"].startswith("-1|") and got["nice-4999"].startswith("-1|"), got
    assert got["nice-0-with-gres"].startswith("-1|"), got
    assert got["nice-6000"] == "0|6000"
    assert got["cpu-nice-0"] == "0|0"             # no GPUs: not the throttle's business
    assert got["cpu-to-gpu"] == "0|5000"           # GPUs added: the throttle's nice comes with them
    assert got["gpu-more-nodes"] == "0|5000"
    assert got["gpu-time-limit"] == "0|-"
    assert got["operator-nice-0"] == "0|0"


@pytest.mark.parametrize("throttle", [REJECT, CAP, PRIORITY], ids=lambda t: t.mode)
def test_an_expired_throttle_or_another_user_lets_the_update_through(tmp_path: Path,
                                                                     throttle: Throttle) -> None:
    got = _verdicts(tmp_path, throttle._replace(until=NOW + 2), """
local more = {tres_per_node = "gres:gpu:8", nice = slurm.NICE_OFFSET}
case("bob", {user_id = 1001}, more, 1001)
case("alice", {tres_per_node = "gres:gpu:1", nice = slurm.NICE_OFFSET + 5000}, more)
NOW = NOW + 2
case("alice-later", {tres_per_node = "gres:gpu:1"}, more)
""")
    assert got["bob"].startswith("0|") and got["alice"].startswith("-1|"), got
    assert got["alice-later"].startswith("0|"), got
